"""Table tests for the plugin's settings, fake inventory, device-list cap, delivery answers and CDI files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from common.settings import SettingsError
from contract.env import expected_env
from contract.modes import Delivery
from deviceplugin import delivery
from deviceplugin.cdi import CdiStore, ensure_file
from deviceplugin.inventory import HEALTHY, UNHEALTHY, Gpu, Inventory, InventoryError, fake_gpus, load_inventory
from deviceplugin.settings import UNIX_PATH_MAX, settings_from
from deviceplugin.sockets import fresh_socket_path

BASE = {"GPUSHARE_NODE_NAME": "node-a"}


@pytest.mark.parametrize(
    ("env", "error"),
    [
        ({}, "GPUSHARE_NODE_NAME is not set"),
        ({**BASE, "GPUSHARE_PLACEMENT": "node"}, "GPUSHARE_PLACEMENT settings are inconsistent: node placement "
                                                 "needs cdi delivery"),
        ({**BASE, "GPUSHARE_PLACEMENT": "random"}, "placement 'random' is unknown; use one of extender, node"),
        ({**BASE, "GPUSHARE_RPC_TIMEOUT_SECONDS": "30"}, "GPUSHARE_RPC_TIMEOUT_SECONDS='30' is not valid"),
        ({**BASE, "GPUSHARE_RPC_TIMEOUT_SECONDS": "nan"}, "GPUSHARE_RPC_TIMEOUT_SECONDS"),
        ({**BASE, "GPUSHARE_MAX_DEVICES": "0"}, "GPUSHARE_MAX_DEVICES"),
        ({**BASE, "GPUSHARE_DELIVERY": "magic"}, "GPUSHARE_DELIVERY"),
        ({**BASE, "GPUSHARE_LOG_LEVEL": "loud"}, "GPUSHARE_LOG_LEVEL"),
    ],
)
def test_bad_settings_fail_with_the_variable_name(env: dict[str, str], error: str) -> None:
    with pytest.raises(SettingsError, match=error):
        settings_from(env)


def test_defaults() -> None:
    s = settings_from(BASE)
    assert s.socket_path("3f9a1c2e") == "/var/lib/kubelet/device-plugins/gpushare-aliyun-com-gpu-mem-3f9a1c2e.sock"
    assert s.socket_name("3f9a1c2e") == "gpushare-aliyun-com-gpu-mem-3f9a1c2e.sock"
    assert s.kubelet_socket == "/var/lib/kubelet/device-plugins/kubelet.sock"
    assert s.kubelet_checkpoint == "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    assert s.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert (s.cdi_dir, s.placement, s.contract.delivery, s.max_devices) == ("/var/run/cdi", "extender", "env", 4096)
    assert s.fake_gpu_dir == "/var/run/gpushare/fake-gpus"
    assert settings_from({**BASE, "GPUSHARE_FAKE_GPU_DIR": "/tmp/gpus"}).fake_gpu_dir == "/tmp/gpus"
    assert settings_from({**BASE, "GPUSHARE_DELIVERY": "cdi", "GPUSHARE_PLACEMENT": "node"}).placement == "node"


@pytest.mark.parametrize(
    ("name", "own"),
    [
        ("gpushare-aliyun-com-gpu-mem-3f9a1c2e.sock", True),
        ("gpushare-aliyun-com-gpu-mem.sock", True),  # the one fixed name of earlier versions
        ("gpushare-aliyun-com-gpu-mem-3F9A1C2E.sock", False),
        ("gpushare-aliyun-com-gpu-mem-3f9a1c2.sock", False),
        ("gpushare-aliyun-com-gpu-mem-3f9a1c2e.sock.tmp", False),
        ("gpushare-aliyun-com-gpu-mem-x-3f9a1c2e.sock", False),  # another resource's
        ("gpushare-aliyun-com-gpu-mem-x.sock", False),
        ("nvidia-gpu.sock", False),
        ("kubelet.sock", False),
        ("kubelet_internal_checkpoint", False),
    ],
)
def test_own_socket_names(name: str, own: bool) -> None:
    assert settings_from(BASE).is_own_socket(name) is own


@pytest.mark.parametrize(("directory_bytes", "accepted"), [(65, True), (66, False)])
def test_the_socket_path_is_checked_with_the_longest_token(directory_bytes: int, accepted: bool) -> None:
    """A directory of 65 bytes, a slash and `gpushare-aliyun-com-gpu-mem-<8 hex digits>.sock` make 107 bytes, what a
    unix socket address holds; the fixed name of earlier versions would have fitted a directory 9 bytes longer."""
    directory = "/" + "d" * (directory_bytes - 1)
    env = {**BASE, "GPUSHARE_DEVICE_PLUGIN_DIR": directory}
    if accepted:
        s = settings_from(env)
        assert len(os.fsencode(fresh_socket_path(s))) == UNIX_PATH_MAX == 107
    else:
        with pytest.raises(SettingsError, match="108 bytes long; a unix socket address holds at most 107"):
            settings_from(env)


@pytest.mark.parametrize(
    ("spec", "unit", "count", "memory"),
    [
        ("2x24GiB", "GiB", 2, 24),
        ("4x64GiB", "GiB", 4, 64),
        ("1x16384MiB", "GiB", 1, 16),
        ("1x24GiB", "MiB", 1, 24576),
        ("3x1500MiB", "MiB", 3, 1500),
    ],
)
def test_fake_gpus(spec: str, unit: str, count: int, memory: int) -> None:
    gpus = fake_gpus(spec, "node-a", unit)
    assert [g.index for g in gpus] == list(range(count))
    assert {g.memory_units for g in gpus} == {memory}
    assert gpus == fake_gpus(spec, "node-a", unit)  # deterministic for the node
    assert gpus[0].uuid != fake_gpus(spec, "node-b", unit)[0].uuid
    for gpu in gpus:
        ids = gpu.device_ids()
        assert len(ids) == memory and ids[0] == f"{gpu.uuid}-_-0"
        assert all(len(i) <= 63 for i in ids)


@pytest.mark.parametrize("spec", ["2x", "x24GiB", "2x24GB", "0x24GiB", "2x24", "two", "2x512MiB"])
def test_bad_fake_spec(spec: str) -> None:
    with pytest.raises(InventoryError, match="GPUSHARE_FAKE_GPUS"):
        fake_gpus(spec, "node-a", "GiB")


@pytest.mark.parametrize(
    ("spec", "unit", "cap", "ok"),
    [("4x64GiB", "GiB", 256, True), ("4x64GiB", "GiB", 255, False), ("2x24GiB", "MiB", 4096, False)],
)
def test_device_list_cap(spec: str, unit: str, cap: int, ok: bool) -> None:
    if ok:
        assert len(load_inventory(spec, "n", unit, cap).devices()) == cap
    else:
        with pytest.raises(InventoryError, match=f"more than GPUSHARE_MAX_DEVICES={cap}"):
            load_inventory(spec, "n", unit, cap)


def test_health_flip_changes_version_and_devices(inventory: Inventory) -> None:
    before = inventory.version
    inventory.set_health(1, False)
    assert inventory.version == before + 1
    health = dict(inventory.devices())
    assert {health[d] for d in inventory.gpus[1].device_ids()} == {UNHEALTHY}
    assert {health[d] for d in inventory.gpus[0].device_ids()} == {HEALTHY}
    inventory.set_health(1, False)  # no change, no new version
    assert inventory.version == before + 1
    assert inventory.wait_change(before, 0.01) == before + 1
    inventory.set_health(1, True)
    assert inventory.version == before + 2 and inventory.healthy(1)


def test_unknown_devices(inventory: Inventory) -> None:
    known = inventory.gpus[0].device_ids()[0]
    assert inventory.unknown([known, "no-gpu-has-8MiB-to-run"]) == ["no-gpu-has-8MiB-to-run"]
    assert inventory.gpu_of(known) == inventory.gpus[0]


# ---------------------------------------------------------------------------------------------------------
# Delivery.


@pytest.mark.parametrize(
    ("mode", "envs", "cdi"),
    [
        ("env", {"GPUSHARE_SLOT": "0123456789abcdef"}, ()),
        ("cdi", {"GPUSHARE_SLOT": "0123456789abcdef"}, ("gpushare.io/gpu=0123456789abcdef",)),
    ],
)
def test_allocate_delivery(mode: Delivery, envs: dict[str, str], cdi: tuple[str, ...]) -> None:
    answer = delivery.allocate_delivery("0123456789abcdef", mode)
    assert dict(answer.envs) == envs and answer.cdi_devices == cdi
    assert not set(answer.envs) & {"NVIDIA_VISIBLE_DEVICES", "ALIYUN_COM_GPU_MEM_IDX", "ALIYUN_COM_GPU_MEM_DEV",
                                   "ALIYUN_COM_GPU_MEM_CONTAINER", "ALIYUN_COM_GPU_MEM_POD"}


def test_cdi_spec_for_a_real_and_a_fake_gpu() -> None:
    real = Gpu(1, "GPU-1111", 80, minor=3)
    nodes = delivery.device_nodes(real, ["/dev/nvidiactl", "/dev/nvidia-uvm"])
    assert nodes == ["/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    spec = delivery.cdi_spec("abc", real, nodes, 4, 6)
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == "gpushare.io/gpu"
    (device,) = spec["devices"]
    assert device["name"] == "abc"
    assert device["containerEdits"]["deviceNodes"] == [{"path": p} for p in nodes]
    assert device["containerEdits"]["env"] == [
        "NVIDIA_VISIBLE_DEVICES=GPU-1111", "ALIYUN_COM_GPU_MEM_IDX=1", "ALIYUN_COM_GPU_MEM_DEV=80",
        "ALIYUN_COM_GPU_MEM_CONTAINER=4", "ALIYUN_COM_GPU_MEM_POD=6",
    ]
    assert "mounts" not in device["containerEdits"]  # a real GPU: device nodes only
    fake = Gpu(0, "GPU-0000", 8)
    assert delivery.device_nodes(fake, ["/dev/nvidiactl"]) == []
    assert delivery.fake_gpu_file(fake) == ("GPU-0000.txt", "index=0\nuuid=GPU-0000\n")
    edits = delivery.cdi_spec("abc", fake, [], 1, 1, gpu_file="/var/run/gpushare/fake-gpus/GPU-0000.txt")
    edits = edits["devices"][0]["containerEdits"]
    assert "deviceNodes" not in edits
    assert edits["mounts"] == [{"hostPath": "/var/run/gpushare/fake-gpus/GPU-0000.txt",
                                "containerPath": "/run/gpushare/gpu", "options": ["ro", "nosuid", "nodev", "bind"]}]


def _with_env(env: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": "main", "env": env}


def _without_api_version(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = json.loads(json.dumps(entries))
    for entry in out:
        if "valueFrom" in entry:
            del entry["valueFrom"]["fieldRef"]["apiVersion"]
    return out


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        (expected_env(4, 6), None),
        (_without_api_version(expected_env(4, 6)), None),  # the API server defaults apiVersion to v1
        ([{"name": "A", "value": "1"}, *expected_env(4, 6)], None),
        (expected_env(4, 6)[1:], "NVIDIA_VISIBLE_DEVICES is missing"),
        ([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, *expected_env(4, 6)[1:]],
         "NVIDIA_VISIBLE_DEVICES is not the webhook's definition"),
        (expected_env(3, 6), "ALIYUN_COM_GPU_MEM_CONTAINER is not the webhook's definition"),
        ([*expected_env(4, 6), expected_env(4, 6)[0]], "NVIDIA_VISIBLE_DEVICES is defined 2 times"),
        ([*expected_env(4, 6), {"name": "CUDA_VISIBLE_DEVICES", "value": "1"}], "CUDA_VISIBLE_DEVICES is set"),
        ([], "NVIDIA_VISIBLE_DEVICES is missing"),
    ],
)
def test_env_problems(env: list[dict[str, Any]], problem: str | None) -> None:
    problems = delivery.env_problems(_with_env(env), 4, 6)
    if problem is None:
        assert problems == []
    else:
        assert any(p.startswith(problem) for p in problems), problems


def test_cdi_store_writes_atomically_lists_and_removes(tmp_path: Path) -> None:
    store = CdiStore(str(tmp_path / "cdi"))
    assert store.slots() == {}
    path = store.write("0123456789abcdef", {"kind": "gpushare.io/gpu", "n": 1})
    store.write("0123456789abcdef", {"kind": "gpushare.io/gpu", "n": 2})
    (tmp_path / "cdi" / "other-vendor.json").write_text("{}")
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert store.read("0123456789abcdef") == {"kind": "gpushare.io/gpu", "n": 2}
    assert list(store.slots()) == ["0123456789abcdef"]
    assert sorted(os.listdir(tmp_path / "cdi")) == ["gpushare-0123456789abcdef.json", "other-vendor.json"]
    store.remove("0123456789abcdef")
    store.remove("0123456789abcdef")
    assert store.slots() == {} and store.read("0123456789abcdef") is None
    assert os.listdir(tmp_path / "cdi") == ["other-vendor.json"]


def test_a_fake_gpus_file_keeps_its_inode_while_its_text_is_right(tmp_path: Path) -> None:
    """A container starting on the GPU may be bind-mounting the file: one with the right text is never replaced
    (runc would mount the unlinked inode and refuse the start); wrong text is replaced, and no temp file stays."""
    path = str(tmp_path / "fake-gpus" / "GPU-0000.txt")
    assert ensure_file(path, "index=0\n") == path
    inode = os.stat(path).st_ino
    ensure_file(path, "index=0\n")
    assert os.stat(path).st_ino == inode and os.stat(path).st_mode & 0o777 == 0o644
    ensure_file(path, "index=1\n")
    assert Path(path).read_text() == "index=1\n" and os.stat(path).st_ino != inode
    assert os.listdir(tmp_path / "fake-gpus") == ["GPU-0000.txt"]
