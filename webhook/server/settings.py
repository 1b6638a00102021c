"""Webhook settings: one frozen dataclass built from GPUSHARE_* environment variables, checked at start."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from common.cli import Variable
from common.settings import (
    LOG_VARIABLES,
    env_parsed,
    env_value,
    log_settings,
    metrics_address,
    positive_int,
)
from contract import CONTRACT_VARIABLES, Contract, contract_from
from webhook.server.sourcefilter import Network, networks

DEFAULT_EXTENDER = "system:serviceaccount:kube-system:gpushare-schd-extender"
DEFAULT_PLUGIN = "system:serviceaccount:gpushare-system:gpushare-device-plugin"
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")

# Connections one client address may hold in one worker process (webhook/server/connlimits.py). Its webhook client opens
# one connection per call in flight and keeps at most 25 idle ones per host (client-go's transport cache). A
# kube-apiserver runs at most --max-mutating-requests-inflight (200) writes at once (with API priority and fairness,
# which shares both inflight limits, 600 seats, between priority levels, a level of pod writes gets a share of them),
# and each write calls this webhook once at a time: about 225 connections to the whole Service, spread over every
# replica and process. 256 lets one process hold all of them; the benchmarks use 8. Only past it, and with none of that
# client's connections idle, is a connection of the API server refused.
DEFAULT_PER_CLIENT = "256"

# What --help lists; tests check that each default here is the one settings_from applies.
WEBHOOK_VARIABLES = (
    *CONTRACT_VARIABLES,
    Variable("GPUSHARE_TLS_CERT", "/etc/gpushare/tls/tls.crt", "serving certificate (PEM), reloaded when it changes"),
    Variable("GPUSHARE_TLS_KEY", "/etc/gpushare/tls/tls.key", "its private key (PEM)"),
    Variable("GPUSHARE_SIGNING_KEY", "/etc/gpushare/signing/signing.key", "Ed25519 intent-signing private key (PEM)"),
    Variable("GPUSHARE_BIND", "127.0.0.1:8443", "listen address HOST:PORT (0.0.0.0:8443 in a cluster)"),
    Variable("GPUSHARE_EXTENDER_IDENTITIES", DEFAULT_EXTENDER, "who may write the assignment (comma-separated)"),
    Variable("GPUSHARE_PLUGIN_IDENTITIES", DEFAULT_PLUGIN, "users of the device plugin (comma-separated)"),
    Variable("GPUSHARE_MAX_GPU_UNITS", "192", "the largest GPU, in units (196608 when the unit is MiB)"),
    Variable("GPUSHARE_OTHER_GPU_RESOURCES", "nvidia.com/gpu", "other device plugins' whole-GPU resources"),
    Variable("GPUSHARE_MAX_BODY_BYTES", str(8 * 1024 * 1024), "larger AdmissionReview bodies get HTTP 400"),
    Variable("GPUSHARE_WORKERS", "2", "gunicorn worker processes"),
    Variable("GPUSHARE_THREADS", "0", "threads per worker process that run the app (0: on the event loop thread)"),
    Variable("GPUSHARE_READ_DEADLINE_SECONDS", "2", "bound of the TLS handshake, the headers and the body, each"),
    Variable("GPUSHARE_MAX_CONNECTIONS_PER_CLIENT", DEFAULT_PER_CLIENT, "connections one client address may hold in "
             "each worker process; past it its oldest idle one is closed, or the new one refused"),
    Variable("GPUSHARE_ADMISSION_SOURCES", "", "the API server's source networks, comma-separated CIDRs; the kernel "
             "drops connections to GPUSHARE_BIND from anywhere else (loopback always admitted); empty: every source"),
    *LOG_VARIABLES,
    Variable("GPUSHARE_METRICS_BIND", "127.0.0.1:9102", "plain-HTTP /metrics of all workers, HOST:PORT; empty: off"),
    Variable("PROMETHEUS_MULTIPROC_DIR", "", "the workers' metrics directory; empty: a fresh one per start"),
    Variable("GPUSHARE_DEV_CERTS", ".dev-certs", "with --dev: where development certificates are kept"),
)


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must not be negative")
    return value


def deadline_seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 30:  # the API server's longest webhook timeoutSeconds
        raise ValueError("must be more than 0 and at most 30")
    return value


def identity_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def resource_list(text: str) -> tuple[str, ...]:
    names = identity_list(text)
    bad = [name for name in names if "/" not in name]
    if bad:
        raise ValueError(f"{', '.join(bad)} is not a domain-prefixed extended resource name")
    return names


def bind_address(text: str) -> tuple[str, int]:
    """HOST:PORT, where HOST is an IPv4 address, a bracketed IPv6 address or a DNS name, and PORT is 1-65535."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ValueError("it has no :PORT")
    if not host:
        raise ValueError("it has no HOST before the :PORT")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"the port {port_text!r} is not a number from 1 to 65535")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError as exc:
            raise ValueError(f"{host} is not an IPv6 address ({exc})") from exc
        return host[1:-1], int(port_text)
    if not _HOST_NAME.match(host):
        raise ValueError(f"{host!r} is not an IP address or a host name (an IPv6 address goes in brackets)")
    return host, int(port_text)


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
    threads: int  # app threads per process; 0: the app runs on the event loop's thread (webhook/server/worker.py)
    # Bound of the TLS handshake, of the request headers and of the body, each (webhook/server/worker.py).
    read_deadline_seconds: float
    log_level: str
    log_format: str
    # Plain-HTTP /metrics of every worker together, served by the gunicorn arbiter; None: not served.
    metrics_bind: tuple[str, int] | None = None
    # Prometheus multiprocess directory given by the operator; empty: gunicorn.conf.py makes a fresh one.
    metrics_dir: str = ""
    # Connections one client address may hold in one worker process (webhook/server/connlimits.py).
    max_connections_per_client: int = int(DEFAULT_PER_CLIENT)
    # Who may connect to the admission port besides loopback (webhook/server/sourcefilter.py); empty: every source.
    admission_sources: tuple[Network, ...] = ()

    @property
    def trusted_identities(self) -> tuple[str, ...]:
        return self.extender_identities + self.plugin_identities

    @property
    def open_to_every_source(self) -> bool:
        """Whether any address may connect to the admission port: no GPUSHARE_ADMISSION_SOURCES, and a bind address
        other machines reach (not loopback)."""
        if self.admission_sources:
            return False
        host = bind_address(self.bind)[0]
        try:
            return not ipaddress.ip_address(host).is_loopback
        except ValueError:
            return host != "localhost"

    def sources_text(self) -> str:
        """GPUSHARE_ADMISSION_SOURCES as the webhook applies it, for /readyz and the log."""
        return ",".join(str(n) for n in self.admission_sources) if self.admission_sources else "any"


