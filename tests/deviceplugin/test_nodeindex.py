"""The node index fed by the watch, PodResources Get for one pod, and Events posted off the kubelet's critical path."""

from __future__ import annotations

import copy
import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract import ASSIGNED, Allocation, ContainerSlot, Contract, signing
from deviceplugin.devices import UnitInventory, slot_of
from deviceplugin.errors import Refusal
from deviceplugin.eventqueue import EventQueue
from deviceplugin.nodeindex import NodeIndex
from deviceplugin.pins import Pin
from deviceplugin.trust import Context
from deviceplugin.usage import Holder, node_usage
from tests.harness.plugin.fakes import NODE
from tests.harness.plugin.rig import Rig
from tests.harness.pods import admitted, assigned, unit_pod

pytestmark = pytest.mark.timeout(60)


def ctx_for(inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract) -> Context:
    return Context(contract, NODE, signer.public_key(), {g.index: g for g in inventory.gpus}, inventory.healthy)


def on_node(pod: dict[str, Any], uid: str, version: str = "1", phase: str = "Pending") -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["spec"]["nodeName"] = NODE
    out["metadata"].update(uid=uid, resourceVersion=version)
    out["status"] = {"phase": phase}
    return out


def gpu_pod(name: str, units: int, index: int | None, contract: Contract, signer: Ed25519PrivateKey,
            uid: str = "") -> dict[str, Any]:
    pod = admitted(unit_pod(name, {"main": units}), contract, signer)
    if index is not None:
        pod = assigned(pod, index, 8)
    return on_node(pod, uid or f"uid-{name}")


def recorded(pod: dict[str, Any], inventory: UnitInventory, contract: Contract, slot: str) -> dict[str, Any]:
    """The pod with the plugin's allocation record (GPU 0, container main holding `slot`)."""
    out = copy.deepcopy(pod)
    annotations = out["metadata"]["annotations"]
    intent_id = json.loads(annotations[contract.intent_key])["allocationId"]
    gpu = inventory.gpus[0]
    record = Allocation(intent_id, NODE, 0, gpu.uuid, {"main": ContainerSlot(2, slot)})
    annotations[contract.allocation_key] = record.to_json()
    annotations[ASSIGNED] = "true"
    out["metadata"]["resourceVersion"] = "2"
    return out


def usage(index: NodeIndex, gpu: int, exclude: str = "") -> tuple[int, list[Holder]]:
    """What the judge asks of the index: the kept unit total, and who holds them (to word a refusal)."""
    return index.units_on(gpu, exclude), index.holders_on(gpu, exclude)


def shown(usage: tuple[int, list[Holder]]) -> tuple[int, list[str]]:
    return usage[0], [str(h) for h in usage[1]]


def test_the_index_answers_as_the_pod_list_does(inventory: UnitInventory, signer: Ed25519PrivateKey,
                                               contract: Contract) -> None:
    ctx = ctx_for(inventory, signer, contract)
    index = NodeIndex(ctx)
    assert not index.synced
    pods = [gpu_pod("a", 2, 0, contract, signer), gpu_pod("b", 3, 0, contract, signer),
            gpu_pod("c", 1, 1, contract, signer), gpu_pod("unplaced", 5, None, contract, signer),
            on_node(unit_pod("plain", {"main": 0}), "uid-plain")]
    forged = gpu_pod("forged", 4, 1, contract, signer)
    forged["metadata"]["annotations"][contract.signature_key] = "AAAA"
    index.replace([*pods, forged])
    assert index.synced
    for gpu in (0, 1):
        for exclude in ("", "uid-a"):
            assert usage(index, gpu, exclude) == node_usage([*pods, forged], ctx, exclude).on(gpu)
            assert index.units_on(gpu, exclude) == sum(h.units for h in index.holders_on(gpu, exclude))  # kept sum
    assert shown(usage(index, 0)) == (5, ["team/a (2)", "team/b (3)"])
    assert [index.suspects.waiting(units, "s") for units in (1, 2, 3, 4, 5, 6)] == [True, True, True, False, False,
                                                                                  False]
    assert "uid-b" in index and "uid-gone" not in index
    assert index.suspects.likely(2, "s", 4) == [("team", "a", "uid-a")]


