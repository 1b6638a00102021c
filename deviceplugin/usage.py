"""What this node's GPUs already carry: believed pods only, each on the GPU it is pinned to, and a pod being deleted
only while a GPU-share container of it may still run (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contract import IDX, Intent, ProtocolError, parse_allocation, parse_assignment, pod_ref, read_annotations
from contract.holding import finished, still_running, terminating
from deviceplugin.errors import Refusal
from deviceplugin.pins import Pin
from deviceplugin.trust import Context


def live_on_node(pod: Mapping[str, Any], node_name: str) -> bool:
    return (pod.get("spec") or {}).get("nodeName") == node_name and not finished(pod)


@dataclass(frozen=True)
class Holder:
    """A pod holding units on a GPU; `leaving`: it is being deleted while a GPU-share container of it may still
    run, so its units come free by themselves once it stops (within its termination grace period)."""

    ref: str
    units: int
    leaving: bool = False

    def __str__(self) -> str:
        return f"{self.ref} ({self.units})"


@dataclass(frozen=True)
class Usage:
    used: dict[int, int] = field(default_factory=dict)  # GPU index -> units promised
    holders: dict[int, list[Holder]] = field(default_factory=dict)  # GPU index -> who holds them

    def on(self, index: int) -> tuple[int, list[Holder]]:
        return self.used.get(index, 0), self.holders.get(index, [])


def node_usage(pods: Sequence[Mapping[str, Any]], ctx: Context, exclude_uid: str = "") -> Usage:
    """The units each GPU of this node carries. Only a pod whose intent the webhook signed counts, for its signed
    total, so annotations forged onto any other pod (a status update can write them) block no GPU; a pod that
    cannot be read is left out and reported once in the log, so it fails no other pod's start."""
    usage = Usage()
    for pod in pods:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if exclude_uid and uid == exclude_uid:
            continue
        held = holding_of(pod, uid, ctx)
        if held is not None:
            index, holder = held
            usage.used[index] = usage.used.get(index, 0) + holder.units
            usage.holders.setdefault(index, []).append(holder)
    return usage


def holding_of(pod: Mapping[str, Any], uid: str, ctx: Context) -> tuple[int, Holder] | None:
    """(GPU index, what it holds there) for a believed pod of this node that still holds its memory, else None.

    The scheduler extender frees a pod's memory as soon as the pod is deleted (contract/holding.py), so a pod being
    deleted counts only while one of its GPU-share containers may still run: its status shows it running, or this
    plugin delivered it (the allocation record lists it; a pinned pod without a readable record: any of them) and
    its status does not show it terminated yet."""
    if not live_on_node(pod, ctx.node_name):
        return None
    promise = promise_of(pod, uid, ctx)
    if promise is None:
        return None
    index, intent = promise
    leaving = terminating(pod)
    if leaving:
        names = [*intent.containers, *intent.init_containers]
        if not still_running(pod, names, _delivered(pod, uid, ctx, names)):
            return None
    return index, Holder(pod_ref(pod), intent.total, leaving)


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
        ctx.verdicts.report(uid, f"Pod {pod_ref(pod)} names GPU {index} of node {ctx.node_name} but is not counted "
                                 f"in its usage because it is not believed: {verdict.message}.")
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
