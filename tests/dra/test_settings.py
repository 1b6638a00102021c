from __future__ import annotations

import inspect
import re

import pytest

from common.cli import Variable
from common.settings import SettingsError
from deviceplugin import settings as plugin_settings
from dra import settings
from dra.main import FLAGS
from dra.settings import DRA_VARIABLES, dra_settings_from
from node.settings import node_settings

BASE = {"GPUSHARE_NODE_NAME": "node-a"}


def test_defaults_are_the_kubelets_places() -> None:
    s = dra_settings_from(BASE)
    assert s.node == node_settings(BASE)  # read as the device plugin reads them
    assert s.socket_path == "/var/lib/kubelet/plugins/gpushare.io/dra.sock"
    assert s.registration_path == "/var/lib/kubelet/plugins_registry/gpushare.io-reg.sock"
    assert (s.state_dir, s.timeout_seconds, s.resync_seconds) == ("/var/lib/gpushare/dra", 20.0, 10.0)


def test_the_device_plugin_reads_the_same_node_settings() -> None:
    env = {**BASE, "GPUSHARE_FAKE_GPUS": "2x8GiB", "GPUSHARE_UNIT": "MiB", "GPUSHARE_METRICS_BIND": ""}
    node, plugin = dra_settings_from(env).node, plugin_settings.settings_from(env)
    assert (plugin.contract, plugin.fake_gpus, plugin.metrics_bind) == (node.contract, "2x8GiB", None)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"GPUSHARE_NODE_NAME": ""}, "GPUSHARE_NODE_NAME is not set; give the plugin its node's name through the "
                                     "downward API"),
        ({"GPUSHARE_DRA_TIMEOUT_SECONDS": "0"}, "GPUSHARE_DRA_TIMEOUT_SECONDS='0' is not valid: must be a finite "
                                                "number greater than zero; expected a positive number of seconds "
                                                "below 45"),
        ({"GPUSHARE_DRA_TIMEOUT_SECONDS": "45"}, "GPUSHARE_DRA_TIMEOUT_SECONDS='45' is not valid: must stay below "
                                                 "the kubelet's 45 s per DRA call"),
        ({"GPUSHARE_DRA_TIMEOUT_SECONDS": "soon"}, "GPUSHARE_DRA_TIMEOUT_SECONDS='soon' is not valid: could not "
                                                   "convert string to float"),
        ({"GPUSHARE_DRA_RESYNC_SECONDS": "-1"}, "GPUSHARE_DRA_RESYNC_SECONDS='-1' is not valid: must be a finite "
                                                "number greater than zero; expected a positive number of seconds"),
        ({"GPUSHARE_DRA_RESYNC_SECONDS": "inf"}, "GPUSHARE_DRA_RESYNC_SECONDS='inf' is not valid"),
        ({"GPUSHARE_DRA_PLUGIN_DIR": "plugins"}, "GPUSHARE_DRA_PLUGIN_DIR='plugins' is not an absolute path; give "
                                                 "the node directory's absolute path (the default is "
                                                 "/var/lib/kubelet/plugins/gpushare.io)"),
        ({"GPUSHARE_DRA_REGISTRY_DIR": ""}, "GPUSHARE_DRA_REGISTRY_DIR='' is not an absolute path"),
        ({"GPUSHARE_DRA_STATE_DIR": "./state"}, "GPUSHARE_DRA_STATE_DIR='./state' is not an absolute path"),
        ({"GPUSHARE_DRA_PLUGIN_DIR": "/run/" + "d" * 100}, "GPUSHARE_DRA_PLUGIN_DIR='/run/ddd"),
        ({"GPUSHARE_DRA_PLUGIN_DIR": "/run/" + "d" * 100}, "gives the socket path /run/" + "d" * 100 + "/dra.sock, "
                                                           "114 bytes long; a unix socket address holds at most 107: "
                                                           "choose a shorter path (the kubelet's is "
                                                           "/var/lib/kubelet/plugins/gpushare.io)"),
        ({"GPUSHARE_DRA_REGISTRY_DIR": "/r/" + "r" * 90}, "GPUSHARE_DRA_REGISTRY_DIR='/r/rrr"),
        ({"GPUSHARE_DRA_REGISTRY_DIR": "/r/" + "r" * 90}, "reg.sock, 114 bytes long"),
        ({"GPUSHARE_METRICS_BIND": "9103"}, "GPUSHARE_METRICS_BIND='9103' is not valid"),
        ({"GPUSHARE_UNIT": "TiB"}, "GPUSHARE_UNIT"),
    ],
)
def test_each_bad_value_names_its_variable(change: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        dra_settings_from({**BASE, **change})
    assert message in str(caught.value)


def test_a_socket_path_of_107_bytes_is_accepted() -> None:
    directory = "/" + "d" * (107 - len("//health.sock"))  # the longest name in the plugin directory
    assert len(dra_settings_from({**BASE, "GPUSHARE_DRA_PLUGIN_DIR": directory}).health_path) == 107


POD_UID = "6f1f3c1e-4b4e-4d4a-9a7e-1f2e3d4c5b6a"


def test_the_pod_uid_is_in_every_socket_name() -> None:
    """As upstream's kubeletplugin with RollingUpdate: two pods of one node never share a socket path."""
    s = dra_settings_from({**BASE, "GPUSHARE_POD_UID": POD_UID})
    assert s.socket_path == f"/var/lib/kubelet/plugins/gpushare.io/dra-{POD_UID}.sock"
    assert s.registration_path == f"/var/lib/kubelet/plugins_registry/gpushare.io-{POD_UID}-reg.sock"
    assert s.health_path == f"/var/lib/kubelet/plugins/gpushare.io/health-{POD_UID}.sock"
    assert dra_settings_from(BASE).health_path == "/var/lib/kubelet/plugins/gpushare.io/health.sock"


@pytest.mark.parametrize("uid", ["../escape", "a/b", "-dash", "x" * 65, "uid with space"])
def test_a_pod_uid_that_is_no_uid_is_refused(uid: str) -> None:
    with pytest.raises(SettingsError, match=r"GPUSHARE_POD_UID=.* is not a pod UID .*fieldRef metadata.uid"):
        dra_settings_from({**BASE, "GPUSHARE_POD_UID": uid})


def test_help_table_names_every_variable_read() -> None:
    read = set(re.findall(r"GPUSHARE_[A-Z_]+", inspect.getsource(settings.dra_settings_from)))
    read |= set(re.findall(r"GPUSHARE_[A-Z_]+", inspect.getsource(node_settings)))
    read |= set(FLAGS.values())
    assert read <= {v.name for v in DRA_VARIABLES}


@pytest.mark.parametrize("variable", DRA_VARIABLES, ids=lambda v: v.name)
def test_help_table_defaults_are_the_applied_defaults(variable: Variable) -> None:
    if not variable.required:
        assert dra_settings_from({**BASE, variable.name: variable.default}) == dra_settings_from(BASE)
