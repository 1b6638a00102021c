"""The real `gpushare-device-plugin` process: one line per start-up failure, a bounded stop after SIGTERM, and
the settings table of its --help."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from common.cli import Variable
from contract.signing import public_pem
from deviceplugin import settings
from deviceplugin.main import FLAGS
from deviceplugin.settings import PLUGIN_VARIABLES

pytestmark = pytest.mark.timeout(120)

PLUGIN = str(Path(sys.executable).parent / "gpushare-device-plugin")
SOCKET = "gpushare-aliyun-com-gpu-mem-0123abcd.sock"  # named like one of the plugin's sockets


def base_env(tmp: Path) -> dict[str, str]:
    key = tmp / "signing.pub"
    key.write_bytes(public_pem(Ed25519PrivateKey.generate().public_key()))
    (tmp / "kubeconfig").write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env.update({
        "GPUSHARE_NODE_NAME": "node-a", "GPUSHARE_FAKE_GPUS": "1x4GiB", "GPUSHARE_VERIFY_KEY": str(key),
        "GPUSHARE_DEVICE_PLUGIN_DIR": str(tmp / "dp"), "GPUSHARE_POD_RESOURCES_SOCKET": str(tmp / "pr.sock"),
        "GPUSHARE_CDI_DIR": str(tmp / "cdi"), "GPUSHARE_KUBECONFIG": str(tmp / "kubeconfig"),
        "GPUSHARE_METRICS_BIND": "127.0.0.1:0",  # any free port: tests run side by side
    })
    return env


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"GPUSHARE_NODE_NAME": ""}, ("GPUSHARE_NODE_NAME is not set", "downward API")),
        ({"GPUSHARE_SHUTDOWN_SECONDS": "0"}, ("GPUSHARE_SHUTDOWN_SECONDS='0' is not valid",)),
        ({"GPUSHARE_LOG_FORMAT": "xml"}, ("GPUSHARE_LOG_FORMAT='xml' is not valid; expected text or json",)),
        ({"GPUSHARE_FAKE_GPUS": "lots"}, ("GPUSHARE_FAKE_GPUS='lots' is not COUNTxMEMORY",)),
        ({"GPUSHARE_VERIFY_KEY": "/nonexistent/signing.pub"}, ("GPUSHARE_VERIFY_KEY", "gpushare-verify-key")),
        ({"GPUSHARE_KUBECONFIG": "/nonexistent/kubeconfig"}, ("GPUSHARE_KUBECONFIG=/nonexistent/kubeconfig gives no",)),
        ({"GPUSHARE_DEVICE_PLUGIN_DIR": "/dev/null/dp"}, ("GPUSHARE_DEVICE_PLUGIN_DIR=", "cannot be created")),
        ({"GPUSHARE_DEVICE_PLUGIN_DIR": "/run/" + "d" * 80}, ("GPUSHARE_DEVICE_PLUGIN_DIR='/run/ddd", "bytes long",
                                                             "holds at most 107", "/var/lib/kubelet/device-plugins")),
        ({"GPUSHARE_POD_RESOURCES_SOCKET": "/run/" + "p" * 110}, ("GPUSHARE_POD_RESOURCES_SOCKET=", "115 bytes long")),
    ],
)
def test_each_start_failure_is_one_line_and_leaves_sockets_alone(
    tmp_path: Path, change: dict[str, str], fragments: tuple[str, ...]
) -> None:
    env = base_env(tmp_path)
    env.update({k: v.format(tmp=tmp_path) for k, v in change.items()})
    # Another plugin's socket at our path: a plugin that fails to start must not remove it.
    (tmp_path / "dp").mkdir()
    other = tmp_path / "dp" / SOCKET
    other.write_bytes(b"")
    out = subprocess.run([PLUGIN], env=env, capture_output=True, text=True, timeout=60, check=False)
    lines = out.stderr.splitlines()
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1, lines
    assert "The device plugin cannot start: " in lines[0] and lines[0].endswith(".")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in out.stderr
    assert other.exists()


def test_a_start_failure_in_json_is_one_json_object(tmp_path: Path) -> None:
    env = base_env(tmp_path)
    env.update({"GPUSHARE_LOG_FORMAT": "json", "GPUSHARE_FAKE_GPUS": "lots"})
    out = subprocess.run([PLUGIN], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR" and record["logger"] == "deviceplugin.main"
    assert record["message"].startswith("The device plugin cannot start: GPUSHARE_FAKE_GPUS='lots'")


# The real entry (deviceplugin.main.main) with the plugin's work replaced by calls that never return, as a hung
# kubelet or API call, a stuck gRPC handler or a thread the interpreter waits for at exit would.
BLOCKED = """
import sys, threading
from deviceplugin import main as entry