def settings_from(env: Mapping[str, str]) -> Settings:
    contract = contract_from(env)
    default_max = "192" if contract.unit == "GiB" else str(192 * 1024)
    log_level, log_format = log_settings(env)
    bind = env_value(env, "GPUSHARE_BIND", "127.0.0.1:8443")
    env_parsed(env, "GPUSHARE_BIND", "127.0.0.1:8443", bind_address, "HOST:PORT such as 0.0.0.0:8443 or [::]:8443")
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
        bind=bind,
        max_body_bytes=env_parsed(
            env, "GPUSHARE_MAX_BODY_BYTES", str(8 * 1024 * 1024), positive_int, "a positive number of bytes"
        ),
        workers=env_parsed(env, "GPUSHARE_WORKERS", "2", positive_int, "a positive integer"),
        threads=env_parsed(env, "GPUSHARE_THREADS", "0", non_negative_int, "0 (the app on the event loop) or a number "
                           "of app threads"),
        read_deadline_seconds=env_parsed(
            env, "GPUSHARE_READ_DEADLINE_SECONDS", "2", deadline_seconds, "a number of seconds from 0 to 30"
        ),
        log_level=log_level,
        log_format=log_format,
        metrics_bind=env_parsed(
            env, "GPUSHARE_METRICS_BIND", "127.0.0.1:9102", metrics_address, "host:port, or empty to turn it off"
        ),
        metrics_dir=env_value(env, "PROMETHEUS_MULTIPROC_DIR", ""),
        max_connections_per_client=env_parsed(
            env, "GPUSHARE_MAX_CONNECTIONS_PER_CLIENT", DEFAULT_PER_CLIENT, positive_int, "a positive integer"
        ),
        admission_sources=env_parsed(
            env, "GPUSHARE_ADMISSION_SOURCES", "", networks,
            "comma-separated networks such as 10.0.0.10/32,fd00::/64 (the API server's source addresses), or empty",
        ),
    )


def from_environ() -> Settings:
    """The one place the webhook reads os.environ."""
    return settings_from(os.environ)
