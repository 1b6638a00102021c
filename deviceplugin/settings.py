"""Device plugin settings: one frozen dataclass built from GPUSHARE_* environment variables, checked at start."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from common.cli import Variable
from common.settings import env_parsed, env_value, positive_int
from contract import Contract
from contract.modes import Placement
from node.settings import NODE_VARIABLES, NodeSettings, check_socket_path, node_settings, positive_float

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES = "/var/lib/kubelet/pod-resources/kubelet.sock"
# The kubelet and gRPC choke on ListAndWatch messages with very many devices; 8 GPUs of 80 GiB are 640.
DEFAULT_MAX_DEVICES = "4096"
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


def rpc_seconds(text: str) -> float:
    value = positive_float(text)
    if value >= 30:
        # The kubelet gives PreStartContainer 30 s; an answer after that is lost.
        raise ValueError("must stay below the kubelet's 30 s PreStartContainer limit")
    return value


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
