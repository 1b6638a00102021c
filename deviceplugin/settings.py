"""Device plugin settings: one frozen dataclass built from GPUSHARE_* environment variables, checked at start."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from common.cli import Variable
from common.settings import (
    LOG_VARIABLES,
    SettingsError,
    env_parsed,
    env_value,
    log_settings,
    metrics_address,
    positive_int,
)
from contract import CONTRACT_VARIABLES, Contract, contract_from
from contract.modes import Placement

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES = "/var/lib/kubelet/pod-resources/kubelet.sock"
# The kubelet and gRPC choke on ListAndWatch messages with very many devices; 8 GPUs of 80 GiB are 640.
DEFAULT_MAX_DEVICES = "4096"
# Kubernetes sends SIGKILL terminationGracePeriodSeconds (30 s by default) after SIGTERM: a plugin that has not
# stopped by this bound dumps every thread's stack first, so the reason is in its log.
DEFAULT_SHUTDOWN_SECONDS = "20"
# Each program is a pod of its own (not hostNetwork), so the device plugin and the DRA driver share the port.
DEFAULT_METRICS_BIND = "0.0.0.0:9103"

# What the device plugin and the DRA driver (deviceplugin/dra/settings.py) read alike, with node_settings.
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
# What --help lists; tests check that each default here is the one settings_from applies.
PLUGIN_VARIABLES = (
    *NODE_VARIABLES,
    Variable("GPUSHARE_VERIFY_KEY", "/etc/gpushare/verify/signing.pub", "the webhook's public signing key (PEM)"),
    Variable("GPUSHARE_MAX_DEVICES", DEFAULT_MAX_DEVICES, "refuse to start when the GPUs make more devices"),
    Variable("GPUSHARE_DEVICE_PLUGIN_DIR", DEFAULT_PLUGIN_DIR, "the kubelet's kubelet.sock and the plugin's socket"),
    Variable("GPUSHARE_POD_RESOURCES_SOCKET", DEFAULT_POD_RESOURCES, "the kubelet's PodResources API"),
    Variable("GPUSHARE_KUBELET_CHECKPOINT", DEFAULT_PLUGIN_DIR + "/kubelet_internal_checkpoint",
             "the kubelet's device checkpoint; its default follows GPUSHARE_DEVICE_PLUGIN_DIR"),
    Variable("GPUSHARE_RPC_TIMEOUT_SECONDS", "10", "bound of every kubelet call and API request (below 30)"),
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


@dataclass(frozen=True)
class PluginSettings:
    contract: Contract
    node_name: str
    verify_key: str
    fake_gpus: str
    device_plugin_dir: str
    pod_resources_socket: str
    kubelet_checkpoint: str
    cdi_dir: str
    fake_gpu_dir: str
    max_devices: int
    kubeconfig: str
    rpc_timeout_seconds: float
    log_level: str
    log_format: str
    shutdown_seconds: float
    # Plain-HTTP /metrics (deviceplugin/metrics.py); None: not served.
    metrics_bind: tuple[str, int] | None = None
    # Not read from the environment: the safety-net poll of the device-plugin directory (it is watched with
    # inotify), and how often and after what grace period unused CDI specs are collected.
    watch_interval_seconds: float = 5.0
    gc_interval_seconds: float = 60.0
    gc_grace_seconds: float = 120.0

    @property
    def placement(self) -> Placement:
        """Who picks the GPU: a cluster-wide setting of the contract, the same on the webhook."""
        return self.contract.placement

    @property
    def socket_prefix(self) -> str:
        """What every socket of this plugin's resource is named after: `gpushare-<resource>`."""
        return "gpushare-" + self.contract.resource.replace("/", "-").replace(".", "-")

    def socket_name(self, token: str) -> str:
        """The file name of one serve's socket, which is also the endpoint given to the kubelet. Each serve takes a
        token of its own: kubelet v1.37 refuses a registration whose socket path it still holds a connection to,
        and then never lets that path register again (docs/deviceplugin.md, "Socket names")."""
        return f"{self.socket_prefix}-{token}.sock"

    def socket_path(self, token: str) -> str:
        return os.path.join(self.device_plugin_dir, self.socket_name(token))

    def is_own_socket(self, name: str) -> bool:
        """A file name this plugin's resource serves on: a token's, or the one fixed name of earlier versions."""
        return name == self.socket_prefix + ".sock" or re.fullmatch(
            re.escape(self.socket_prefix) + f"-[0-9a-f]{{{SOCKET_TOKEN_LENGTH}}}\\.sock", name) is not None

    @property
    def kubelet_socket(self) -> str:
        return os.path.join(self.device_plugin_dir, "kubelet.sock")


# The random part of a socket name (socket_name): hex digits, 32 bits.
SOCKET_TOKEN_LENGTH = 8
# A unix socket address holds 108 bytes with the terminating NUL (sun_path, linux/un.h); gRPC refuses longer paths.
UNIX_PATH_MAX = 107


def positive_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a finite number greater than zero")
    return value


def rpc_seconds(text: str) -> float:
    value = positive_float(text)
    if value >= 30:
        # The kubelet gives PreStartContainer 30 s; an answer after that is lost.
        raise ValueError("must stay below the kubelet's 30 s PreStartContainer limit")
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


def settings_from(env: Mapping[str, str]) -> PluginSettings:
    node = node_settings(env)
    plugin_dir = env_value(env, "GPUSHARE_DEVICE_PLUGIN_DIR", DEFAULT_PLUGIN_DIR)
    settings = PluginSettings(
        **{field.name: getattr(node, field.name) for field in fields(NodeSettings)},
        verify_key=env_value(env, "GPUSHARE_VERIFY_KEY", "/etc/gpushare/verify/signing.pub"),
        device_plugin_dir=plugin_dir,
        pod_resources_socket=env_value(env, "GPUSHARE_POD_RESOURCES_SOCKET", DEFAULT_POD_RESOURCES),
        kubelet_checkpoint=env_value(
            env, "GPUSHARE_KUBELET_CHECKPOINT", os.path.join(plugin_dir, "kubelet_internal_checkpoint")
        ),
        max_devices=env_parsed(env, "GPUSHARE_MAX_DEVICES", DEFAULT_MAX_DEVICES, positive_int, "a positive integer"),
        rpc_timeout_seconds=env_parsed(
            env, "GPUSHARE_RPC_TIMEOUT_SECONDS", "10", rpc_seconds, "a positive number of seconds below 30"
        ),
    )
    check_socket_path(env, "GPUSHARE_DEVICE_PLUGIN_DIR", settings.socket_path("f" * SOCKET_TOKEN_LENGTH),
                      DEFAULT_PLUGIN_DIR)
    check_socket_path(env, "GPUSHARE_POD_RESOURCES_SOCKET", settings.pod_resources_socket, DEFAULT_POD_RESOURCES)
    return settings


def from_environ(overrides: Mapping[str, str] | None = None) -> PluginSettings:
    """The one place the device plugin reads os.environ; command-line flags override variables."""
    return settings_from({**os.environ, **(overrides or {})})
