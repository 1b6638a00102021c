"""What this node's GPUs already carry: believed pods only, each on the GPU it is pinned to (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deviceplugin.pins import Pin
from deviceplugin.trust import Context, Refusal
from webhook.protocol import IDX, ProtocolError, parse_allocation, parse_assignment, pod_ref, read_annotations

TERMINAL_PHASES = ("Succeeded", "Failed")


def live_on_node(pod: Mapping[str, Any], node_name: str) -> bool:
    return (pod.get("spec") or {}).get("nodeName") == node_name and (pod.get("status") or {}).get(
        "phase"
    ) not in TERMINAL_PHASES


@dataclass(frozen=True)
class Usage:
    used: dict[int, int] = field(default_factory=dict)  # GPU index -> units promised
    users: dict[int, list[str]] = field(default_factory=dict)  # GPU index -> "namespace/name (units)"

    def on(self, index: int) -> tuple[int, list[str]]:
        return self.used.get(index, 0), self.users.get(index, [])


def node_usage(pods: Sequence[Mapping[str, Any]], ctx: Context, exclude_uid: str = "") -> Usage:
    """The units each GPU of this node carries. Only a pod whose intent the webhook signed counts, for its signed
    total, so annotations forged onto any other pod (a status update can write them) block no GPU; a pod that
    cannot be read is left out and reported once in the log, so it fails no other pod's start."""
    usage = Usage()
    for pod in pods:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not live_on_node(pod, ctx.node_name) or (exclude_uid and uid == exclude_uid):
            continue
        promise = promise_of(pod, uid, ctx)
        if promise is not None:
            index, units = promise
            usage.used[index] = usage.used.get(index, 0) + units
            usage.users.setdefault(index, []).append(f"{pod_ref(pod)} ({units})")
    return usage


def promise_of(pod: Mapping[str, Any], uid: str, ctx: Context) -> tuple[int, int] | None:
    """(GPU index, units) a believed pod holds on this node: its pin, else its IDX; None for any other pod."""
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
    return index, verdict.total


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
