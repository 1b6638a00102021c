"""Webhook settings: one frozen dataclass built from GPUSHARE_* environment variables, checked at start."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from webhook.protocol import DEFAULT_PREFIX, DEFAULT_RESOURCE, Contract, ProtocolError

T = TypeVar("T")

DEFAULT_EXTENDER = "system:serviceaccount:kube-system:gpushare-schd-extender"
DEFAULT_PLUGIN = "system:serviceaccount:gpushare-system:gpushare-device-plugin"


class SettingsError(ValueError):
    """A bad environment variable; the text names the variable and the accepted values."""


def env_value(env: Mapping[str, str], name: str, default: str) -> str:
    return env.get(name, default).strip()


def env_parsed(env: Mapping[str, str], name: str, default: str, parse: Callable[[str], T], accepted: str) -> T:
    raw = env_value(env, name, default)
    try:
        return parse(raw)
    except (ValueError, ProtocolError) as exc:
        raise SettingsError(f"{name}={raw!r} is not valid: {exc}; expected {accepted}") from exc


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be greater than zero")
    return value


def deadline_seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 30:  # the API server's longest webhook timeoutSeconds
        raise ValueError("must be more than 0 and at most 30")
    return value


def metrics_address(text: str) -> tuple[str, int] | None:
    """`host:port` (`[::]:port` for IPv6) of a plain-HTTP /metrics listener; empty turns it off."""
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError("give host:port, such as 0.0.0.0:9102")
    return host.strip("[]") or "0.0.0.0", int(port)


def identity_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def resource_list(text: str) -> tuple[str, ...]:
    names = identity_list(text)
    bad = [name for name in names if "/" not in name]
    if bad:
        raise ValueError(f"{', '.join(bad)} is not a domain-prefixed extended resource name")
    return names


def contract_from(env: Mapping[str, str]) -> Contract:
    """The cluster-wide contract, read the same way by the webhook and the device plugin."""
    resource = env_value(env, "GPUSHARE_RESOURCE_NAME", DEFAULT_RESOURCE)
    unit = env_value(env, "GPUSHARE_UNIT", "GiB")
    prefix = env_value(env, "GPUSHARE_ANNOTATION_PREFIX", DEFAULT_PREFIX)
    delivery = env_value(env, "GPUSHARE_DELIVERY", "env")
    try:
        return Contract(resource=resource, unit=unit, prefix=prefix, delivery=delivery)
    except ProtocolError as exc:
        raise SettingsError(
            f"the GPUSHARE_RESOURCE_NAME / GPUSHARE_UNIT / GPUSHARE_ANNOTATION_PREFIX / GPUSHARE_DELIVERY "
            f"settings are inconsistent: {exc}"
        ) from exc


@dataclass(frozen=True)
class Settings:
    contract: Contract
    extender_identities: tuple[str, ...]
    plugin_identities: tuple[str, ...]
    max_gpu_units: int
    # Other device plugins' GPU resources (whole GPUs): their containers get their env from that plugin.
    other_gpu_resources: tuple[str, ...]
    signing_key: str
    tls_cert: str
    tls_key: str
    bind: str
    max_body_bytes: int
    workers: int
    threads: int
    # Bound of the TLS handshake, of the request headers and of the body, each (webhook/worker.py).
    read_deadline_seconds: float
    log_level: str
    # Plain-HTTP /metrics of every worker together, served by the gunicorn arbiter; None: not served.
    metrics_bind: tuple[str, int] | None = None
    # Prometheus multiprocess directory given by the operator; empty: gunicorn.conf.py makes a fresh one.
    metrics_dir: str = ""

    @property
    def trusted_identities(self) -> tuple[str, ...]:
        return self.extender_identities + self.plugin_identities


def settings_from(env: Mapping[str, str]) -> Settings:
    contract = contract_from(env)
    default_max = "192" if contract.unit == "GiB" else str(192 * 1024)
    log_level = env_value(env, "GPUSHARE_LOG_LEVEL", "INFO").upper()
    if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise SettingsError(f"GPUSHARE_LOG_LEVEL={log_level!r} is not valid; expected DEBUG, INFO, WARNING or ERROR")
    return Settings(
        contract=contract,
        extender_identities=identity_list(env_value(env, "GPUSHARE_EXTENDER_IDENTITIES", DEFAULT_EXTENDER)),
        plugin_identities=identity_list(env_value(env, "GPUSHARE_PLUGIN_IDENTITIES", DEFAULT_PLUGIN)),
        max_gpu_units=env_parsed(env, "GPUSHARE_MAX_GPU_UNITS", default_max, positive_int, "a positive integer"),
        other_gpu_resources=env_parsed(
            env, "GPUSHARE_OTHER_GPU_RESOURCES", "nvidia.com/gpu", resource_list,
            "comma-separated extended resource names such as nvidia.com/gpu, or empty",
        ),
        signing_key=env_value(env, "GPUSHARE_SIGNING_KEY", "/etc/gpushare/signing/signing.key"),
        tls_cert=env_value(env, "GPUSHARE_TLS_CERT", "/etc/gpushare/tls/tls.crt"),
        tls_key=env_value(env, "GPUSHARE_TLS_KEY", "/etc/gpushare/tls/tls.key"),
        bind=env_value(env, "GPUSHARE_BIND", "127.0.0.1:8443"),
        max_body_bytes=env_parsed(
            env, "GPUSHARE_MAX_BODY_BYTES", str(8 * 1024 * 1024), positive_int, "a positive number of bytes"
        ),
        workers=env_parsed(env, "GPUSHARE_WORKERS", "2", positive_int, "a positive integer"),
        threads=env_parsed(env, "GPUSHARE_THREADS", "4", positive_int, "a positive integer"),
        read_deadline_seconds=env_parsed(
            env, "GPUSHARE_READ_DEADLINE_SECONDS", "2", deadline_seconds, "a number of seconds from 0 to 30"
        ),
        log_level=log_level,
        metrics_bind=env_parsed(
            env, "GPUSHARE_METRICS_BIND", "127.0.0.1:9102", metrics_address, "host:port, or empty to turn it off"
        ),
        metrics_dir=env_value(env, "PROMETHEUS_MULTIPROC_DIR", ""),
    )


def from_environ() -> Settings:
    """The one place the webhook reads os.environ."""
    return settings_from(os.environ)
