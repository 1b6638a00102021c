"""Webhook settings: defaults (the same as --help lists), and a clear error naming the variable for every bad value."""

from __future__ import annotations

import inspect
import re

import pytest

from common.cli import Variable
from common.settings import SettingsError, log_settings
from contract import contract_from
from webhook.server import serve
from webhook.server.settings import DEFAULT_EXTENDER, DEFAULT_PLUGIN, WEBHOOK_VARIABLES, settings_from


def test_defaults() -> None:
    s = settings_from({})
    assert s.contract.resource == "aliyun.com/gpu-mem"
    assert s.contract.unit == "GiB" and s.contract.delivery == "env" and s.contract.prefix == "gpushare.io/"
    assert s.contract.placement == "extender"
    assert settings_from({"GPUSHARE_DELIVERY": "cdi", "GPUSHARE_PLACEMENT": "node"}).contract.placement == "node"
    assert s.trusted_identities == (DEFAULT_EXTENDER, DEFAULT_PLUGIN)
    assert s.max_gpu_units == 192
    assert s.bind == "127.0.0.1:8443"
    assert s.read_deadline_seconds == 2.0


def test_mib_unit_scales_the_default_largest_gpu() -> None:
    assert settings_from({"GPUSHARE_UNIT": "MiB"}).max_gpu_units == 192 * 1024


@pytest.mark.parametrize(("value", "threads"), [(None, 0), ("0", 0), ("4", 4)])
def test_the_app_runs_on_the_event_loop_unless_threads_are_asked_for(value: str | None, threads: int) -> None:
    assert settings_from({} if value is None else {"GPUSHARE_THREADS": value}).threads == threads


def test_identity_lists_are_comma_separated() -> None:
    s = settings_from({"GPUSHARE_EXTENDER_IDENTITIES": " a , b,", "GPUSHARE_PLUGIN_IDENTITIES": "c"})
    assert s.extender_identities == ("a", "b") and s.plugin_identities == ("c",)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"GPUSHARE_MAX_GPU_UNITS": "lots"}, "GPUSHARE_MAX_GPU_UNITS='lots' is not valid"),
        ({"GPUSHARE_MAX_GPU_UNITS": "0"}, "GPUSHARE_MAX_GPU_UNITS='0' is not valid: must be greater than zero"),
        ({"GPUSHARE_WORKERS": "-1"}, "GPUSHARE_WORKERS='-1'"),
        ({"GPUSHARE_THREADS": "-2"}, "GPUSHARE_THREADS='-2' is not valid: must not be negative"),
        ({"GPUSHARE_MAX_BODY_BYTES": "1e6"}, "GPUSHARE_MAX_BODY_BYTES='1e6'"),
        ({"GPUSHARE_UNIT": "TB"}, "unit 'TB' is not supported"),
        ({"GPUSHARE_DELIVERY": "pci"}, "GPUSHARE_DELIVERY"),
        ({"GPUSHARE_PLACEMENT": "anywhere"}, "placement 'anywhere' is unknown; use one of extender, node"),
        ({"GPUSHARE_PLACEMENT": "node"}, "node placement needs cdi delivery"),
        ({"GPUSHARE_READ_DEADLINE_SECONDS": "0"}, "GPUSHARE_READ_DEADLINE_SECONDS='0' is not valid: must be more"),
        ({"GPUSHARE_READ_DEADLINE_SECONDS": "31"}, "GPUSHARE_READ_DEADLINE_SECONDS='31'"),
        ({"GPUSHARE_READ_DEADLINE_SECONDS": "nan"}, "GPUSHARE_READ_DEADLINE_SECONDS='nan'"),
        ({"GPUSHARE_LOG_LEVEL": "chatty"}, "GPUSHARE_LOG_LEVEL='CHATTY' is not valid"),
        ({"GPUSHARE_MAX_CONNECTIONS_PER_CLIENT": "0"}, "GPUSHARE_MAX_CONNECTIONS_PER_CLIENT='0' is not valid: must be"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        settings_from(env)


def _read_names(*functions: object) -> set[str]:
    return set(re.findall(r"GPUSHARE_[A-Z_]+", "".join(inspect.getsource(f) for f in functions)))  # type: ignore[arg-type]


def test_help_table_names_every_variable_read() -> None:
    listed = {v.name for v in WEBHOOK_VARIABLES}
    assert _read_names(settings_from, contract_from, log_settings, serve.main) <= listed
    assert len(listed) == len(WEBHOOK_VARIABLES)


@pytest.mark.parametrize("variable", WEBHOOK_VARIABLES, ids=lambda v: v.name)
def test_help_table_defaults_are_the_applied_defaults(variable: Variable) -> None:
    assert settings_from({variable.name: variable.default}) == settings_from({})


@pytest.mark.parametrize(
    ("bind", "fragment"),
    [
        ("nonsense", "it has no :PORT"),
        (":8443", "it has no HOST"),
        ("host:http", "the port 'http' is not a number"),
        ("host:70000", "the port '70000' is not a number from 1 to 65535"),
        ("::1:8443", "an IPv6 address goes in brackets"),
        ("[zz]:8443", "[zz] is not an IPv6 address"),
        ("bad_name:8443", "'bad_name' is not an IP address or a host name"),
    ],
)
def test_bind_address_must_be_host_and_port(bind: str, fragment: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(f"GPUSHARE_BIND={bind!r} is not valid: ")) as caught:
        settings_from({"GPUSHARE_BIND": bind})
    assert fragment in str(caught.value)


@pytest.mark.parametrize("bind", ["0.0.0.0:8443", "[::]:8443", "localhost:1", "webhook.gpushare-system.svc:443"])
def test_good_bind_addresses(bind: str) -> None:
    assert settings_from({"GPUSHARE_BIND": bind}).bind == bind
