"""Table tests for the plugin's settings, device IDs and their cap, and delivery answers."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from common.settings import SettingsError
from contract.env import expected_env
from contract.modes import Delivery
from deviceplugin import deliver, delivery
from deviceplugin.devices import HEALTHY, UNHEALTHY, UnitInventory, device_ids
from deviceplugin.settings import settings_from
from deviceplugin.sockets import fresh_socket_path
from node.inventory import InventoryError, fake_gpus, load_inventory
from node.settings import UNIX_PATH_MAX

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
    ("spec", "unit", "cap", "ok"),
    [("4x64GiB", "GiB", 256, True), ("4x64GiB", "GiB", 255, False), ("2x24GiB", "MiB", 4096, False)],
)
def test_device_list_cap(spec: str, unit: str, cap: int, ok: bool) -> None:
    if ok:
        assert len(UnitInventory.of(load_inventory(spec, "n", unit), cap).devices()) == cap
    else:
        with pytest.raises(InventoryError, match=f"more than GPUSHARE_MAX_DEVICES={cap}"):
            UnitInventory.of(load_inventory(spec, "n", unit), cap)


@pytest.mark.parametrize("spec", ["2x24GiB", "1x16384MiB"])
def test_device_ids_name_the_gpu_and_the_unit(spec: str) -> None:
    for gpu in fake_gpus(spec, "node-a", "GiB"):
        ids = device_ids(gpu)
        assert len(ids) == gpu.memory_units and ids[0] == f"{gpu.uuid}-_-0"
        assert all(len(i) <= 63 for i in ids)


def test_health_flip_changes_version_and_devices(inventory: UnitInventory) -> None:
    before = inventory.version
    inventory.set_health(1, False)
    assert inventory.version == before + 1
    health = dict(inventory.devices())
    assert {health[d] for d in device_ids(inventory.gpus[1])} == {UNHEALTHY}
    assert {health[d] for d in device_ids(inventory.gpus[0])} == {HEALTHY}
    inventory.set_health(1, False)  # no change, no new version
    assert inventory.version == before + 1
    assert inventory.wait_change(before, 0.01) == before + 1
    inventory.set_health(1, True)
    assert inventory.version == before + 2 and inventory.healthy(1)


def test_unknown_devices(inventory: UnitInventory) -> None:
    known = device_ids(inventory.gpus[0])[0]
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
    problems = deliver.env_problems(_with_env(env), 4, 6)
    if problem is None:
        assert problems == []
    else:
        assert any(p.startswith(problem) for p in problems), problems