def blocked_forever(*args):
    print("blocked", flush=True)
    threading.Event().wait()

def returns(self):
    print("blocked", flush=True)

case = sys.argv.pop(1)
if case == "start":
    entry.Plugin.start = blocked_forever
elif case == "stop":
    entry.Plugin.start = returns
    entry.Plugin.stop = blocked_forever
else:  # a non-daemon thread that never ends: the interpreter would wait for it at exit
    entry.Plugin.start = lambda self: threading.Thread(target=blocked_forever, daemon=False).start()
    entry.Plugin.stop = lambda self: None
sys.exit(entry.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("case", ["start", "stop", "exit"])
def test_sigterm_stops_a_plugin_whose_threads_are_blocked_with_a_stack_dump(tmp_path: Path, case: str) -> None:
    env = base_env(tmp_path)
    env["GPUSHARE_SHUTDOWN_SECONDS"] = "1"
    process = subprocess.Popen(
        [sys.executable, "-c", BLOCKED, case], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "blocked\n"
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)  # generous: the bound is 1 s
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1, err
    assert "Received SIGTERM; stopping. If the device plugin has not stopped within 1 s" in err
    assert "Timeout (0:00:01)!" in err and "most recent call first" in err
    assert 'in blocked_forever' in err  # the stuck thread's stack is in the dump


def test_help_table_names_every_variable_read() -> None:
    read = set(re.findall(r"GPUSHARE_[A-Z_]+", inspect.getsource(settings.settings_from)))
    read |= set(FLAGS.values())
    assert read <= {v.name for v in PLUGIN_VARIABLES}


@pytest.mark.parametrize("variable", PLUGIN_VARIABLES, ids=lambda v: v.name)
def test_help_table_defaults_are_the_applied_defaults(variable: Variable) -> None:
    base = {"GPUSHARE_NODE_NAME": "node-a"}
    if not variable.required:
        assert settings.settings_from({**base, variable.name: variable.default}) == settings.settings_from(base)


def test_retries_are_one_line_each_with_the_next_delay(tmp_path: Path) -> None:
    """No API server and no kubelet: the pod watch retries with a growing delay, the registration waits for the
    kubelet's socket, and each says so in one line of its own (no urllib3 retry warnings, no gRPC status names)."""
    env = base_env(tmp_path)  # its kubeconfig names a port nothing listens on
    process = subprocess.Popen([PLUGIN], env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert process.stderr is not None
        while sum("Watching this node's pods" in line for line in lines) < 3:
            line = process.stderr.readline()
            assert line, f"the plugin exited: {lines}"
            lines.append(line)
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=60)
        lines += rest.splitlines()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = "\n".join(lines)
    watch = [line for line in lines if "Watching this node's pods" in line]
    delays = [float(re.search(r"retrying in ([\d.]+) s\.$", line.strip()).group(1)) for line in watch[:3]]  # type: ignore[union-attr]
    assert delays == [0.5, 1.0, 2.0]
    assert all("Connection refused" in line and "127.0.0.1:9" in line for line in watch)
    assert "Retrying (Retry(" not in text and "urllib3" not in text and "Traceback" not in text
    (registration,) = [line for line in lines if "Registering with the kubelet failed" in line]
    assert "kubelet.sock does not exist yet" in registration and "DEADLINE_EXCEEDED" not in text
    assert process.returncode == 0
