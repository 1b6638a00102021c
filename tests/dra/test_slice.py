from __future__ import annotations

from typing import Any

import pytest

from contract.dra import gpu_index
from contract.keys import DRA_DRIVER
from contract.modes import Unit
from dra.slice import (
    capacity_dropped,
    inventory_slices,
    node_owner,
    pool_plan,
    pool_slices,
    slice_prefix,
    without_consumable_capacity,
)
from node.inventory import Gpu, Inventory
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
def test_one_slice_per_gpu_with_its_memory_capacity(unit: Unit, memory: int, value: str, one: str) -> None:
    gpus = [Gpu(0, "GPU-a", memory, minor=0), Gpu(1, "GPU-b", memory)]
    assert pool_slices(NODE, gpus, set(), unit, generation=3) == [{
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{NODE}-{DRA_DRIVER}-gpu-{index}-"},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 3, "resourceSliceCount": 2},
            "devices": [_device(f"gpu-{index}", index, uuid, value, one)],
        },
    } for index, uuid in ((0, "GPU-a"), (1, "GPU-b"))]


def test_unhealthy_gpu_is_left_out() -> None:
    inventory = Inventory(GPUS, "GiB")
    inventory.set_health(0, False)
    slices = inventory_slices(NODE, inventory, "GiB")
    assert [d["name"] for s in slices for d in s["spec"]["devices"]] == ["gpu-1"]
    assert [s["spec"]["pool"]["resourceSliceCount"] for s in slices] == [1]


@pytest.mark.parametrize(
    ("node", "name"),
    [("node-a", "node-a-gpushare.io-gpu-3-"), ("Node_A", "node-a-gpushare.io-gpu-3-"),
     ("x" * 300, "x" * 240 + "-gpu-3-")],
)
def test_slice_prefix_is_a_dns_subdomain_prefix(node: str, name: str) -> None:
    assert slice_prefix(node, 3) == name


@pytest.mark.parametrize(("name", "index"), [("gpu-0", 0), ("gpu-12", 12), ("gpu-01", None), ("gpu-", None),
                                             ("cpu-0", None), ("gpu-x", None)])
def test_gpu_index_of_device_name(name: str, index: int | None) -> None:
    assert gpu_index(name) == index


def _stored(slices: list[dict[str, Any]], generation: int) -> list[dict[str, Any]]:
    """As the API server holds them: a generated name and a resourceVersion each, quantities in its canonical form
    (16384Ki = 16Mi)."""
    return [{**s, "metadata": {"name": s["metadata"]["generateName"] + "x7k2q", "resourceVersion": str(n)},
             "spec": {**s["spec"], "pool": {**s["spec"]["pool"], "generation": generation},
                      "devices": [{**d, "capacity": {"memory": {**d["capacity"]["memory"], "value": "16384Ki"}}}
                                  for d in s["spec"]["devices"]]}} for n, s in enumerate(slices, 7)]


def test_pool_plan_creates_then_leaves_alone_then_moves_every_slice_to_the_next_generation() -> None:
    wanted = pool_slices(NODE, GPUS, set(), "MiB")
    assert pool_plan([], wanted) == (wanted, [])
    stored = _stored(wanted, 4)
    assert pool_plan(stored, wanted) == ([], [])
    fewer = pool_slices(NODE, GPUS, {1}, "MiB")
    writes, deletes = pool_plan(stored, fewer)
    assert deletes == [stored[1]["metadata"]["name"]]
    assert [(w["metadata"]["name"], w["metadata"]["resourceVersion"], w["spec"]["pool"]) for w in writes] == [
        (stored[0]["metadata"]["name"], "7", {"name": NODE, "generation": 5, "resourceSliceCount": 1})]


def test_pool_plan_rewrites_a_pool_whose_slices_disagree() -> None:
    """One slice missing (the rest at the old generation are ignored by consumers once a newer one exists), or
    slices at two generations: every slice is written again at one new generation."""
    wanted = pool_slices(NODE, GPUS, set(), "GiB")
    stored = _stored(wanted, 2)
    writes, _ = pool_plan(stored[1:], wanted)
    assert [w["spec"]["pool"]["generation"] for w in writes] == [3, 3]
    assert [w["metadata"].get("resourceVersion") for w in writes] == [None, "8"]
    mixed = [stored[0], {**stored[1], "spec": {**stored[1]["spec"], "pool": {**stored[1]["spec"]["pool"],
                                                                           "generation": 5}}}]
    writes, _ = pool_plan(mixed, wanted)
    assert [w["spec"]["pool"]["generation"] for w in writes] == [6, 6]


