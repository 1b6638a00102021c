"""The fake libnvidia-ml.so.1 itself: read through nvidia-ml-py and through go-nvml, the way our plugin and a Go
device plugin call it, with the real library's errors, struct layouts and event-set waits."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from e2e import fakenvml, toolchain
from tests.harness.nvml import clean_env, library_dir, probe_binary, run_python

pytestmark = pytest.mark.timeout(600)  # the first go-nvml probe build compiles the whole cgo binding
UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
GIVEN = "GPU-4f1c2a9e-7d3b-4c8a-9e21-0b5d6f7a8c9d"
MiB = 2**20
GiB = 2**30

READ_GPUS = """
import json, pynvml
pynvml.nvmlInit()
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    try:
        minor = pynvml.nvmlDeviceGetMinorNumber(h)
    except pynvml.NVMLError_NotSupported:
        minor = None
    out.append([pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetMemoryInfo(h).total,
                pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).total, minor,
                pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetIndex(h)])
pynvml.nvmlShutdown()
print(json.dumps(out))
"""


def env_for(gpus: str, events: Path | None = None) -> dict[str, str]:
    return clean_env(**fakenvml.environment(library_dir(), gpus, events))


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ("4x16384", [(16384, 0), (16384, 1), (16384, 2), (16384, 3)]),
        (f"81920:{GIVEN}:7,143771", [(81920, 7), (143771, 1)]),
        (f"65536:{GIVEN}:-", [(65536, None)]),
    ],
)
def test_nvidia_ml_py_reads_the_gpus_of_the_variable(gpus: str, expected: list[tuple[int, int | None]]) -> None:
    first = run_python(READ_GPUS, env_for(gpus))
    assert [(total // MiB, minor) for _, total, _, minor, _, _ in first] == expected
    assert all(total == total_v2 for _, total, total_v2, _, _, _ in first)
    assert [index for *_, index in first] == list(range(len(expected)))
    uuids = [u for u, *_ in first]
    assert all(UUID_RE.match(u) for u in uuids) and len(set(uuids)) == len(uuids)
    if GIVEN in gpus:
        assert uuids[0] == GIVEN
    assert run_python(READ_GPUS, env_for(gpus)) == first  # deterministic: the same GPUs in every process


def test_the_same_index_gets_the_same_uuid_in_both_forms() -> None:
    short = [u for u, *_ in run_python(READ_GPUS, env_for("2x1024"))]
    listed = [u for u, *_ in run_python(READ_GPUS, env_for("1024,2048"))]
    assert short == listed


ERRORS = """
import ctypes, json
lib = ctypes.CDLL("libnvidia-ml.so.1")
lib.nvmlErrorString.restype = ctypes.c_char_p
count, handle, buf = ctypes.c_uint(), ctypes.c_void_p(), ctypes.create_string_buffer(96)
out = {"count_before_init": lib.nvmlDeviceGetCount_v2(ctypes.byref(count))}
out["init"] = lib.nvmlInit_v2()
out["init_again"] = lib.nvmlInit_v2()
out["count"] = [lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), count.value]
out["count_null"] = lib.nvmlDeviceGetCount_v2(None)
out["bad_index"] = lib.nvmlDeviceGetHandleByIndex_v2(2, ctypes.byref(handle))
out["bad_handle"] = lib.nvmlDeviceGetUUID(ctypes.c_void_p(8), buf, 96)
lib.nvmlDeviceGetHandleByIndex_v2(1, ctypes.byref(handle))
out["short_buffer"] = lib.nvmlDeviceGetUUID(handle, buf, 10)
class MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint)] + [(n, ctypes.c_ulonglong) for n in ("total", "reserved", "free", "used")]
memory = MemoryV2(version=1)
out["memory_v2_wrong_version"] = lib.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(memory))
v1 = (ctypes.c_ulonglong * 3)()
lib.nvmlDeviceGetMemoryInfo(handle, v1)
memory.version = ctypes.sizeof(MemoryV2) | 2 << 24
lib.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(memory))
out["memory"] = [list(v1), [memory.total, memory.reserved, memory.free, memory.used]]
out["unknown_uuid"] = lib.nvmlDeviceGetHandleByUUID(b"GPU-00000000-0000-0000-0000-000000000000", ctypes.byref(handle))
out["register_without_set"] = lib.nvmlDeviceRegisterEvents(handle, ctypes.c_ulonglong(8), None)
event_set = ctypes.c_void_p()
lib.nvmlEventSetCreate(ctypes.byref(event_set))
out["register_unsupported"] = lib.nvmlDeviceRegisterEvents(handle, ctypes.c_ulonglong(1 << 40), event_set)
out["wait_without_data"] = lib.nvmlEventSetWait_v2(event_set, None, 10)
out["shutdowns"] = [lib.nvmlShutdown(), lib.nvmlShutdown(), lib.nvmlShutdown()]
out["count_after_shutdown"] = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
out["strings"] = [lib.nvmlErrorString(c).decode() for c in (0, 1, 2, 3, 4, 7, 9, 10, 13, 999)]
print(json.dumps(out))
"""


def test_errors_are_the_real_librarys() -> None:
    out = run_python(ERRORS, env_for("2x1024"))
    assert out == {
        "count_before_init": 1, "init": 0, "init_again": 0, "count": [0, 2], "count_null": 2, "bad_index": 2,
        "bad_handle": 2, "short_buffer": 7, "memory_v2_wrong_version": 13, "unknown_uuid": 6,
        "register_without_set": 2, "register_unsupported": 3, "wait_without_data": 2, "shutdowns": [0, 0, 1],
        "count_after_shutdown": 1,
        # As an H200 reports: v1 counts the driver's reservation as used, v2 apart.
        "memory": [[GiB, GiB - GiB // 234, GiB // 234], [GiB, GiB // 234, GiB - GiB // 234, 0]],
        "strings": ["Success", "Uninitialized", "Invalid Argument", "Not Supported", "Insufficient Permissions",
                    "Insufficient Size", "Driver Not Loaded", "Timeout", "Function Not Found", "Unknown Error"],
    }


UNSUPPORTED = """
import ctypes, json
lib = ctypes.CDLL("libnvidia-ml.so.1")
handle, value, bar1 = ctypes.c_void_p(), ctypes.c_uint(), (ctypes.c_ulonglong * 3)()
calls = {
    "nvmlDeviceGetPowerManagementLimit": lambda h, out: lib.nvmlDeviceGetPowerManagementLimit(h, out),
    "nvmlDeviceGetBAR1MemoryInfo": lambda h, out: lib.nvmlDeviceGetBAR1MemoryInfo(h, None if out is None else bar1),
    "nvmlDeviceGetMaxPcieLinkGeneration": lambda h, out: lib.nvmlDeviceGetMaxPcieLinkGeneration(h, out),
    "nvmlDeviceGetMaxPcieLinkWidth": lambda h, out: lib.nvmlDeviceGetMaxPcieLinkWidth(h, out),
    "nvmlDeviceGetMaxClockInfo SM": lambda h, out: lib.nvmlDeviceGetMaxClockInfo(h, 1, out),
    "nvmlDeviceGetMaxClockInfo MEM": lambda h, out: lib.nvmlDeviceGetMaxClockInfo(h, 2, out),
}
out = {name: [call(handle, ctypes.byref(value))] for name, call in calls.items()}
lib.nvmlInit_v2()
lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
for name, call in calls.items():
    out[name] += [call(ctypes.c_void_p(8), ctypes.byref(value)), call(handle, None), call(handle, ctypes.byref(value))]
