"""The slice keeper against an API server whose DRAConsumableCapacity gate is off (one error naming the gate, no
rewrite at every step, and the pool published with its capacity once the gate is on), and against writes it cannot
make (another writer's slice named as ours, a refused write): every other GPU is published all the same."""

from __future__ import annotations

import logging

import pytest

from dra.keeper import CAPACITY_RETRY_STEPS, SliceKeeper
from dra.slice import slice_prefix
from node.apiclient import Conflict
from node.inventory import Inventory
from tests.harness.dra.claims import GPUS, NODE
from tests.harness.dra.fakes import FakeDraApi

DEVICES = ["gpu-0", "gpu-1"]


def _keeper(api: FakeDraApi) -> SliceKeeper:
    return SliceKeeper(api, NODE, Inventory(GPUS, "GiB"), "GiB", interval=10)


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "dra.keeper"]


def _device(api: FakeDraApi, name: str) -> dict[str, object]:
    [device] = api.by_device()[name]["spec"]["devices"]
    return device  # type: ignore[no-any-return]


def test_a_gate_that_is_off_is_one_error_naming_it_and_no_rewrite_loop(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra.keeper")
    api = FakeDraApi()
    api.consumable_capacity = False
    keeper = _keeper(api)
    assert keeper.step()
    assert keeper.capacity_dropped and sorted(api.by_device()) == DEVICES
    assert "allowMultipleAllocations" not in _device(api, DEVICES[0])
    assert _device(api, DEVICES[0])["capacity"] == {"memory": {"value": "16Gi"}}, "the value is kept, not the policy"
    [(level, line)] = _lines(caplog)
    assert level == logging.ERROR
    assert line == (
        f"The API server dropped allowMultipleAllocations and the memory capacity's requestPolicy from the "
        f"ResourceSlices of node {NODE}: its DRAConsumableCapacity feature gate is off (alpha and off by default in "
        "Kubernetes 1.35, on by default from 1.36). The slices are published without them, so the scheduler gives "
        "each claim a whole GPU and this driver refuses to prepare it. Turn the gate on with "
        "--feature-gates=DRAConsumableCapacity=true on kube-apiserver, kube-scheduler and kube-controller-manager; "
        "the driver writes the slices again every 300 s and says when they are kept."
    )
    # The pool as stored counts as current: no write at every step, and nothing more to say.
    writes = api.slice_writes
    assert not any(keeper.step() for _ in range(CAPACITY_RETRY_STEPS - 1))
    assert api.slice_writes == writes
    # Every CAPACITY_RETRY_STEPS steps it writes again, to find out whether the gate is on; still off: quiet.
    assert keeper.step() and api.slice_writes == writes + 2 and keeper.capacity_dropped
    assert len(_lines(caplog)) == 1
    # A missing slice is written at once, as always.
    del api.slices[api.by_device()[DEVICES[1]]["metadata"]["name"]]
    assert keeper.step() and sorted(api.by_device()) == DEVICES
    assert len(_lines(caplog)) == 1


def test_the_pool_gets_its_capacity_once_the_gate_is_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra.keeper")
    api = FakeDraApi()
    api.consumable_capacity = False
    keeper = _keeper(api)
    keeper.step()
    api.consumable_capacity = True  # the API server restarted with --feature-gates=DRAConsumableCapacity=true
    steps = [keeper.step() for _ in range(CAPACITY_RETRY_STEPS)]
    assert steps == [False] * (CAPACITY_RETRY_STEPS - 1) + [True]
    assert not keeper.capacity_dropped
    assert all(_device(api, name)["allowMultipleAllocations"] is True for name in DEVICES)
    assert not keeper.step(), "current at last"
    assert _lines(caplog)[1:] == [(
        logging.INFO, f"The API server now keeps the consumable capacity of the ResourceSlices of node {NODE} "
        "(DRAConsumableCapacity is on); published 2, deleted 0: claims get shares of their GPU's memory.",
    )]


def test_an_api_server_with_the_gate_on_is_never_told_about_it(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeDraApi()
    keeper = _keeper(api)
    assert keeper.step() and not keeper.step()
    assert not keeper.capacity_dropped
    assert not any(level >= logging.WARNING for level, _ in _lines(caplog))
    assert "DRAConsumableCapacity" not in caplog.text


def _squatter(name: str) -> dict[str, object]:
    """A slice another identity created under a name this node's slices once had: another node, another driver."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name, "resourceVersion": "1"},
            "spec": {"driver": "squatter.example.com", "nodeName": "node-b",
                     "pool": {"name": "node-b", "generation": 1, "resourceSliceCount": 1}, "devices": []}}


def test_a_slice_named_as_ours_keeps_no_gpu_of_this_node_unpublished() -> None:
    """Slice names are predictable and another node's driver token may create slices; a slice holding the name a
    slice of ours would have must not keep this node's pool off the API server: the API server names our slices."""
    api = FakeDraApi()
    taken = {name: _squatter(name) for name in (slice_prefix(NODE, 0).rstrip("-"), slice_prefix(NODE, 0) + "00000")}
    api.slices.update(taken)
    keeper = _keeper(api)
    assert keeper.step() and keeper.failures == 0
    assert sorted(api.by_device()) == DEVICES
    assert {name: api.slices[name] for name in taken} == taken, "another identity's slice is left alone"
    assert all(s["metadata"]["name"].startswith(slice_prefix(NODE, int(d[-1]))) for d, s in api.by_device().items())
    assert not keeper.step(), "current"


def test_one_refused_write_does_not_keep_the_other_gpus_unpublished(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra.keeper")
    api = FakeDraApi()
    refusal = f"could not create ResourceSlice {slice_prefix(NODE, 0)}<generated>: it changed meanwhile (409 Conflict)"
    api.refused["gpu-0"] = Conflict(refusal)
    keeper = _keeper(api)
    assert keeper.step() and keeper.step()
    assert sorted(api.by_device()) == ["gpu-1"] and keeper.failures == 2
    assert _lines(caplog) == [(
        logging.WARNING, f"Could not make 1 of the 2 changes to the ResourceSlices of node {NODE} ({refusal}); the "
        "others were made. The scheduler allocates no claim to a GPU whose slice is missing, and none from a pool "
        "while its slices disagree. Trying again every 10 s (GPUSHARE_DRA_RESYNC_SECONDS); check the driver's API "
        f"server access and the ResourceSlices of node {NODE}.",
    )], "once while it lasts"
    del api.refused["gpu-0"]
    assert keeper.step() and sorted(api.by_device()) == DEVICES
    assert {s["spec"]["pool"]["generation"] for s in api.by_device().values()} == {3}
    assert _lines(caplog)[1:] == [
        (logging.INFO, f"The ResourceSlices of node {NODE} differed from this node's GPUs; published 2, deleted 0.")]
    assert not keeper.step()


def test_slices_are_owned_by_the_node_and_written_only_when_they_change() -> None:
    api = FakeDraApi()
    keeper = _keeper(api)
    assert keeper.step()
    for slice_ in api.by_device().values():
        assert slice_["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-1", "controller": True}]
    writes = api.slice_writes
    assert not any(keeper.step() for _ in range(5)), "what the API server holds is what the node's GPUs make"
    assert api.slice_writes == writes and api.node_reads == 6


def test_a_node_deleted_and_registered_again_gets_its_slices_back_with_its_new_uid(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra.keeper")
    api = FakeDraApi()
    keeper = _keeper(api)
    keeper.step()
    api.delete_node(NODE)
    assert api.slices == {}, "the garbage collector deleted the Node's slices"
    assert not keeper.step() and not keeper.step() and not keeper.published
    assert api.slices == {}, "nothing is published for a Node that does not exist"
    assert _lines(caplog)[-1] == (logging.WARNING, (
        f"Node {NODE} does not exist in the API server (it was deleted, and its kubelet has not registered it "
        "again): its ResourceSlices are owned by the Node and would be garbage-collected, so none is published. "
        "Trying again every 10 s; the slices are published once the Node is back."))
    api.nodes[NODE] = "node-uid-2"  # the kubelet registered the node again
    assert keeper.step() and keeper.published
    assert {s["metadata"]["ownerReferences"][0]["uid"] for s in api.by_device().values()} == {"node-uid-2"}


def test_slices_owned_by_an_earlier_node_uid_are_written_again() -> None:
    api = FakeDraApi()
    keeper = _keeper(api)
    keeper.step()
    api.nodes[NODE] = "node-uid-2"  # deleted and registered again before the garbage collector came by
    assert keeper.step()
    assert {s["metadata"]["ownerReferences"][0]["uid"] for s in api.by_device().values()} == {"node-uid-2"}
    assert not keeper.step()


def test_a_gate_that_is_off_is_one_warning_event_on_the_node() -> None:
    api = FakeDraApi()
    api.consumable_capacity = False
    keeper = _keeper(api)
    keeper.step()
    for _ in range(2 * CAPACITY_RETRY_STEPS):
        keeper.step()
    assert api.slice_writes == 3 * len(DEVICES), "written at the start and once every CAPACITY_RETRY_STEPS steps"
    [event] = api.events
    assert event["type"] == "Warning" and event["reason"] == "DRAConsumableCapacityOff"
    assert event["metadata"] == {"generateName": f"{NODE}.", "namespace": "default"}
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-1"}
    assert event["message"] == (
        f"The API server dropped allowMultipleAllocations and capacity.memory.requestPolicy from the gpushare.io "
        f"ResourceSlices of node {NODE}: its DRAConsumableCapacity feature gate is off, so each claim would get a "
        "whole GPU. Turn it on with --feature-gates=DRAConsumableCapacity=true on kube-apiserver, kube-scheduler "
        "and kube-controller-manager.")


def test_an_event_that_cannot_be_created_is_tried_at_the_next_write(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra.keeper")
    api = FakeDraApi()
    api.consumable_capacity = False
    api.event_failure = Conflict("could not create an Event in namespace default: HTTP 403 Forbidden")
    keeper = _keeper(api)
    keeper.step()
    assert not api.events and not keeper.event_recorded
    assert (logging.WARNING, "Could not record the DRAConsumableCapacityOff Event of node node-a: could not create "
            "an Event in namespace default: HTTP 403 Forbidden; the driver's log says the same.") in _lines(caplog)
    api.event_failure = None
    for _ in range(CAPACITY_RETRY_STEPS):
        keeper.step()
    assert len(api.events) == 1 and keeper.event_recorded
