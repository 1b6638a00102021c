"""Pods of the previous device plugin (no intent): what they hold, on the GPU the kubelet's checkpoint shows, and
whether a container of theirs may start again; table tests over plain data."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract import IDX, Contract, signing
from deviceplugin.checkpoint import Checkpoint, Entry
from deviceplugin.devices import UnitInventory
from deviceplugin.errors import PluginError, Refusal
from deviceplugin.evidence import LegacyAccepted
from deviceplugin.judge import Accepted
from deviceplugin.metrics import units_by_gpu
from deviceplugin.nodeindex import NodeIndex
from deviceplugin.pins import Pin
from deviceplugin.trust import Context
from deviceplugin.usage import node_usage
from tests.harness.plugin.fakes import NODE
from tests.harness.plugin.judged import judged
from tests.harness.pods import admitted, assigned, unit_pod

IDS = tuple(f"GPU-x-_-{n}" for n in range(6))
NEW_IDS = ["GPU-x-_-7", "GPU-x-_-8", "GPU-x-_-9", "GPU-x-_-10"]
FOREIGN = "GPU-8d2c5a8e-0000-4000-8000-000000000000"


def ctx_for(inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract, *entries: Entry,
            problem: str = "", healthy: bool = True) -> Context:
    read = Checkpoint(tuple(entries), problem)
    return Context(contract, NODE, signer.public_key(), {g.index: g for g in inventory.gpus},
                   inventory.healthy if healthy else (lambda index: False), checkpoint=lambda: read)


def on_node(pod: dict[str, Any], uid: str, phase: str = "Running", node: str = NODE) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["spec"]["nodeName"] = node
    out["metadata"].update(uid=uid, resourceVersion="5")
    out["status"] = {"phase": phase}
    return out


def old(name: str = "old", units: int = 6, index: int | None = 1, **where: str) -> dict[str, Any]:
    """A pod created before the webhook (no intent), placed by the extender on GPU `index`."""
    pod = unit_pod(name, {"main": units})
    return on_node(assigned(pod, index, 8) if index is not None else pod, uid=name, **where)


def believed(name: str, units: int, index: int, contract: Contract, signer: Ed25519PrivateKey) -> dict[str, Any]:
    return on_node(assigned(admitted(unit_pod(name, {"main": units}), contract, signer), index, 8), uid=name)


def gave(visible: str | None, uid: str = "old", container: str = "main", ids: tuple[str, ...] = IDS) -> Entry:
    """The checkpoint entry of a container the previous plugin answered with NVIDIA_VISIBLE_DEVICES=`visible`."""
    return Entry(uid, container, ids, visible)


def uuid_of(inventory: UnitInventory, index: int) -> str:
    return inventory.gpus[index].uuid


def used(pods: list[dict[str, Any]], ctx: Context) -> tuple[int, int]:
    usage = node_usage(pods, ctx)
    return usage.on(0)[0], usage.on(1)[0]


# -- counting ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("1", (0, 6)),
        ("0", (6, 0)),  # where the kubelet's checkpoint puts it, not where its IDX says (1)
        ("GPU-1", (0, 6)),
        ("no-gpu-has-6GiB-to-run", (0, 0)),  # the runtime never started it on a GPU
        (FOREIGN, (0, 0)),
        ("0,1", (0, 0)),
        (None, (0, 0)),  # an answer of gpushare's own (it names no GPU): not a pod of the previous plugin
    ],
)
def test_a_pod_of_the_previous_plugin_counts_where_the_checkpoint_puts_it(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract, visible: str | None,
    expected: tuple[int, int],
) -> None:
    visible = visible.replace("GPU-1", uuid_of(inventory, 1)) if visible else visible
    ctx = ctx_for(inventory, signer, contract, gave(visible))
    assert used([old()], ctx) == expected
    assert used([old()], ctx_for(inventory, signer, contract)) == (0, 0)  # no checkpoint entry: nothing held


def test_it_counts_the_device_ids_the_kubelet_allocated(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract
) -> None:
    pod = old()
    pod["spec"]["initContainers"] = [{"name": "load", "resources": {"limits": {contract.resource: "4"}}}]
    ctx = ctx_for(inventory, signer, contract,
                  gave("0", container="load", ids=IDS[:4]), gave("0", ids=IDS[:2]),  # it reuses the init's IDs
                  gave("1", container="side", ids=("GPU-x-_-9",)))
    usage = node_usage([pod], ctx)
    assert (usage.on(0)[0], usage.on(1)[0]) == (4, 1)
    assert [str(h) for h in usage.on(0)[1]] == ["team/old (4)"]


@pytest.mark.parametrize(
    ("pod", "counted"),
    [
        ("running", True),
        ("other node", False),
        ("finished", False),
        ("not listed", False),  # the API server lists no pod of that UID on this node
        ("asks for no GPU memory", False),
    ],
)
def test_only_live_pods_of_this_node_count(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract, pod: str, counted: bool
) -> None:
    made = {"running": old(), "other node": old(node="node-b"), "finished": old(phase="Failed"),
            "not listed": old(name="someone-else"), "asks for no GPU memory": old(units=0)}[pod]
    assert used([made], ctx_for(inventory, signer, contract, gave("1"))) == ((0, 6) if counted else (0, 0))


def test_a_believed_pod_counts_once_and_a_forged_intent_still_counts(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract
) -> None:
    """A pod the previous plugin allocated after the webhook stamped it counts for its intent only; a pod whose intent
    does not verify counts for what the checkpoint shows, whatever its annotations claim."""
    stamped = believed("stamped", 3, 0, contract, signer)
    forged = believed("forged", 2, 1, contract, signer)
    text = forged["metadata"]["annotations"][contract.intent_key]
    forged["metadata"]["annotations"][contract.signature_key] = signing.sign(Ed25519PrivateKey.generate(), text,
                                                                              "team")
    ctx = ctx_for(inventory, signer, contract, gave("0", uid="stamped", ids=IDS[:3]), gave("0", uid="forged",
                                                                                          ids=IDS[3:5]))
    assert used([stamped, forged], ctx) == (5, 0)


def test_a_pod_of_the_previous_plugin_blocks_the_room_it_uses(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract
) -> None:
    pod = believed("new", 4, 1, contract, signer)
    assert isinstance(judged(pod, ["main"], NEW_IDS, ctx_for(inventory, signer, contract), [old()]), Accepted)
    ctx = ctx_for(inventory, signer, contract, gave("1"))
    with pytest.raises(Refusal) as refused:
        judged(pod, ["main"], NEW_IDS, ctx, [old()])
    assert refused.value.reason == "GpuShareNoRoom"
    assert "but 6 of its 8 GiB are already promised to team/old (6)" in refused.value.message
    # Its IDX names GPU 0 while the checkpoint puts it on GPU 1: the extender counted it on GPU 0.
    moved = old(index=0)
    with pytest.raises(Refusal) as refused:
        judged(pod, ["main"], NEW_IDS, ctx, [moved])
    assert "or pods the previous device plugin started on another GPU than their ALIYUN_COM_GPU_MEM_IDX names, " \
           "which it counts there and this plugin counts where the kubelet's checkpoint shows them, such as " \
           "team/old (6))" in refused.value.message


@pytest.mark.parametrize(
    ("state", "pinned", "counted"),
    [
        ("running", False, True),
        ("terminated", False, False),
        ("waiting", False, False),  # crashed, waiting for its restart: it holds nothing while deleted
        (None, False, False),
        ("waiting", True, True),  # this plugin let it start again and its status does not show it yet
        ("terminated", True, False),
    ],
)
def test_a_pod_being_deleted_counts_only_while_it_may_run(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract, state: str | None, pinned: bool,
    counted: bool,
) -> None:
    pod = old()
    pod["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:05Z"
    if state is not None:
        pod["status"]["containerStatuses"] = [{"name": "main", "state": {state: {}}}]
    ctx = ctx_for(inventory, signer, contract, gave("1"))
    if pinned:
        ctx.pins.hold("old", Pin(1, uuid_of(inventory, 1)))
    usage = node_usage([pod], ctx)
    assert usage.on(1)[0] == (6 if counted else 0)
    assert all(h.leaving for h in usage.on(1)[1])


def test_an_unreadable_checkpoint_stops_room_decisions_only_beside_pods_it_would_show(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract
) -> None:
    ctx = ctx_for(inventory, signer, contract, problem="the kubelet checkpoint /x cannot be read (ENOENT)")
    assert used([believed("new", 4, 1, contract, signer), old(units=0)], ctx) == (0, 4)
    with pytest.raises(PluginError) as caught:
        node_usage([old()], ctx)
    assert caught.value.code == "UNAVAILABLE"
    assert "cannot be read (the kubelet checkpoint /x cannot be read (ENOENT)), and pods of node node-a that the " \
           "gpushare webhook did not admit (team/old) may hold GPU memory" in caught.value.message


def test_the_node_index_places_them_as_the_checkpoint_says_at_each_call(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract
) -> None:
    entries = [gave("1")]
    ctx = Context(contract, NODE, signer.public_key(), {g.index: g for g in inventory.gpus}, inventory.healthy,
                  checkpoint=lambda: Checkpoint(tuple(entries)))
    index = NodeIndex(ctx)
    index.replace([old(), believed("new", 2, 1, contract, signer)])
    assert [(i, sorted(str(h) for h in index.holders_on(i))) for i in (0, 1)] == [
        (0, []), (1, ["team/new (2)", "team/old (6)"])]
    entries[:] = [gave("0")]  # the kubelet rewrote its checkpoint
    assert (index.units_on(0), index.units_on(1), index.units_on(0, exclude_uid="old")) == (6, 2, 0)
    index.remove("old")
    assert index.units_on(0) == 0


def test_the_metrics_show_the_units_of_the_previous_plugin(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract
) -> None:
    ctx = ctx_for(inventory, signer, contract, gave("1"))
    assert units_by_gpu([old(), believed("new", 2, 1, contract, signer)], ctx) == {0: (0, 0, 0), 1: (8, 0, 6)}


# -- a container of such a pod starting again ------------------------------------------------------------------


def test_it_starts_again_on_its_recorded_gpu(inventory: UnitInventory, signer: Ed25519PrivateKey,
                                             contract: Contract) -> None:
    for visible in ("1", uuid_of(inventory, 1)):
        verdict = judged(old(), ["main"], IDS, ctx_for(inventory, signer, contract, gave(visible)), [])
        assert verdict == LegacyAccepted("team/old", inventory.gpus[1], ("main",))


@pytest.mark.parametrize(
    ("visible", "index", "reason", "fragment"),
    [
        ("0", 1, "GpuShareLegacyWrongGpu", "gave it NVIDIA_VISIBLE_DEVICES='0', GPU 0, but its ALIYUN_COM_GPU_MEM_IDX "
                                           "annotation records GPU 1, where the scheduler extender counts it"),
        ("no-gpu-has-8GiB-to-run", 1, "GpuShareLegacyWrongGpu",
         "gave it NVIDIA_VISIBLE_DEVICES='no-gpu-has-8GiB-to-run', which names no single GPU of node node-a (it has "
         "GPUs [0, 1])"),
        (FOREIGN, 1, "GpuShareLegacyWrongGpu", f"gave it NVIDIA_VISIBLE_DEVICES='{FOREIGN}', which names no single"),
        ("0,1", 0, "GpuShareLegacyWrongGpu", "which names no single GPU"),
        ("1", None, "GpuShareLegacyWrongGpu", "GPU 1, but its ALIYUN_COM_GPU_MEM_IDX annotation records no GPU"),
        ("1", "01", "GpuShareLegacyWrongGpu", "annotation records a value that is not a GPU index"),
        (None, 1, "GpuShareNoIntent", "and the kubelet keeps no answer of a previous device plugin for this "
                                      "container (it was not started before the switch)"),
    ],
)
def test_it_is_refused_unless_the_checkpoint_names_its_recorded_gpu(
    inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract, visible: str | None,
    index: int | str | None,
    reason: str, fragment: str,
) -> None:
    pod = old(index=index if isinstance(index, int) else None)
    if isinstance(index, str):
        pod["metadata"].setdefault("annotations", {})[IDX] = index
    with pytest.raises(Refusal) as refused:
        judged(pod, ["main"], IDS, ctx_for(inventory, signer, contract, gave(visible)), [])
    message = refused.value.message
    assert (refused.value.reason, fragment in message) == (reason, True), message
    assert message.startswith("pod team/old (container 'main') ")
    assert "delete the pod so that it is created again through the gpushare webhook" in message


def test_what_else_refuses_it(inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract) -> None:
    def refusal(ctx: Context, pod: dict[str, Any] | None = None, ids: tuple[str, ...] = IDS) -> Refusal:
        with pytest.raises(Refusal) as refused:
            judged(pod or old(), ["main", "load"], ids, ctx, [])
        return refused.value

    unhealthy = refusal(ctx_for(inventory, signer, contract, gave("1"), healthy=False))
    assert unhealthy.reason == "GpuShareUnhealthy" and "GPU 1, which is unhealthy" in unhealthy.message
    # An init container and the app container that reuses its IDs, given two GPUs by the previous plugin.
    two = refusal(ctx_for(inventory, signer, contract, gave("1"), gave("0", container="load")))
    assert two.reason == "GpuShareLegacyWrongGpu" and "NVIDIA_VISIBLE_DEVICES='0' and NVIDIA_VISIBLE_DEVICES='1'" \
        in two.message
    assert refusal(ctx_for(inventory, signer, contract, gave("1")), ids=IDS[:3]).reason == "GpuShareNoIntent"
    deleting = old()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:05Z"
    assert refusal(ctx_for(inventory, signer, contract, gave("1")), deleting).reason == "GpuSharePodDeleting"
    with pytest.raises(PluginError) as caught:
        judged(old(), ["main"], IDS, ctx_for(inventory, signer, contract, problem="it is gone"), [])
    assert caught.value.code == "UNAVAILABLE" and "the kubelet's device checkpoint cannot be read (it is gone)" in \
        caught.value.message
