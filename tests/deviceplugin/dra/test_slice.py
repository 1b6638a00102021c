from __future__ import annotations

from typing import Any

import pytest

from contract.keys import DRA_DRIVER
from contract.modes import Unit
from deviceplugin.dra.slice import gpu_index, inventory_slice, resource_slice, slice_name, slice_update
from deviceplugin.inventory import Gpu, Inventory
from tests.harness.dra.claims import GPUS, NODE


def _device(name: str, index: int, uuid: str, value: str, one: str) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"index": {"int": index}, "uuid": {"string": uuid}},
        "capacity": {"memory": {"value": value, "requestPolicy": {"default": one, "validRange": {"min": one,
                                                                                                   "step": one}}}},
        "allowMultipleAllocations": True,
    }


@pytest.mark.parametrize(("unit", "memory", "value", "one"), [("GiB", 16, "16Gi", "1Gi"), ("MiB", 16384, "16384Mi",
                                                                                             "1Mi")])
def test_slice_has_one_device_per_gpu_with_memory_capacity(unit: Unit, memory: int, value: str, one: str) -> None:
    gpus = [Gpu(0, "GPU-a", memory, minor=0), Gpu(1, "GPU-b", memory)]
    assert resource_slice(NODE, gpus, set(), unit, generation=3) == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-{DRA_DRIVER}"},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 3, "resourceSliceCount": 1},
            "devices": [_device("gpu-0", 0, "GPU-a", value, one), _device("gpu-1", 1, "GPU-b", value, one)],
        },
    }


def test_unhealthy_gpu_is_left_out() -> None:
    inventory = Inventory(GPUS, "GiB", 4096)
    inventory.set_health(0, False)
    devices = inventory_slice(NODE, inventory, "GiB")["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-1"]


@pytest.mark.parametrize(
    ("node", "name"),
    [("node-a", "node-a-gpushare.io"), ("Node_A", "node-a-gpushare.io"), ("x" * 300, "x" * 253)],
)
def test_slice_name_is_a_dns_subdomain(node: str, name: str) -> None:
    assert slice_name(node) == name


@pytest.mark.parametrize(("name", "index"), [("gpu-0", 0), ("gpu-12", 12), ("gpu-01", None), ("gpu-", None),
                                             ("cpu-0", None), ("gpu-x", None)])
def test_gpu_index_of_device_name(name: str, index: int | None) -> None:
    assert gpu_index(name) == index


def test_slice_update_creates_then_leaves_alone_then_bumps_generation() -> None:
    wanted = resource_slice(NODE, GPUS, set(), "MiB")
    assert slice_update(None, wanted) == wanted
    # The API server writes quantities back in its own canonical form: 16384Ki is the same amount as 16Mi.
    stored = {**wanted, "metadata": {**wanted["metadata"], "resourceVersion": "7"}}
    stored["spec"] = {**wanted["spec"], "pool": {**wanted["spec"]["pool"], "generation": 4},
                      "devices": [{**d, "capacity": {"memory": {**d["capacity"]["memory"], "value": "16384Ki"}}}
                                  for d in wanted["spec"]["devices"]]}
    assert slice_update(stored, wanted) is None
    fewer = resource_slice(NODE, GPUS, {1}, "MiB")
    update = slice_update(stored, fewer)
    assert update is not None
    assert update["spec"]["pool"]["generation"] == 5
    assert update["metadata"]["resourceVersion"] == "7"
    assert update["spec"]["devices"] == fewer["spec"]["devices"]
