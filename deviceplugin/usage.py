"""What this node's GPUs already carry: believed pods, each on the GPU it is pinned to, and the pods of a previous
device plugin where the kubelet's checkpoint shows it put them; a pod being deleted only while a GPU-share container
of it may still run (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contract import IDX, Intent, ProtocolError, parse_allocation, parse_assignment, pod_ref, read_annotations
from contract.demand import demand_of
from contract.holding import finished, still_running, terminating
from deviceplugin.checkpoint import visible_gpu
from deviceplugin.errors import PluginError, Refusal
from deviceplugin.pins import Pin
from deviceplugin.trust import Context


def live_on_node(pod: Mapping[str, Any], node_name: str) -> bool:
    return (pod.get("spec") or {}).get("nodeName") == node_name and not finished(pod)


@dataclass(frozen=True)
class Holder:
    """A pod holding units on a GPU; `leaving`: it is being deleted while a GPU-share container of it may still
    run, so its units come free by themselves once it stops (within its termination grace period); `legacy`: a pod
    the plugin does not believe, counted from the kubelet's checkpoint (a pod of the previous device plugin)."""

    ref: str
    units: int
    leaving: bool = False
    legacy: bool = False

    def __str__(self) -> str:
        return f"{self.ref} ({self.units})"


@dataclass(frozen=True)
class Usage:
    used: dict[int, int] = field(default_factory=dict)  # GPU index -> units promised
    holders: dict[int, list[Holder]] = field(default_factory=dict)  # GPU index -> who holds them

    def on(self, index: int) -> tuple[int, list[Holder]]:
        return self.used.get(index, 0), self.holders.get(index, [])

    def add(self, index: int, holder: Holder) -> None:
        self.used[index] = self.used.get(index, 0) + holder.units
        self.holders.setdefault(index, []).append(holder)


def node_usage(pods: Sequence[Mapping[str, Any]], ctx: Context, exclude_uid: str = "") -> Usage:
    """The units each GPU of this node carries. A pod whose intent the webhook signed counts for its signed total,
    so annotations forged onto any other pod (a status update can write them) block no GPU; a pod that cannot be
    read is left out and reported once in the log, so it fails no other pod's start. Any other pod counts only for
    what the kubelet's checkpoint shows a previous device plugin gave it (legacy_usage)."""
    usage = Usage()
    candidates: dict[str, Mapping[str, Any]] = {}
    for pod in pods:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if exclude_uid and uid == exclude_uid:
            continue
        held = holding_of(pod, uid, ctx)
        if held is not None:
            usage.add(*held)
        elif uid and legacy_candidate(pod, ctx):
            candidates[uid] = pod
    for index, holders in legacy_usage(candidates, ctx).items():
        for holder in holders:
            usage.add(index, holder)
    return usage


def legacy_candidate(pod: Mapping[str, Any], ctx: Context) -> bool:
    """A live pod of this node asking for our resource that the plugin does not believe: created before the webhook
    (no intent), or with an intent that does not hold up. What it holds comes from the kubelet's checkpoint only."""
    if not live_on_node(pod, ctx.node_name) or not _wants_gpu(pod, ctx):
        return False
    return isinstance(ctx.verdicts.intent(pod, ctx), Refusal)


def _wants_gpu(pod: Mapping[str, Any], ctx: Context) -> bool:
    try:
        return demand_of(pod, ctx.contract.resource).wants_gpu
    except ProtocolError:
        return True  # a spec the API server would have refused: the checkpoint tells whether it holds devices


