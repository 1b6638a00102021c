"""Table tests for the pure judgement of the owning pod (its refusals), best fit and candidates."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract import ASSIGNED, DEV, IDX, POD, Contract, parse_allocation, signing
from contract.modes import Placement
from deviceplugin.devices import UnitInventory, slot_of
from deviceplugin.errors import Refusal
from deviceplugin.judge import Accepted, NeedsPlacement
from deviceplugin.offers import allocation_candidates
from deviceplugin.placement import best_fit, preferred_devices
from deviceplugin.trust import Context
from node.inventory import Gpu
from tests.harness.plugin.fakes import NODE
from tests.harness.plugin.judged import judged
from tests.harness.pods import admitted, assigned, unit_pod

IDS = [f"GPU-x-_-{n}" for n in range(4)]


def ctx_for(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract, placement: Placement = "extender"
) -> Context:
    return Context(contract, NODE, signer.public_key(), {g.index: g for g in inventory.gpus}, inventory.healthy,
                   placement)


def bound(pod: dict[str, Any], node: str = NODE, uid: str = "uid-1") -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["spec"]["nodeName"] = node
    out["metadata"]["uid"] = uid
    out["metadata"]["resourceVersion"] = "7"
    out["status"] = {"phase": "Pending"}
    return out


# ---------------------------------------------------------------------------------------------------------
# Validation: the pod owning the devices is accepted only if everything holds up.


def good_pod(contract: Contract, signer: Ed25519PrivateKey) -> dict[str, Any]:
    return bound(assigned(admitted(unit_pod("p", {"main": 4}), contract, signer), 0, 8))


def _annotations(pod: dict[str, Any]) -> dict[str, str]:
    result: dict[str, str] = pod["metadata"]["annotations"]
    return result


def no_intent(pod: dict[str, Any]) -> None:
    del _annotations(pod)["gpushare.io/intent"]


def other_key(pod: dict[str, Any]) -> None:
    text = _annotations(pod)["gpushare.io/intent"]
    _annotations(pod)["gpushare.io/intent-signature"] = signing.sign(Ed25519PrivateKey.generate(), text, "team")


def other_namespace(pod: dict[str, Any]) -> None:
    pod["metadata"]["namespace"] = "elsewhere"


def spec_changed(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"] = "5"


def index_out_of_range(pod: dict[str, Any]) -> None:
    _annotations(pod)[IDX] = "7"


def dev_differs(pod: dict[str, Any]) -> None:
    _annotations(pod)[DEV] = "16"


def wrong_node(pod: dict[str, Any]) -> None:
    pod["spec"]["nodeName"] = "node-b"


def pod_total_differs(pod: dict[str, Any]) -> None:
    _annotations(pod)[POD] = "2"


def not_placed(pod: dict[str, Any]) -> None:
    for key in (IDX, DEV, POD):
        del _annotations(pod)[key]


def garbage_index(pod: dict[str, Any]) -> None:
    _annotations(pod)[IDX] = "no-gpu-has-8MiB-to-run"


def record_for_other_gpu(pod: dict[str, Any]) -> None:
    intent = json.loads(_annotations(pod)["gpushare.io/intent"])
    _annotations(pod)["gpushare.io/allocation"] = json.dumps({
        "version": 1, "allocationId": intent["allocationId"], "node": NODE, "gpu": {"index": 1, "uuid": "GPU-z"},
        "containers": {},
    })


@pytest.mark.parametrize(
    ("edit", "reason", "text"),
    [
        (no_intent, "GpuShareNoIntent", "has no gpushare.io/intent annotation"),
        (other_key, "GpuShareBadSignature", "signature does not verify"),
        (other_namespace, "GpuShareBadSignature", "signature does not verify"),
        (spec_changed, "GpuShareBadIntent", "does not match its intent"),
        (index_out_of_range, "GpuShareBadAssignment", "index 7, which node node-a does not have"),
        (dev_differs, "GpuShareBadAssignment", "says GPU 0 has 16 GiB"),
        (wrong_node, "GpuShareRefused", "bound to node 'node-b'"),
        (pod_total_differs, "GpuShareBadAssignment", "ALIYUN_COM_GPU_MEM_POD is 2"),
        (not_placed, "GpuShareNotPlaced", "no ALIYUN_COM_GPU_MEM_IDX annotation"),
        (garbage_index, "GpuShareBadAssignment", "not a non-negative decimal integer"),
        (record_for_other_gpu, "GpuShareBadAssignment", "bad allocation record"),
    ],
)
def test_refusals_name_the_pod_and_the_fix(
    edit: Callable[[dict[str, Any]], None], reason: str, text: str,
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract,
) -> None:
    pod = good_pod(contract, signer)
    edit(pod)
    with pytest.raises(Refusal) as caught:
        judged(pod, ["main"], IDS, ctx_for(inventory, signer, contract), [])
    assert caught.value.reason == reason
    assert text in caught.value.message
    assert "'main'" in caught.value.message and "/p" in caught.value.message


def test_container_holding_other_than_its_intent_is_refused(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract
) -> None:
    with pytest.raises(Refusal, match="holds 3 GiB of devices but its intent asks for 4 GiB"):
        judged(good_pod(contract, signer), ["main"], IDS[:3], ctx_for(inventory, signer, contract), [])


def test_unhealthy_gpu_is_refused(inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract) -> None:
    inventory.set_health(0, False)
    with pytest.raises(Refusal, match="unhealthy"):
        judged(good_pod(contract, signer), ["main"], IDS, ctx_for(inventory, signer, contract), [])


def test_gpu_without_room_is_refused(inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract) -> None:
    others = [
        bound(assigned(admitted(unit_pod(f"o{i}", {"main": 3}), contract, signer), 0, 8), uid=f"o{i}") for i in range(2)
    ]
    finished = bound(assigned(admitted(unit_pod("done", {"main": 8}), contract, signer), 0, 8), uid="done")
    finished["status"]["phase"] = "Succeeded"  # holds nothing any more
    elsewhere = bound(assigned(admitted(unit_pod("far", {"main": 8}), contract, signer), 0, 8), node="node-b", uid="f")
    with pytest.raises(Refusal, match="6 of its 8 GiB are already promised to team/o0 \\(3\\), team/o1 \\(3\\)"):
        judged(good_pod(contract, signer), ["main"], IDS, ctx_for(inventory, signer, contract),
                 [*others, finished, elsewhere])
    # One neighbour of 3 leaves room for 4.
    verdict = judged(good_pod(contract, signer), ["main"], IDS, ctx_for(inventory, signer, contract), others[:1])
    assert isinstance(verdict, Accepted)


def deleted(pod: dict[str, Any], **states: str) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:05Z"
    out["status"]["containerStatuses"] = [{"name": n, "state": {s: {}}} for n, s in states.items()]
    return out


@pytest.mark.parametrize("placement", ["extender", "node"])
def test_a_pod_being_deleted_is_not_started(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract, placement: Placement
) -> None:
    with pytest.raises(Refusal) as caught:
        judged(deleted(good_pod(contract, signer)), ["main"], IDS, ctx_for(inventory, signer, contract, placement),
                 [])
    assert caught.value.reason == "GpuSharePodDeleting"
    assert "pod team/p (container 'main') is being deleted, so the container is not started" in caught.value.message


def test_pods_being_deleted_hold_room_only_while_they_run(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract
) -> None:
    def other(name: str, units: int) -> dict[str, Any]:
        return bound(assigned(admitted(unit_pod(name, {"main": units}), contract, signer), 0, 8), uid=name)

    ctx = ctx_for(inventory, signer, contract)
    pulling = deleted(other("pulling", 6))  # the extender gave its room away; it never started a container
    assert isinstance(judged(good_pod(contract, signer), ["main"], IDS, ctx, [pulling]), Accepted)
    running = deleted(other("running", 6), main="running")
    with pytest.raises(Refusal) as caught:
        judged(good_pod(contract, signer), ["main"], IDS, ctx, [running])
    assert caught.value.reason == "GpuShareNoRoom"
    assert "6 GiB of them by the pod team/running (6), which is being deleted" in caught.value.message
    assert caught.value.message.endswith("nothing to do")
    stopped = deleted(other("running", 6), main="terminated")
    assert isinstance(judged(good_pod(contract, signer), ["main"], IDS, ctx, [stopped]), Accepted)


def test_node_placement_asks_for_a_gpu(inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract) -> None:
    pod = good_pod(contract, signer)
    not_placed(pod)
    verdict = judged(pod, ["main"], IDS, ctx_for(inventory, signer, contract, "node"), [])
    assert isinstance(verdict, NeedsPlacement) and verdict.intent.total == 4


def test_accepted_records_and_is_idempotent(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract
) -> None:
    pod = bound(assigned(admitted(unit_pod("p", {"a": 2, "b": 3}, init={"setup": 2}), contract, signer), 1, 8))
    ctx = ctx_for(inventory, signer, contract)
    first = judged(pod, ["setup", "a"], IDS[:2], ctx, [pod])
    assert isinstance(first, Accepted)
    assert first.gpu.index == 1 and first.patch[ASSIGNED] == "true"
    _annotations(pod).update(first.patch)
    again = judged(pod, ["setup", "a"], IDS[:2], ctx, [pod])
    assert isinstance(again, Accepted) and again.patch == {}
    second = judged(pod, ["b"], IDS[:3], ctx, [pod])
    assert isinstance(second, Accepted)
    record = parse_allocation(second.patch["gpushare.io/allocation"])
    assert record.gpu_uuid == inventory.gpus[1].uuid and record.node == NODE
    assert {n: (s.units, s.slot) for n, s in record.containers.items()} == {
        "setup": (2, slot_of(IDS[:2])), "a": (2, slot_of(IDS[:2])), "b": (3, slot_of(IDS[:3])),
    }
    assert ASSIGNED not in second.patch


# ---------------------------------------------------------------------------------------------------------
# Usage, best fit and Allocate-time candidates.

GPUS = [Gpu(0, "GPU-a", 8), Gpu(1, "GPU-b", 8), Gpu(2, "GPU-c", 16)]


@pytest.mark.parametrize(
    ("used", "need", "unhealthy", "expected"),
    [
        ({}, 4, set(), 0),
        ({0: 6}, 4, set(), 1),
        ({0: 5, 1: 3}, 3, set(), 0),
        ({0: 2, 1: 2}, 6, set(), 0),
        ({0: 8, 1: 8}, 9, set(), 2),
        ({0: 8, 1: 8, 2: 10}, 7, set(), None),
        ({}, 4, {0}, 1),
        ({}, 17, set(), None),
    ],
)
def test_best_fit(used: dict[int, int], need: int, unhealthy: set[int], expected: int | None) -> None:
    gpu = best_fit(GPUS, used, need, lambda i: i not in unhealthy)
    assert (gpu.index if gpu else None) == expected


@pytest.mark.parametrize(
    ("must", "size", "handed", "expected"),
    [
        ([], 2, {}, ["a-0", "a-1"]),  # nothing handed out yet: in name order, one GPU's units first
        ([], 2, {"a-0": 1, "a-1": 1}, ["a-2", "b-0"]),  # never handed out before handed out
        ([], 3, {"a-0": 2, "a-1": 2, "a-2": 1, "b-0": 3, "b-1": 4}, ["a-2", "a-0", "a-1"]),  # least recent first
        (["b-1"], 2, {"a-0": 1}, ["b-1", "a-1"]),  # the kubelet's must-include IDs always come first
        (["b-1", "b-0"], 1, {}, ["b-1", "b-0"]),
    ],
)
def test_preferred_devices(must: list[str], size: int, handed: dict[str, int], expected: list[str]) -> None:
    available = ["b-1", "a-2", "b-0", "a-0", "a-1"]
    assert preferred_devices(available, must, size, handed) == expected


def test_allocation_candidates(inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract) -> None:
    ctx = ctx_for(inventory, signer, contract)
    ok = good_pod(contract, signer)
    unstamped = bound(assigned(unit_pod("raw", {"main": 2}), 0, 8), uid="raw")
    unplaced = bound(admitted(unit_pod("free", {"main": 3}), contract, signer), uid="free")
    pods = [ok, unstamped, unplaced]
    assert allocation_candidates(pods, 4, "s", ctx) == (["team/p"], [])
    found, notes = allocation_candidates(pods, 2, "s", ctx)
    assert found == [] and "has no gpushare.io/intent annotation" in notes[0]
    found, notes = allocation_candidates(pods, 3, "s", ctx)
    assert found == [] and "extender" in notes[0]
    assert allocation_candidates(pods, 3, "s", ctx_for(inventory, signer, contract, "node"))[0] == ["team/free"]
    assert allocation_candidates(pods, 5, "s", ctx) == ([], [])
    # A container already recorded with another slot holds devices: not a candidate; its own slot is.
    verdict = judged(ok, ["main"], IDS, ctx, [])
    assert isinstance(verdict, Accepted)
    _annotations(ok).update(verdict.patch)
    assert allocation_candidates([ok], 4, "other-slot", ctx)[0] == []
    assert allocation_candidates([ok], 4, slot_of(IDS), ctx)[0] == ["team/p"]