out["clock_type"] = [lib.nvmlDeviceGetMaxClockInfo(handle, t, ctypes.byref(value)) for t in (-1, 0, 3, 4)]
print(json.dumps(out))
"""


def test_what_a_fake_gpu_does_not_support_is_not_supported_after_the_argument_checks() -> None:
    # The reference device plugin's bindings ask each of these for every GPU at start-up.
    out = run_python(UNSUPPORTED, env_for("2x1024"))
    clock_type = out.pop("clock_type")
    # before init, a bad handle, a NULL pointer, then NOT_SUPPORTED
    assert len(out) == 6 and all(codes == [1, 2, 2, 3] for codes in out.values()), out
    assert clock_type == [2, 3, 3, 2]  # nvmlClockType_t: GRAPHICS, SM, MEM, VIDEO


INIT = """
import json, pynvml
try:
    pynvml.nvmlInit()
    print(json.dumps(pynvml.nvmlDeviceGetCount()))
except pynvml.NVMLError as exc:
    print(json.dumps(str(exc)))
"""


@pytest.mark.parametrize(
    ("gpus", "answer"),
    [("", "Driver Not Loaded"), ("0x16384", 0), ("4x", "Unknown Error"), ("16384:not-a-uuid", "Unknown Error"),
     ("65x1024", "Unknown Error"), ("1024:GPU-1:x", "Unknown Error")],
)
def test_init_follows_the_variable(gpus: str, answer: object) -> None:
    assert run_python(INIT, env_for(gpus)) == answer


EVENTS = """
import json, sys, pynvml
from e2e.fakenvml import inject_xid
events = sys.argv[1]
pynvml.nvmlInit()
inject_xid(events, 1, 31)  # before the set exists: never delivered
first = pynvml.nvmlEventSetCreate()
one = pynvml.nvmlDeviceGetHandleByIndex(1)
pynvml.nvmlDeviceRegisterEvents(one, pynvml.nvmlEventTypeXidCriticalError, first)
out = {"supported": pynvml.nvmlDeviceGetSupportedEventTypes(one)}
try:
    pynvml.nvmlEventSetWait_v2(first, 50)