def legacy_usage(candidates: Mapping[str, Mapping[str, Any]], ctx: Context) -> dict[int, list[Holder]]:
    """GPU index -> what the `candidates` (pod UID -> pod, legacy_candidate) hold there: for each pod, the device IDs
    the kubelet allocated its containers whose stored Allocate answer names that GPU (deviceplugin/checkpoint.py).

    Only the kubelet writes its checkpoint, from the answers of a device plugin on this node, so the GPU and the
    units are what the containers really got, whatever the pod's annotations say. A pod being deleted counts only
    while one of those containers may still run (contract/holding.py): its status shows it running, or this plugin
    let it start again (the pod is pinned) and its status does not show it terminated yet. When the checkpoint
    cannot be read while there are candidates, the room on the GPUs is not known: the call is answered UNAVAILABLE
    (the kubelet retries the start), never with a guess."""
    if not candidates:
        return {}
    checkpoint = ctx.checkpoint()
    if checkpoint.problem:
        refs = ", ".join(sorted(pod_ref(p) for p in candidates.values())[:3])
        raise PluginError(
            "UNAVAILABLE",
            f"the kubelet's device checkpoint cannot be read ({checkpoint.problem}), and pods of node "
            f"{ctx.node_name} that the gpushare webhook did not admit ({refs}) may hold GPU memory that only the "
            "checkpoint shows (pods started by a previous device plugin), so the room on the GPUs is not known; "
            "mount /var/lib/kubelet/device-plugins into the plugin and check GPUSHARE_KUBELET_CHECKPOINT",
        )
    ids: dict[tuple[str, int], set[str]] = {}  # (pod UID, GPU index) -> the device IDs held there
    containers: dict[str, list[str]] = {}  # pod UID -> its containers whose answer names a GPU
    for entry in checkpoint.entries:
        gpu = visible_gpu(entry.visible, ctx.gpus) if entry.pod_uid in candidates and entry.visible else None
        if gpu is not None:
            ids.setdefault((entry.pod_uid, gpu.index), set()).update(entry.device_ids)
            containers.setdefault(entry.pod_uid, []).append(entry.container)
    out: dict[int, list[Holder]] = {}
    for (uid, index), held in ids.items():
        pod, names = candidates[uid], containers[uid]
        leaving = terminating(pod)
        if leaving and not still_running(pod, names, names if ctx.pins.get(uid) is not None else ()):
            continue
        out.setdefault(index, []).append(Holder(pod_ref(pod), len(held), leaving, legacy=True))
    return out


def holding_of(pod: Mapping[str, Any], uid: str, ctx: Context) -> tuple[int, Holder] | None:
    """(GPU index, what it holds there) for a believed pod of this node that still holds its memory, else None."""
    if not live_on_node(pod, ctx.node_name):
        return None
    promise = promise_of(pod, uid, ctx)
    return None if promise is None else held_at(pod, uid, *promise, ctx)


def held_at(pod: Mapping[str, Any], uid: str, index: int, intent: Intent, ctx: Context) -> tuple[int, Holder] | None:
    """(index, what the pod holds there) for a live pod of this node whose verified intent is `intent`, else None.

    The scheduler extender frees a pod's memory as soon as the pod is deleted (contract/holding.py), so a pod being
    deleted counts only while one of its GPU-share containers may still run: its status shows it running, or this
    plugin delivered it (the allocation record lists it; a pinned pod without a readable record: any of them) and
    its status does not show it terminated yet."""
    if not live_on_node(pod, ctx.node_name):
        return None
    leaving = terminating(pod)
    if leaving:
        names = [*intent.containers, *intent.init_containers]
        delivered = _delivered(pod, uid, ctx, names)
        if not still_running(pod, names, delivered):
            return None
    return index, Holder(pod_ref(pod), intent.total, leaving)


