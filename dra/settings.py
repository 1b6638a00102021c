"""DRA driver settings: the node settings and the driver's own GPUSHARE_DRA_* variables, checked at start (pure)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from common.cli import Variable
from common.settings import SettingsError, env_parsed, env_value
from contract.keys import DRA_DRIVER
from node.settings import NODE_VARIABLES, NodeSettings, check_socket_path, node_settings, positive_float

# The kubelet's conventional places (k8s.io/dynamic-resource-allocation kubeletplugin/draplugin.go:48-50).
DEFAULT_PLUGIN_DIR = f"/var/lib/kubelet/plugins/{DRA_DRIVER}"
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_STATE_DIR = "/var/lib/gpushare/dra"
DEFAULT_TIMEOUT_SECONDS = "20"
DEFAULT_RESYNC_SECONDS = "10"
# With GPUSHARE_POD_UID each socket's name carries the pod's UID, `dra-<uid>.sock` and `<driver>-<uid>-reg.sock`,
# as upstream's kubeletplugin names them with its RollingUpdate option (k8s.io/dynamic-resource-allocation
# kubeletplugin/draplugin.go, Start): two pods of the driver then serve one node side by side during a rolling
# update, and the kubelet (1.33 and later) keeps both registrations. Without it the names carry no UID, as upstream's
# do when rolling updates are off.
PLUGIN_SOCKET = "dra[-<pod uid>].sock"
HEALTH_SOCKET = "health[-<pod uid>].sock"
# The kubelet's plugin watcher takes any socket in the registry directory whose name does not start with a dot
# (pkg/kubelet/pluginmanager/pluginwatcher/plugin_watcher.go:166-172); `<driver>-reg.sock` is the convention.
REGISTRATION_SOCKET = f"{DRA_DRIVER}[-<pod uid>]-reg.sock"
# A pod's metadata.uid is an RFC 4122 UUID (36 characters); the check keeps a socket name a plain file name.
_POD_UID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,63}")
# The kubelet gives each NodePrepareResources and NodeUnprepareResources call 45 s (pkg/kubelet/cm/dra/plugin/
# dra_plugin.go:46): an answer after that is lost.
KUBELET_CALL_SECONDS = 45

# What --help lists; tests check that each default here is the one dra_settings_from applies.
DRA_VARIABLES = (
    *NODE_VARIABLES,
    Variable("GPUSHARE_DRA_PLUGIN_DIR", DEFAULT_PLUGIN_DIR,
             f"the driver's sockets {PLUGIN_SOCKET} and {HEALTH_SOCKET}; mount it at the same path as on the node"),
    Variable("GPUSHARE_DRA_REGISTRY_DIR", DEFAULT_REGISTRY_DIR,
             f"the kubelet's plugin registry: the registration socket {REGISTRATION_SOCKET}"),
    Variable("GPUSHARE_DRA_STATE_DIR", DEFAULT_STATE_DIR, "the checkpoint of prepared claims (a node directory)"),
    Variable("GPUSHARE_DRA_TIMEOUT_SECONDS", DEFAULT_TIMEOUT_SECONDS,
             f"bound of each claim's preparation and API request (below the kubelet's {KUBELET_CALL_SECONDS})"),
    Variable("GPUSHARE_DRA_RESYNC_SECONDS", DEFAULT_RESYNC_SECONDS,
             "how often the node's ResourceSlice is read and published again when missing or changed"),
    Variable("GPUSHARE_POD_UID", "", "the driver pod's metadata.uid (downward API), carried by its socket names so "
             "two pods serve a node side by side during a rolling update"),
)


@dataclass(frozen=True)
class DraSettings:
    node: NodeSettings
    plugin_dir: str
    registry_dir: str
    state_dir: str
    timeout_seconds: float
    resync_seconds: float
    pod_uid: str = ""

    def _named(self, name: str, suffix: str) -> str:
        return f"{name}-{self.pod_uid}{suffix}" if self.pod_uid else f"{name}{suffix}"

    @property
    def socket_path(self) -> str:
        """The DRAPlugin service's socket, which is also the endpoint given to the kubelet."""
        return os.path.join(self.plugin_dir, self._named("dra", ".sock"))

    @property
    def registration_path(self) -> str:
        return os.path.join(self.registry_dir, self._named(DRA_DRIVER, "-reg.sock"))

    @property
    def health_path(self) -> str:
        """The gRPC health service's socket (grpc.health.v1), which the pod's probes call."""
        return os.path.join(self.plugin_dir, self._named("health", ".sock"))


def call_seconds(text: str) -> float:
    value = positive_float(text)
    if value >= KUBELET_CALL_SECONDS:
        raise ValueError(f"must stay below the kubelet's {KUBELET_CALL_SECONDS} s per DRA call")
    return value


def dra_settings_from(env: Mapping[str, str]) -> DraSettings:
    settings = DraSettings(
        node=node_settings(env),
        plugin_dir=env_value(env, "GPUSHARE_DRA_PLUGIN_DIR", DEFAULT_PLUGIN_DIR),
        registry_dir=env_value(env, "GPUSHARE_DRA_REGISTRY_DIR", DEFAULT_REGISTRY_DIR),
        state_dir=env_value(env, "GPUSHARE_DRA_STATE_DIR", DEFAULT_STATE_DIR),
        timeout_seconds=env_parsed(
            env, "GPUSHARE_DRA_TIMEOUT_SECONDS", DEFAULT_TIMEOUT_SECONDS, call_seconds,
            f"a positive number of seconds below {KUBELET_CALL_SECONDS}",
        ),
        resync_seconds=env_parsed(
            env, "GPUSHARE_DRA_RESYNC_SECONDS", DEFAULT_RESYNC_SECONDS, positive_float, "a positive number of seconds"
        ),
        pod_uid=env_value(env, "GPUSHARE_POD_UID", ""),
    )
    if settings.pod_uid and not _POD_UID_RE.fullmatch(settings.pod_uid):
        raise SettingsError(f"GPUSHARE_POD_UID={settings.pod_uid!r} is not a pod UID (letters, digits and dashes, at "
                            "most 64); set it from the downward API, fieldRef metadata.uid, or leave it empty")
    directories = (("GPUSHARE_DRA_PLUGIN_DIR", settings.plugin_dir, DEFAULT_PLUGIN_DIR),
                   ("GPUSHARE_DRA_REGISTRY_DIR", settings.registry_dir, DEFAULT_REGISTRY_DIR),
                   ("GPUSHARE_DRA_STATE_DIR", settings.state_dir, DEFAULT_STATE_DIR))
    for variable, path, default in directories:
        if not os.path.isabs(path):
            # The kubelet dials the endpoint it is given from its own working directory, not the driver's.
            raise SettingsError(f"{variable}={path!r} is not an absolute path; give the node directory's absolute "
                                f"path (the default is {default})")
    check_socket_path(env, "GPUSHARE_DRA_PLUGIN_DIR", settings.socket_path, DEFAULT_PLUGIN_DIR)
    check_socket_path(env, "GPUSHARE_DRA_REGISTRY_DIR", settings.registration_path, DEFAULT_REGISTRY_DIR)
    check_socket_path(env, "GPUSHARE_DRA_PLUGIN_DIR", settings.health_path, DEFAULT_PLUGIN_DIR)
    return settings


def from_environ(overrides: Mapping[str, str] | None = None) -> DraSettings:
    """The one place the DRA driver reads os.environ; command-line flags override variables."""
    return dra_settings_from({**os.environ, **(overrides or {})})