except pynvml.NVMLError_Timeout:
    out["quiet"] = "timeout"
inject_xid(events, 0, 79)  # GPU 0 is not registered in this set
inject_xid(events, pynvml.nvmlDeviceGetUUID(one), 48)
data = pynvml.nvmlEventSetWait_v2(first, 5000)
out["event"] = [pynvml.nvmlDeviceGetUUID(data.device) == pynvml.nvmlDeviceGetUUID(one), data.eventType,
                data.eventData, data.gpuInstanceId, data.computeInstanceId]
try:
    pynvml.nvmlEventSetWait_v2(first, 50)
except pynvml.NVMLError_Timeout:
    out["after"] = "timeout"
pynvml.nvmlEventSetFree(first)
print(json.dumps(out))
"""


def test_an_event_set_sees_the_xids_of_its_gpus_after_it_exists(tmp_path: Path) -> None:
    code = f"import sys; sys.argv = ['x', {str(tmp_path / 'events')!r}]; sys.path.insert(0, {str(Path.cwd())!r})\n"
    out = run_python(code + EVENTS, env_for("2x1024", tmp_path / "events"))
    assert out == {"supported": 0xFF9F, "quiet": "timeout", "event": [True, 8, 48, 0xFFFFFFFF, 0xFFFFFFFF],
                   "after": "timeout"}


def probe_lines(gpus: str, events: Path, wait_ms: int, xid: tuple[int, int] | None = None) -> list[str]:
    """Runs the go-nvml probe; when `xid` is given, injects it on (GPU index, XID) while the probe waits."""
    with subprocess.Popen([str(probe_binary()), "-wait-ms", str(wait_ms)], env=env_for(gpus, events),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as probe:
        try:
            assert probe.stdout is not None
            lines = []
            for line in probe.stdout:
                lines.append(line.strip())
                if line.startswith("waiting") and xid is not None:
                    fakenvml.inject_xid(events, *xid)
            assert probe.wait(timeout=60) == 0, (lines, probe.stderr.read() if probe.stderr else "")
        finally:
            probe.kill()
    return lines


def fields(lines: list[str], step: str) -> list[dict[str, str]]:
    found = []
    for line in lines:
        name, _, rest = line.partition(" ")
        if name == step:
            found.append(dict(re.findall(r'(\w+)=("[^"]*"|\S+)', rest)))
    return found


def test_go_nvml_inits_counts_reads_and_waits_for_an_xid(tmp_path: Path) -> None:
    events = tmp_path / "events"
    lines = probe_lines(f"16384,81920:{GIVEN}:-", events, 30000, xid=(1, 79))
    assert fields(lines, "driver") == [{"ret": "0", "version": "550.127.05"}]
    assert fields(lines, "count") == [{"ret": "0", "count": "2"}]
    devices = fields(lines, "device")
    assert [(d["index"], d["total"], d["minor_ret"], d["pci_ret"]) for d in devices] == [
        ("0", str(16384 * MiB), "0", "0"), ("1", str(81920 * MiB), "3", "0")]
    assert devices[1]["uuid"] == GIVEN and UUID_RE.match(devices[0]["uuid"])
    assert [r["ret"] for r in fields(lines, "register")] == ["0", "0"]
    assert fields(lines, "bad-index") == [{"ret": "2", "error": '"Invalid Argument"'}]
    assert fields(lines, "event") == [{"ret": "0", "uuid": GIVEN, "type": "8", "xid": "79", "gi": "4294967295"}]
    assert [fields(lines, s) for s in ("free", "shutdown", "shutdown-again")] == [
        [{"ret": "0"}], [{"ret": "0"}], [{"ret": "1"}]]


def test_go_nvml_wait_times_out_without_events(tmp_path: Path) -> None:
    lines = probe_lines("1x1024", tmp_path / "events", 50)
    assert fields(lines, "event") == [{"ret": "10", "error": '"Timeout"'}]


KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: unused}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
"""
# The kubelet's device-plugin directory the plugin watches before it reads the GPUs, given to it on a tmpfs in a
# mount namespace of its own: the host's /var/lib/kubelet belongs to the real-cluster tier.
PRIVATE_KUBELET_DIR = ('mount -t tmpfs gpushare-test /var/lib && mkdir -p /var/lib/kubelet/device-plugins && '
                       'exec "$0" "$@"')


