"""The process entry: settings errors, start failures, and a whole run against the test kubelet and HTTP API."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract.signing import public_pem
from deviceplugin.main import main, run
from deviceplugin.settings import PluginSettings
from tests.harness.apiserver.kube_http import FakeKube, write_kubeconfig
from tests.harness.kubelet.scripted import TestKubelet
from tests.harness.plugin.fakes import plugin_settings

pytestmark = pytest.mark.timeout(60)


def own_sockets(settings: PluginSettings) -> list[str]:
    return [name for name in os.listdir(settings.device_plugin_dir) if settings.is_own_socket(name)]


def test_missing_node_name_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GPUSHARE_NODE_NAME", raising=False)
    assert main([]) == 2
    assert "GPUSHARE_NODE_NAME is not set" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("env", "error"),
    [
        ({"GPUSHARE_FAKE_GPUS": "lots"}, "GPUSHARE_FAKE_GPUS='lots' is not COUNTxMEMORY"),
        ({"GPUSHARE_FAKE_GPUS": "2x24GiB", "GPUSHARE_UNIT": "MiB"}, "more than GPUSHARE_MAX_DEVICES=4096"),
        ({"GPUSHARE_VERIFY_KEY": "/nonexistent/signing.pub"}, "mount the gpushare-verify-key ConfigMap"),
    ],
)
def test_start_failures_exit_2_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, env: dict[str, str], error: str
) -> None:
    settings = plugin_settings(str(tmp_path), **env)
    assert run(settings, threading.Event()) == 2
    assert error in caplog.text


def test_help_runs_as_a_module() -> None:
    out = subprocess.run([sys.executable, "-m", "deviceplugin.main", "--help"], capture_output=True, text=True,
                         check=True)
    assert "--fake-gpus" in out.stdout and "GPUSHARE_" in out.stdout


def test_run_serves_registers_and_cleans_up(tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("m")
    key = tmp / "signing.pub"
    key.write_bytes(public_pem(Ed25519PrivateKey.generate().public_key()))
    server = FakeKube()
    http = threading.Thread(target=server.serve_forever, daemon=True)
    http.start()
    settings = plugin_settings(
        str(tmp), GPUSHARE_VERIFY_KEY=str(key),
        GPUSHARE_KUBECONFIG=write_kubeconfig(tmp / "kubeconfig", server.server_address[1]),
    )
    kubelet = TestKubelet(settings.device_plugin_dir, settings.pod_resources_socket)
    kubelet.start()
    stop = threading.Event()
    codes: list[int] = []
    gc.unfreeze()
    runner = threading.Thread(target=lambda: codes.append(run(settings, stop)))
    runner.start()
    try:
        (registered,) = kubelet.wait_registrations(1)
        assert registered.plugin_was_serving
        kubelet.plugin()
        assert len(kubelet.wait_lists(1)) == 16
        assert os.path.exists(os.path.join(settings.device_plugin_dir, registered.request.endpoint))
        until = time.monotonic() + 10
        while not gc.get_freeze_count() and time.monotonic() < until:  # run() freezes once start() has returned
            time.sleep(0.01)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        kubelet.close_plugin_channel()
        stop.set()
        runner.join(timeout=30)
        server.closing.set()
        server.shutdown()
        server.server_close()
        kubelet.stop()
    assert codes == [0]
    assert not own_sockets(settings)
    capacity = [r[3] for r in server.requests if r[1] == "/api/v1/nodes/node-a/status"]
    assert capacity == [{"status": {"capacity": {"aliyun.com/gpu-count": "2"}}}]


def test_the_process_stops_cleanly_on_sigterm(tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("p")
    key = tmp / "signing.pub"
    key.write_bytes(public_pem(Ed25519PrivateKey.generate().public_key()))
    server = FakeKube()
    http = threading.Thread(target=server.serve_forever, daemon=True)
    http.start()
    settings = plugin_settings(str(tmp))
    kubelet = TestKubelet(settings.device_plugin_dir, settings.pod_resources_socket)
    kubelet.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env.update({
        "GPUSHARE_VERIFY_KEY": str(key), "GPUSHARE_DEVICE_PLUGIN_DIR": settings.device_plugin_dir,
        "GPUSHARE_POD_RESOURCES_SOCKET": settings.pod_resources_socket, "GPUSHARE_CDI_DIR": settings.cdi_dir,
        "GPUSHARE_KUBECONFIG": write_kubeconfig(tmp / "kubeconfig", server.server_address[1]),
        "GPUSHARE_METRICS_BIND": "127.0.0.1:0",
    })
    process = subprocess.Popen(
        [sys.executable, "-m", "deviceplugin.main", "--node-name", "node-a", "--fake-gpus", "1x4GiB"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        (registered,) = kubelet.wait_registrations(1, timeout=30)
        assert registered.plugin_was_serving
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        server.closing.set()
        server.shutdown()
        server.server_close()
        kubelet.stop()
    assert process.returncode == 0, output
    assert "Received SIGTERM" in output and "socket" in output and "removed" in output
    assert not own_sockets(settings)