def test_the_index_follows_changes_deletions_pins_and_a_broken_watch(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract,
) -> None:
    ctx = ctx_for(inventory, signer, contract)
    index = NodeIndex(ctx)
    a = gpu_pod("a", 2, 0, contract, signer)
    index.replace([a])
    slot = slot_of(["d1", "d2"])
    index.upsert(recorded(a, inventory, contract, slot))  # allocated: its container holds the slot now
    assert not index.suspects.waiting(2, "other") and index.suspects.waiting(2, slot)
    assert index.suspects.likely(2, slot, 4) == [("team", "a", "uid-a")]
    index.pin("uid-a", Pin(1, inventory.gpus[1].uuid))  # a pinned pod counts where it runs, whatever its IDX says
    assert (shown(usage(index, 0)), shown(usage(index, 1))) == ((0, []), (2, ["team/a (2)"]))
    assert (index.units_on(0), index.units_on(1), index.units_on(1, "uid-a")) == (0, 2, 0)
    index.pin("uid-a", Pin(0, inventory.gpus[0].uuid))  # a pin once held stays
    assert (index.units_on(0), index.units_on(1)) == (0, 2)
    index.upsert(on_node(a, "uid-a", "3", phase="Succeeded"))  # a finished pod holds nothing
    assert usage(index, 1) == (0, []) and index.units_on(1) == 0
    index.remove("uid-a")
    assert "uid-a" not in index and not index.suspects.waiting(2, slot)
    index.stale()
    assert not index.synced
    index.replace([])
    assert index.synced


def test_recording_an_allocation_pins_the_pod_and_counts_it_once(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract,
) -> None:
    """PreStartContainer's record: a pod counted on its GPU already is not counted again; one the index did not count
    yet (placed by the plugin after the watch delivered it) counts its verified intent where it is pinned; a pod of
    the previous device plugin (no intent) is only pinned."""
    ctx = ctx_for(inventory, signer, contract)
    index = NodeIndex(ctx)
    placed, unplaced = gpu_pod("a", 2, 0, contract, signer), gpu_pod("b", 3, None, contract, signer)
    index.replace([placed, unplaced])
    assert shown(usage(index, 0)) == (2, ["team/a (2)"]) and shown(usage(index, 1)) == (0, [])
    intent = ctx.verdicts.intent(placed, ctx)
    assert not isinstance(intent, Refusal)
    index.record("uid-a", Pin(0, inventory.gpus[0].uuid), intent)
    assert shown(usage(index, 0)) == (2, ["team/a (2)"]) and ctx.pins.get("uid-a") == Pin(0, inventory.gpus[0].uuid)
    intent = ctx.verdicts.intent(unplaced, ctx)
    assert not isinstance(intent, Refusal)
    index.record("uid-b", Pin(1, inventory.gpus[1].uuid), intent)
    assert shown(usage(index, 1)) == (3, ["team/b (3)"]) and index.units_on(1) == 3
    index.record("uid-gone", Pin(1, inventory.gpus[1].uuid), None)
    assert ctx.pins.get("uid-gone") is not None and index.units_on(1) == 3


def deleted(pod: dict[str, Any], version: str, state: str | None) -> dict[str, Any]:
    """A later version of the pod: deleted, its container `main` in `state` (None: no status yet)."""
    out = copy.deepcopy(pod)
    out["metadata"].update(resourceVersion=version, deletionTimestamp="2026-01-02T03:04:05Z")
    if state is not None:
        out["status"] = {"phase": "Running", "containerStatuses": [{"name": "main", "state": {state: {}}}]}
    return out


def test_a_deletion_and_each_container_state_count_the_pod_again(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract,
) -> None:
    ctx = ctx_for(inventory, signer, contract)
    index = NodeIndex(ctx)
    running, pulling = gpu_pod("running", 3, 0, contract, signer), gpu_pod("pulling", 4, 0, contract, signer)
    index.replace([running, pulling])
    assert shown(usage(index, 0)) == (7, ["team/running (3)", "team/pulling (4)"])
    index.upsert(deleted(pulling, "2", None))  # deleted while its image pulls: the extender gave its room away
    index.upsert(deleted(running, "2", "running"))  # deleted while it runs: it holds its room until it stops
    used, holders = usage(index, 0)
    assert (used, [(str(h), h.leaving) for h in holders]) == (3, [("team/running (3)", True)])
    index.upsert(deleted(running, "3", "terminated"))
    assert usage(index, 0) == (0, [])
    index.upsert(deleted(running, "3", "running"))  # the same version again (a relist): not counted again
    assert usage(index, 0) == (0, [])