def test_the_reference_device_plugin_reads_every_gpu_through_the_fake_library(reference: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("the reference plugin needs the kubelet's device-plugin directory before it reads the GPUs, "
                    "given to it in a private mount namespace, which needs root and unshare (util-linux)")
    with socket.socket() as sock:  # a port nobody listens on: the API server is unreachable
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp_path / "kubeconfig").write_text(KUBECONFIG.format(port=port))
    gpus = [(65536, f"GPU-5e1f0c2a-0000-4000-8000-00000000000{i}", i) for i in range(3)]
    gpus[2] = (32768, gpus[2][1], 2)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KUBECONFIG": str(tmp_path / "kubeconfig"),
           "NODE_NAME": "x", **fakenvml.environment(library_dir(), fakenvml.gpu_list(gpus))}
    plugin = reference / toolchain.PLUGIN_BINARY
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", PRIVATE_KUBELET_DIR, str(plugin),
         "-logtostderr", "-v=4", "-token", "unused", "-memory-unit=GiB"],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    log = result.stdout + result.stderr
    assert "symbol lookup error" not in log and "Failed to initialize NVML" not in log, log
    assert "Loading NVML" in log and "Fetching devices." in log
    # Every GPU, its UUID and device node (minor = index), and its memory in MiB.
    assert re.findall(r"Deivce (\S+)'s Path is (\S+)\n", log) == [(u, f"/dev/nvidia{m}") for _, u, m in gpus], log
    assert re.findall(r"# device Memory: (\d+)\n", log) == ["65536", "65536", "32768"]
    # Every GPU is counted at the first one's size (nvidia.go, getDevices): 64 GiB units each.
    assert "set gpu memory: 64\n" in log
    assert log.count("# Add last device ID: ") == 3 and f"{gpus[2][1]}-_-63" in log
    # Then it needs the API server (patchGPUCount), which is not there.
    assert result.returncode == 1
    assert f'Failed to get device plugin due to Get "https://127.0.0.1:{port}/api/v1/nodes/x"' in log
