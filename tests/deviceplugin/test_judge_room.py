"""Table tests for the refusals about room: a pod being deleted is not started; a GPU without room says whether
the refusal clears by itself (pods being deleted whose containers still run) or what to do."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract import Contract
from contract.modes import Placement
from deviceplugin.evidence import deleting_refusal
from deviceplugin.judge import room_refusal
from deviceplugin.trust import Context
from deviceplugin.usage import Holder
from node.inventory import Gpu

GPU = Gpu(0, "GPU-a", 8)
WHO = "pod team/new (container 'main')"


def ctx(placement: Placement) -> Context:
    contract = Contract(delivery="cdi", placement=placement)
    return Context(contract, "node-a", Ed25519PrivateKey.generate().public_key(), {0: GPU}, lambda index: True,
                   placement)


def leaving(name: str, units: int) -> Holder:
    return Holder(f"team/{name}", units, leaving=True)


def staying(name: str, units: int) -> Holder:
    return Holder(f"team/{name}", units)


@pytest.mark.parametrize(("placement", "holders", "fragments"), [
    # Clears by itself: without the pods being deleted there is room.
    ("extender", [staying("a", 3), leaving("old", 4)], [
        "pod team/new (container 'main') needs 4 GiB on GPU 0, but 7 of its 8 GiB are still held, 4 GiB of them by "
        "the pod team/old (4), which is being deleted while GPU containers of it still run (the scheduler extender "
        "counts a pod's memory as free as soon as the pod is deleted); the container is not started yet, the kubelet "
        "retries the start by itself, and it succeeds once that pod has stopped (within its termination grace "
        "period): nothing to do"]),
    ("extender", [leaving("old", 3), leaving("older", 3)], [
        "6 GiB of them by the pods team/old (3), team/older (3), which are being deleted while GPU containers of them "
        "still run", "once those pods have stopped (within their termination grace period): nothing to do"]),
    ("node", [leaving("old", 6)], ["which is being deleted while GPU containers of it still run; the container"]),
    # Does not clear by itself: say why the views differ and what to do.
    ("extender", [staying("a", 3), staying("b", 3)], [
        "needs 4 GiB on GPU 0, but 6 of its 8 GiB are already promised to team/a (3), team/b (3); the scheduler "
        "extender counted less on this GPU when it placed the pod (more than one extender replica placing pods at "
        "once, or pods whose init containers or sidecars ask for more than their app containers, which it does not "
        "count, lead to that), so the container is not started; delete this pod so that it is placed again (its "
        "controller recreates it), or free the GPU by deleting one of those pods"]),
    ("extender", [staying("a", 5), leaving("old", 2)], [
        "are already promised to team/a (5), team/old (2); even once team/old (2), being deleted, has stopped, 5 GiB "
        "stay promised; the scheduler extender counted less"]),
    ("node", [staying("a", 6)], ["this node's plugin placed the pod on GPU 0 before those pods were counted there"]),
])
def test_a_gpu_without_room_says_whether_the_refusal_clears(placement: Placement, holders: list[Holder],
                                                            fragments: list[str]) -> None:
    refusal = room_refusal(WHO, 4, GPU, holders, ctx(placement))
    assert refusal is not None and refusal.reason == "GpuShareNoRoom"
    for fragment in fragments:
        assert fragment in refusal.message
    clears = "nothing to do" in refusal.message
    assert clears == (sum(h.units for h in holders if not h.leaving) + 4 <= 8)
    assert clears != ("delete this pod" in refusal.message)


@pytest.mark.parametrize("holders", [[], [staying("a", 4)], [staying("a", 2), leaving("old", 2)]])
def test_room_enough_is_no_refusal(holders: list[Holder]) -> None:
    assert room_refusal(WHO, 4, GPU, holders, ctx("extender")) is None


@pytest.mark.parametrize(("placement", "fragment"), [
    ("extender", "the scheduler extender counts a deleted pod's GPU memory as free at once and may have placed "
                 "another pod there"),
    ("node", "this node's plugin counts a deleted pod's GPU memory as free once none of its GPU containers runs"),
])
def test_a_pod_being_deleted_is_not_started(placement: Placement, fragment: str) -> None:
    refusal = deleting_refusal(WHO, ctx(placement))
    assert refusal.reason == "GpuSharePodDeleting"
    assert refusal.message.startswith(f"{WHO} is being deleted, so the container is not started: {fragment}, and "
                                      "starting it could put more on the GPU than it holds; nothing to do, the pod "
                                      "goes away by itself")