def test_a_pod_version_is_verified_once(inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = ctx_for(inventory, signer, contract)
    index = NodeIndex(ctx)
    calls = []
    original = signing.verify

    def counting(*args: Any) -> bool:
        calls.append(1)
        return bool(original(*args))

    monkeypatch.setattr(signing, "verify", counting)
    pods = [gpu_pod(f"p{n}", 1, 0, contract, signer) for n in range(5)]
    index.replace(pods)
    index.replace(pods)  # the watch relisting: the same versions
    for _ in range(10):
        index.suspects.waiting(1, "s")
        usage(index, 0)
    assert len(calls) == 5


def test_allocate_asks_no_api_server_when_the_watch_has_the_pod(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("p", {"main": 2})
    listed = []
    original = rig.api.list_node_pods

    def counting() -> list[dict[str, Any]]:
        listed.append(1)
        return original()

    rig.api.node_pods = rig.api.list_node_pods = counting  # type: ignore[method-assign]
    rig.kubelet.admit("team", "p", [("main", 2)])
    rig.kubelet.start_container("team", "p", "main")
    assert listed == []
    assert rig.api.pod("team", "p")["metadata"]["annotations"][ASSIGNED] == "true"


def test_prestart_asks_the_kubelet_for_one_pod_where_get_exists(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.kubelet.get_enabled = True
    for name in ("p", "q"):
        rig.pod(name, {"main": 2})
        rig.kubelet.admit("team", name, [("main", 2)])
    rig.kubelet.list_calls = 0
    rig.kubelet.start_container("team", "q", "main")
    rig.kubelet.start_container("team", "q", "main")  # a restart: its record names the slot
    assert rig.kubelet.list_calls == 0 and rig.kubelet.get_calls >= 2
    assert rig.api.pod("team", "q")["metadata"]["annotations"][ASSIGNED] == "true"


def test_prestart_lists_where_get_is_disabled_and_stops_asking(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("p", {"main": 2})
    rig.kubelet.admit("team", "p", [("main", 2)])
    rig.kubelet.list_calls = 0
    rig.kubelet.start_container("team", "p", "main")
    rig.kubelet.start_container("team", "p", "main")
    assert (rig.kubelet.get_calls, rig.kubelet.list_calls) == (1, 2)
    assert rig.api.pod("team", "p")["metadata"]["annotations"][ASSIGNED] == "true"


def test_prestart_answers_while_the_event_is_still_being_posted(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("p", {"main": 2})
    rig.kubelet.admit("team", "p", [("main", 2)])
    release = threading.Event()
    original = rig.api.create_event

    def slow(pod: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        release.wait(10)
        original(pod, event_type, reason, message)

    rig.api.create_event = slow  # type: ignore[method-assign]
    try:
        rig.kubelet.start_container("team", "p", "main")  # answered although the Event is held
        assert rig.api._posted == []
    finally:
        release.set()
    assert [e[2] for e in rig.api.events] == ["GpuShareAllocated"]


def test_a_full_event_queue_drops_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    started, release = threading.Event(), threading.Event()
    sent: list[str] = []

    def send(pod: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        started.set()
        release.wait(10)
        sent.append(reason)

    queue = EventQueue(send, size=2)
    pod = {"metadata": {"namespace": "team", "name": "p"}}
    with caplog.at_level(logging.WARNING, logger="deviceplugin.eventqueue"):
        queue.post(pod, "Normal", "R0", "m")
        assert started.wait(5)
        for n in range(1, 5):
            queue.post(pod, "Normal", f"R{n}", "m")
    release.set()
    assert queue.flush(5)
    queue.close()
    assert sent == ["R0", "R1", "R2"]  # one being sent, two queued, two dropped
    assert "the Event R4 on pod team/p was dropped because 2 Events are waiting" in caplog.text
