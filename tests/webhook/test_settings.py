"""Webhook settings: defaults, and a clear error naming the variable for every bad value."""

from __future__ import annotations

import pytest

from webhook.settings import DEFAULT_EXTENDER, DEFAULT_PLUGIN, SettingsError, settings_from


def test_defaults() -> None:
    s = settings_from({})
    assert s.contract.resource == "aliyun.com/gpu-mem"
    assert s.contract.unit == "GiB" and s.contract.delivery == "env" and s.contract.prefix == "gpushare.io/"
    assert s.trusted_identities == (DEFAULT_EXTENDER, DEFAULT_PLUGIN)
    assert s.max_gpu_units == 192
    assert s.bind == "127.0.0.1:8443"
    assert s.read_deadline_seconds == 2.0


def test_mib_unit_scales_the_default_largest_gpu() -> None:
    assert settings_from({"GPUSHARE_UNIT": "MiB"}).max_gpu_units == 192 * 1024


def test_identity_lists_are_comma_separated() -> None:
    s = settings_from({"GPUSHARE_EXTENDER_IDENTITIES": " a , b,", "GPUSHARE_PLUGIN_IDENTITIES": "c"})
    assert s.extender_identities == ("a", "b") and s.plugin_identities == ("c",)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"GPUSHARE_MAX_GPU_UNITS": "lots"}, "GPUSHARE_MAX_GPU_UNITS='lots' is not valid"),
        ({"GPUSHARE_MAX_GPU_UNITS": "0"}, "GPUSHARE_MAX_GPU_UNITS='0' is not valid: must be greater than zero"),
        ({"GPUSHARE_WORKERS": "-1"}, "GPUSHARE_WORKERS='-1'"),
        ({"GPUSHARE_MAX_BODY_BYTES": "1e6"}, "GPUSHARE_MAX_BODY_BYTES='1e6'"),
        ({"GPUSHARE_UNIT": "TB"}, "unit 'TB' is not supported"),
        ({"GPUSHARE_DELIVERY": "pci"}, "GPUSHARE_DELIVERY"),
        ({"GPUSHARE_READ_DEADLINE_SECONDS": "0"}, "GPUSHARE_READ_DEADLINE_SECONDS='0' is not valid: must be more"),
        ({"GPUSHARE_READ_DEADLINE_SECONDS": "31"}, "GPUSHARE_READ_DEADLINE_SECONDS='31'"),
        ({"GPUSHARE_READ_DEADLINE_SECONDS": "nan"}, "GPUSHARE_READ_DEADLINE_SECONDS='nan'"),
        ({"GPUSHARE_LOG_LEVEL": "chatty"}, "GPUSHARE_LOG_LEVEL='CHATTY' is not valid"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        settings_from(env)