class Tally:
    """The units believed pods hold on each GPU, and their sum, kept as pods are counted and uncounted; the node
    index keeps one under its own lock."""

    def __init__(self) -> None:
        self._on_gpu: dict[int, dict[str, Holder]] = {}  # GPU index -> pod uid -> what it holds there
        self._units: dict[int, int] = {}  # GPU index -> the units of _on_gpu there
        self._counted: dict[str, int] = {}  # pod uid -> the GPU index it is counted on

    def counted_on(self, uid: str) -> int | None:
        return self._counted.get(uid)

    def recount(self, uid: str, held: tuple[int, Holder] | None) -> None:
        """Count the pod where `held` says (the pin first, else IDX; believed pods only), and nowhere else."""
        self.uncount(uid)
        if held is not None:
            index, holder = held
            self._on_gpu.setdefault(index, {})[uid] = holder
            self._units[index] = self._units.get(index, 0) + holder.units
            self._counted[uid] = index

    def uncount(self, uid: str) -> None:
        index = self._counted.pop(uid, None)
        if index is not None:
            holder = self._on_gpu.get(index, {}).pop(uid, None)
            if holder is not None:
                self._units[index] -= holder.units

    def units(self, index: int, exclude_uid: str = "") -> int:
        excluded = self._on_gpu.get(index, {}).get(exclude_uid)
        return self._units.get(index, 0) - (excluded.units if excluded is not None else 0)

    def holders(self, index: int, exclude_uid: str = "") -> list[Holder]:
        return [h for uid, h in self._on_gpu.get(index, {}).items() if uid != exclude_uid]


def _delivered(pod: Mapping[str, Any], uid: str, ctx: Context, names: Sequence[str]) -> frozenset[str]:
    """The containers this plugin delivered: its allocation record's (the record is patched before a container of
    a pod that is not being deleted starts, so a pod version with a deletionTimestamp lists them all)."""
    text = read_annotations(pod).get(ctx.contract.allocation_key)
    if text is not None:
        try:
            return frozenset(parse_allocation(text, ctx.contract.allocation_key).containers)
        except ProtocolError:
            pass
    return frozenset(names) if uid and ctx.pins.get(uid) is not None else frozenset()


def promise_of(pod: Mapping[str, Any], uid: str, ctx: Context) -> tuple[int, Intent] | None:
    """(GPU index, signed intent) of a believed pod on this node: its pin, else its IDX; None for any other pod."""
    pinned = ctx.pins.get(uid) if uid else None
    annotations = read_annotations(pod)
    if pinned is not None:
        index = pinned.index  # where its containers run, whatever its annotations say now
    elif IDX not in annotations:
        return None
    else:
        try:
            placed = parse_assignment(annotations).index
        except ProtocolError as exc:
            ctx.verdicts.report(uid, f"Pod {pod_ref(pod)} is not counted in the usage of node {ctx.node_name}'s "
                                     f"GPUs because its annotations cannot be read: {exc}.")
            return None
        if placed is None:
            return None
        index = placed
    verdict = ctx.verdicts.intent(pod, ctx)
    if isinstance(verdict, Refusal):
        if ctx.contract.intent_key in annotations or not _wants_gpu(pod, ctx):  # not a pod from before the webhook
            ctx.verdicts.report(uid, f"Pod {pod_ref(pod)} names GPU {index} of node {ctx.node_name} but is not "
                                     f"counted there because it is not believed: {verdict.message}; it counts only "
                                     "where the kubelet's checkpoint shows another device plugin put it.")
        return None
    return index, verdict


def recorded_pin(pod: Mapping[str, Any], ctx: Context) -> Pin | None:
    """The GPU this node's plugin recorded for a believed pod in its allocation record, if the record holds up
    (the durable source of a pin: the pins of running pods are rebuilt from it after the plugin restarts)."""
    key = ctx.contract.allocation_key
    annotations = read_annotations(pod)
    if key not in annotations or not live_on_node(pod, ctx.node_name):
        return None
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    try:
        record = parse_allocation(annotations[key], key)
    except ProtocolError as exc:
        ctx.verdicts.report(uid, f"Pod {pod_ref(pod)} has an allocation record that cannot be read, so the GPU it "
                                 f"runs on is learnt at its next container start: {exc}.")
        return None
    verdict = ctx.verdicts.intent(pod, ctx)
    gpu = ctx.gpus.get(record.gpu_index)
    if (
        isinstance(verdict, Refusal) or record.allocation_id != verdict.allocation_id
        or record.node != ctx.node_name or gpu is None or gpu.uuid != record.gpu_uuid
    ):
        return None
    return Pin(gpu.index, gpu.uuid)
