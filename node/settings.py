"""What both node programs read alike: the node, its GPUs and CDI specs, the API server, logs, metrics and shutdown,
from GPUSHARE_* environment variables (pure)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from common.cli import Variable
from common.settings import LOG_VARIABLES, SettingsError, env_parsed, env_value, log_settings, metrics_address
from contract import CONTRACT_VARIABLES, Contract, contract_from

# Kubernetes sends SIGKILL terminationGracePeriodSeconds (30 s by default) after SIGTERM: a plugin that has not
# stopped by this bound dumps every thread's stack first, so the reason is in its log.
DEFAULT_SHUTDOWN_SECONDS = "20"
# Each program is a pod of its own (not hostNetwork), so the device plugin and the DRA driver share the port.
DEFAULT_METRICS_BIND = "0.0.0.0:9103"

# What the device plugin and the DRA driver (dra/settings.py) read alike, with node_settings.
NODE_VARIABLES = (
    Variable("GPUSHARE_NODE_NAME", "", "this node's name, from the downward API", required=True),
    *CONTRACT_VARIABLES,
    Variable("GPUSHARE_FAKE_GPUS", "", "a fake inventory such as 2x24GiB; empty: the GPUs NVML reports"),
    Variable("GPUSHARE_CDI_DIR", "/var/run/cdi", "where CDI specs are written"),
    Variable("GPUSHARE_FAKE_GPU_DIR", "/var/run/gpushare/fake-gpus", "cdi mode with fake GPUs: files naming each GPU"),
    Variable("GPUSHARE_KUBECONFIG", "", "a kubeconfig file; empty: the pod's ServiceAccount"),
    Variable("GPUSHARE_SHUTDOWN_SECONDS", DEFAULT_SHUTDOWN_SECONDS,
             "after SIGTERM, stop within this bound, else dump every thread's stack and exit"),
    Variable("GPUSHARE_METRICS_BIND", DEFAULT_METRICS_BIND, "plain-HTTP /metrics, HOST:PORT; empty: off"),
    *LOG_VARIABLES,
)


@dataclass(frozen=True)
class NodeSettings:
    """The settings of NODE_VARIABLES: the node, its GPUs and CDI specs, the API server, logs, metrics, shutdown."""

    contract: Contract
    node_name: str
    fake_gpus: str
    cdi_dir: str
    fake_gpu_dir: str
    kubeconfig: str
    log_level: str
    log_format: str
    shutdown_seconds: float
    # Plain-HTTP /metrics; None: not served.
    metrics_bind: tuple[str, int] | None


# A unix socket address holds 108 bytes with the terminating NUL (sun_path, linux/un.h); gRPC refuses longer paths.
UNIX_PATH_MAX = 107


def positive_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a finite number greater than zero")
    return value


def node_settings(env: Mapping[str, str]) -> NodeSettings:
    contract = contract_from(env)
    node_name = env_value(env, "GPUSHARE_NODE_NAME", "")
    if not node_name:
        raise SettingsError(
            "GPUSHARE_NODE_NAME is not set; give the plugin its node's name through the downward API "
            "(valueFrom.fieldRef.fieldPath: spec.nodeName) in the DaemonSet"
        )
    log_level, log_format = log_settings(env)
    return NodeSettings(
        contract=contract,
        node_name=node_name,
        fake_gpus=env_value(env, "GPUSHARE_FAKE_GPUS", ""),
        cdi_dir=env_value(env, "GPUSHARE_CDI_DIR", "/var/run/cdi"),
        fake_gpu_dir=env_value(env, "GPUSHARE_FAKE_GPU_DIR", "/var/run/gpushare/fake-gpus"),
        kubeconfig=env_value(env, "GPUSHARE_KUBECONFIG", ""),
        log_level=log_level,
        log_format=log_format,
        shutdown_seconds=env_parsed(
            env, "GPUSHARE_SHUTDOWN_SECONDS", DEFAULT_SHUTDOWN_SECONDS, positive_float, "a positive number of seconds"
        ),
        metrics_bind=env_parsed(
            env, "GPUSHARE_METRICS_BIND", DEFAULT_METRICS_BIND, metrics_address, "host:port, or empty to turn it off"
        ),
    )


def check_socket_path(env: Mapping[str, str], variable: str, path: str, default: str) -> None:
    """Refuse at start a socket path gRPC could not bind; `default` is the kubelet's own path, as the fix."""
    size = len(os.fsencode(path))
    if size > UNIX_PATH_MAX:
        raise SettingsError(
            f"{variable}={env_value(env, variable, '')!r} gives the socket path {path}, {size} bytes long; a unix "
            f"socket address holds at most {UNIX_PATH_MAX}: choose a shorter path (the kubelet's is {default})"
        )
