"""The driver's health service over its unix socket, and `gpushare-dra-probe` calling it: ready once registered,
serving and published; alive while it serves; a clear sentence and exit 1 otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dra.api import pluginregistration_pb2, pluginregistration_pb2_grpc
from dra.main import DraPlugin
from dra.probe import main, probe
from node.apiclient import ApiServerError
from tests.harness.dra.fakes import FakeDraApi
from tests.harness.dra.plugin import dra_settings

pytestmark = pytest.mark.timeout(60)
PROBE = str(Path(sys.executable).parent / "gpushare-dra-probe")


def _registered(plugin: DraPlugin, registered: bool = True) -> None:
    with grpc.insecure_channel(f"unix://{plugin.settings.registration_path}") as channel:
        stub = pluginregistration_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(plugin_registered=registered),
                                      timeout=30)


def _env(tmp: Path, **more: str) -> dict[str, str]:
    return {"GPUSHARE_NODE_NAME": "node-a", "GPUSHARE_DRA_PLUGIN_DIR": f"{tmp}/plugin",
            "GPUSHARE_DRA_REGISTRY_DIR": f"{tmp}/registry", "GPUSHARE_DRA_STATE_DIR": f"{tmp}/state", **more}


@pytest.mark.parametrize("uid", ["", "6f1f3c1e-4b4e-4d4a-9a7e-1f2e3d4c5b6a"])
def test_ready_once_registered_and_published_alive_while_serving(
        tmp_path_factory: pytest.TempPathFactory, uid: str, capsys: pytest.CaptureFixture[str]) -> None:
    tmp = tmp_path_factory.mktemp("dra")
    api = FakeDraApi()
    plugin = DraPlugin(dra_settings(tmp, GPUSHARE_POD_UID=uid), kube=api)
    path = plugin.settings.health_path
    assert path.endswith(f"health-{uid}.sock" if uid else "health.sock")
    env = _env(tmp, GPUSHARE_POD_UID=uid)
    try:
        plugin.start()
        assert probe("alive", path) == (True, f"The gpushare DRA driver on {path} is alive (SERVING).")
        assert probe("ready", path) == (False, (
            f"The gpushare DRA driver on {path} is not ready (NOT_SERVING): it is ready once the kubelet has "
            "registered it, its DRA service serves and its node's ResourceSlices are published; its log says which "
            "is missing."))
        _registered(plugin)
        assert probe("ready", path)[0] and main(["ready"], env) == 0
        api.slice_failure = ApiServerError("could not list: Connection refused")
        assert plugin.keeper is not None and not plugin.keeper.step()
        assert not probe("ready", path)[0], "slices not published: not ready"
        assert probe("alive", path)[0], "but alive: restarting would not bring the API server back"
        api.slice_failure = None
        plugin.keeper.step()
        _registered(plugin, registered=False)
        assert main(["ready"], env) == 1
    finally:
        plugin.stop()
    capsys.readouterr()
    assert main(["alive"], env) == 1
    assert capsys.readouterr().out.startswith(f"The gpushare DRA driver's health service on {path} did not answer "
                                              "within 1.5 s (UNAVAILABLE)")


def test_an_unknown_service_is_not_found(tmp_path_factory: pytest.TempPathFactory) -> None:
    plugin = DraPlugin(dra_settings(tmp_path_factory.mktemp("dra")), kube=FakeDraApi())
    try:
        plugin.start()
        with (grpc.insecure_channel("unix:" + plugin.settings.health_path) as channel,
              pytest.raises(grpc.RpcError) as caught):
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="other"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        plugin.stop()


def test_the_installed_command_says_why_in_one_line(tmp_path: Path) -> None:
    env = {**_env(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([PROBE, "ready"], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1
    assert done.stdout == (f"The gpushare DRA driver's health service on {tmp_path}/plugin/health.sock did not "
                           "answer within 1.5 s (UNAVAILABLE): the driver is not serving; see its log.\n")
    bad = subprocess.run([PROBE, "alive"], env={**env, "GPUSHARE_POD_UID": "../x"}, capture_output=True, text=True,
                         timeout=30, check=False)
    assert bad.returncode == 1 and bad.stdout.startswith("The gpushare DRA driver's settings are not valid")
    usage = subprocess.run([PROBE, "sideways"], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert usage.returncode == 2 and "invalid choice: 'sideways'" in usage.stderr