def _gate_off(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """As an API server with DRAConsumableCapacity off stores them."""
    return [{**s, "spec": {**s["spec"], "devices": [without_consumable_capacity(d) for d in s["spec"]["devices"]]}}
            for s in slices]


def test_without_consumable_capacity_keeps_the_capacity_value_alone() -> None:
    [device] = pool_slices(NODE, GPUS[:1], set(), "GiB")[0]["spec"]["devices"]
    assert without_consumable_capacity(device) == {
        "name": "gpu-0", "attributes": device["attributes"], "capacity": {"memory": {"value": "16Gi"}}}


@pytest.mark.parametrize(
    ("stored", "dropped"),
    [
        ("as written", False),
        ("gate off", True),
        ("policy dropped", True),
        ("no answer", False),  # deleted meanwhile: nothing to tell from
        ("other device", False),
    ],
)
def test_capacity_dropped_reads_the_write_answer(stored: str, dropped: bool) -> None:
    [written] = pool_slices(NODE, GPUS[:1], set(), "GiB")
    [device] = written["spec"]["devices"]
    devices = {
        "as written": [device],
        "gate off": [without_consumable_capacity(device)],
        "policy dropped": [{**device, "capacity": {"memory": {"value": "16Gi"}}}],
        "other device": [without_consumable_capacity({**device, "name": "gpu-9"})],
    }
    answer = None if stored == "no answer" else {**written, "spec": {**written["spec"], "devices": devices[stored]}}
    assert capacity_dropped(written, answer) is dropped


def test_pool_plan_leaves_a_pool_stored_without_the_gate_alone_only_when_told() -> None:
    wanted = pool_slices(NODE, GPUS, set(), "MiB")
    stored = _gate_off(_stored(wanted, 3))
    writes, _ = pool_plan(stored, wanted)
    assert [w["spec"]["pool"]["generation"] for w in writes] == [4, 4], "the fields are missing: write them"
    assert pool_plan(stored, wanted, consumable_capacity=False) == ([], [])
    # Anything else that differs is still written, with the fields (the API server may keep them now).
    writes, deletes = pool_plan(stored, pool_slices(NODE, GPUS, {1}, "MiB"), consumable_capacity=False)
    assert deletes == [stored[1]["metadata"]["name"]]
    assert [w["spec"]["devices"][0]["allowMultipleAllocations"] for w in writes] == [True]


def _holding(stored: dict[str, Any], name: str, *devices: dict[str, Any]) -> dict[str, Any]:
    return {**stored, "metadata": {**stored["metadata"], "name": name},
            "spec": {**stored["spec"], "devices": list(devices)}}


def test_pool_plan_finds_each_slice_by_its_device_whatever_its_name() -> None:
    """The API server names the slices, and slices of an earlier version have fixed names: a stored slice stands for
    the wanted one holding the same device, and is replaced, not created again beside it."""
    wanted = pool_slices(NODE, GPUS, set(), "MiB")
    stored = _stored(wanted, 4)
    renamed = [_holding(s, f"{NODE}-{DRA_DRIVER}-gpu-{i}", *s["spec"]["devices"]) for i, s in enumerate(stored)]
    assert pool_plan(renamed, wanted) == ([], [])
    writes, deletes = pool_plan(renamed[::-1], pool_slices(NODE, GPUS, set(), "GiB"))
    assert deletes == [] and [w["metadata"] for w in writes] == [
        {"name": f"{NODE}-{DRA_DRIVER}-gpu-0", "resourceVersion": "7"},
        {"name": f"{NODE}-{DRA_DRIVER}-gpu-1", "resourceVersion": "8"}]


def test_pool_plan_keeps_one_slice_per_device_and_deletes_the_others() -> None:
    """Two writers that created one GPU's slice at once agree on the one that stands (the first by name); a slice
    holding no device, or two, is deleted, and the device it held gets a slice of its own."""
    wanted = pool_slices(NODE, GPUS, set(), "MiB")
    first, second = _stored(wanted, 4)
    twin = _holding(first, "a-twin", *first["spec"]["devices"])
    writes, deletes = pool_plan([first, twin, second], wanted)
    assert deletes == [first["metadata"]["name"]]
    assert [w["metadata"].get("name") for w in writes] == ["a-twin", second["metadata"]["name"]]
    both = _holding(first, "both", *first["spec"]["devices"], *second["spec"]["devices"])
    writes, deletes = pool_plan([both, _holding(second, "none")], wanted)
    assert deletes == ["both", "none"]
    assert [w["metadata"] for w in writes] == [s["metadata"] for s in wanted], "each created again by generateName"


def test_pool_plan_gives_stored_slices_the_nodes_ownership_and_compares_it() -> None:
    owned = pool_slices(NODE, GPUS, set(), "MiB", node_uid="uid-1")
    assert all(s["metadata"]["ownerReferences"] == node_owner(NODE, "uid-1") for s in owned)
    stored = _stored(pool_slices(NODE, GPUS, set(), "MiB"), 4)
    writes, deletes = pool_plan(stored, owned)
    assert not deletes
    assert [w["metadata"] for w in writes] == [
        {"name": s["metadata"]["name"], "resourceVersion": s["metadata"]["resourceVersion"],
         "ownerReferences": node_owner(NODE, "uid-1")} for s in stored]
    # As the API server answers: blockOwnerDeletion added does not make it differ.
    answered = [{**s, "metadata": {**s["metadata"], "ownerReferences": [
        {**node_owner(NODE, "uid-1")[0], "blockOwnerDeletion": False}]}} for s in _stored(owned, 5)]
    assert pool_plan(answered, owned) == ([], [])
    writes, _ = pool_plan(answered, pool_slices(NODE, GPUS, set(), "MiB", node_uid="uid-2"))
    assert {w["metadata"]["ownerReferences"][0]["uid"] for w in writes} == {"uid-2"}
