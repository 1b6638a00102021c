"""Exact resolution of device IDs to the pod that holds them, and validation of that pod (pure)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from contract import (
    ASSIGNED,
    DEV,
    IDX,
    Allocation,
    Assignment,
    ContainerSlot,
    Intent,
    ProtocolError,
    allocation_problems,
    assignment_problems,
    parse_allocation,
    parse_assignment,
    pod_ref,
    read_annotations,
)
from contract.holding import terminating
from deviceplugin.checkpoint import Entry, checkpoint_entries
from deviceplugin.errors import Refusal
from deviceplugin.legacy import LegacyAccepted, legacy_restart
from deviceplugin.pins import moved
from deviceplugin.room import deleting_refusal, room_refusal
from deviceplugin.trust import Context, stamped_intent
from deviceplugin.usage import Holder, node_usage
from node.inventory import Gpu


def slot_of(device_ids: Iterable[str]) -> str:
    """The slot of a device-ID set: stable whatever the order the kubelet lists the IDs in."""
    return hashlib.sha256("\n".join(sorted(device_ids)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Holding:
    """One container's devices of our resource, as the kubelet reports them (PodResources or checkpoint)."""

    namespace: str
    pod: str
    container: str
    device_ids: tuple[str, ...]
    pod_uid: str = ""  # the checkpoint knows the UID only; PodResources knows namespace and name only


@dataclass(frozen=True)
class Owner:
    namespace: str
    name: str
    pod_uid: str
    containers: tuple[str, ...]

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.name else f"with UID {self.pod_uid}"


def find_owner(holdings: Sequence[Holding], device_ids: Sequence[str]) -> Owner:
    """The one pod whose containers hold exactly these IDs (an init container's IDs reused by an app
    container of the same pod map to that same pod)."""
    wanted = frozenset(device_ids)
    matches = [h for h in holdings if frozenset(h.device_ids) == wanted]
    pods = sorted({(h.namespace, h.pod, h.pod_uid) for h in matches})
    if not pods:
        raise Refusal(
            f"no pod on this node holds exactly the devices {_short(device_ids)} in the kubelet's pod resources or "
            "its device checkpoint; the container is not started; if this repeats, restart the pod so the kubelet "
            "allocates it again",
            reason="GpuShareUnknownDevices",
        )
    if len(pods) > 1:
        names = ", ".join(f"{ns}/{name}" if name else uid for ns, name, uid in pods)
        raise Refusal(
            f"the devices {_short(device_ids)} are held by several pods ({names}), which the kubelet never does; "
            "the container is not started; restart the kubelet so it rebuilds its device assignments"
        )
    namespace, name, uid = pods[0]
    containers = tuple(dict.fromkeys(h.container for h in matches))
    return Owner(namespace, name, uid, containers)


def other_holders(holdings: Sequence[Holding], device_ids: Sequence[str], owner: Owner) -> list[str]:
    """Pods other than the owner that hold any of these IDs: then the owner's checkpoint entry is out of date."""
    wanted = set(device_ids)
    out = set()
    for h in holdings:
        same = (h.namespace, h.pod) == (owner.namespace, owner.name) if h.pod else h.pod_uid == owner.pod_uid
        if not same and wanted.intersection(h.device_ids):
            out.add(f"{h.namespace}/{h.pod}" if h.pod else f"the pod with UID {h.pod_uid}")
    return sorted(out)


def checkpoint_holdings(entries: Iterable[Entry]) -> list[Holding]:
    """Holdings from the kubelet's device-manager checkpoint (pod UIDs only, no names): every container, init
    containers included."""
    return [Holding("", "", e.container, e.device_ids, e.pod_uid) for e in entries]


def holdings_from_checkpoint(text: str, resource: str) -> list[Holding]:
    """Holdings from the checkpoint's text (deviceplugin/checkpoint.py reads its layout); ValueError when it is not
    the device manager's JSON."""
    return checkpoint_holdings(checkpoint_entries(text, resource))


def _short(device_ids: Sequence[str]) -> str:
    shown = sorted(device_ids)[:3]
    more = f" and {len(device_ids) - 3} more" if len(device_ids) > 3 else ""
    return "[" + ", ".join(shown) + "]" + more


# ---------------------------------------------------------------------------------------------------------
# Validation of the owning pod.


@dataclass(frozen=True)
class Accepted:
    ref: str
    intent: Intent
    gpu: Gpu
    slot: str
    allocation: Allocation
    patch: dict[str, str] = field(default_factory=dict)  # empty when the pod already records this allocation


@dataclass(frozen=True)
class NeedsPlacement:
    ref: str
    intent: Intent


def _assigned_gpu(assignment: Assignment, ctx: Context, who: str) -> Gpu:
    """The GPU the assignment names, if it exists here, its memory matches DEV and it is healthy."""
    unit = ctx.contract.unit
    index = assignment.index if assignment.index is not None else -1
    gpu = ctx.gpus.get(index)
    if gpu is None:
        raise Refusal(
            f"{who} is assigned GPU index {assignment.index}, which node {ctx.node_name} does not have (it has "
            f"{sorted(ctx.gpus)}); check the scheduler extender's view of this node and recreate the pod",
            reason="GpuShareBadAssignment",
        )
    if assignment.device_units != gpu.memory_units:
        raise Refusal(
            f"{who} says GPU {gpu.index} has {assignment.device_units} {unit} ({DEV}) but it has "
            f"{gpu.memory_units} {unit}; check the scheduler extender's view of this node and recreate the pod",
            reason="GpuShareBadAssignment",
        )
    if not ctx.healthy(gpu.index):
        raise Refusal(
            f"{who} is assigned GPU {gpu.index}, which is unhealthy (critical XID); recreate the pod so it is "
            "placed on a healthy GPU", reason="GpuShareUnhealthy",
        )
    return gpu


def _recorded(
    annotations: Mapping[str, str], intent: Intent, assignment: Assignment, gpu: Gpu, ctx: Context, *, who: str
) -> dict[str, ContainerSlot]:
    """The containers the pod's allocation record already lists, if the record holds up."""
    recorded: dict[str, ContainerSlot] = {}
    key = ctx.contract.allocation_key
    if key in annotations:
        try:
            previous = parse_allocation(annotations[key], key)
        except ProtocolError as exc:
            raise Refusal(f"{who} has a bad allocation record: {exc}", reason="GpuShareBadAssignment") from exc
        problems = allocation_problems(intent, assignment, previous, ctx.node_name)
        if previous.gpu_uuid != gpu.uuid:
            problems.append(f"the allocation record names GPU {previous.gpu_uuid} but GPU {gpu.index} is {gpu.uuid}")
        if problems:
            raise Refusal(f"{who} has a bad allocation record: {'; '.join(problems)}", reason="GpuShareBadAssignment")
        recorded = dict(previous.containers)
    return recorded


# What validate answers: accept and deliver, place first (node placement), or let a previous plugin's answer stand.
Verdict: TypeAlias = Accepted | NeedsPlacement | LegacyAccepted


def _check_units(intent: Intent, containers: Sequence[str], units: int, ctx: Context, who: str) -> None:
    unit = ctx.contract.unit
    for name in containers:
        if intent.units_of(name) != units:
            raise Refusal(
                f"{who}: container {name!r} holds {units} {unit} of devices but its intent asks for "
                f"{intent.units_of(name)} {unit}; recreate the pod so the kubelet allocates it again"
            )


def validate(
    pod: Mapping[str, Any], containers: Sequence[str], device_ids: Sequence[str], ctx: Context,
    others: Sequence[Mapping[str, Any]], *, usage: Callable[[int, str], tuple[int, list[Holder]]] | None = None,
) -> Verdict:
    """Accept the pod holding these devices only if it is not being deleted, and its stamped, signed intent and its
    assignment hold up; a pod without an intent, from before the webhook, only as deviceplugin/legacy.py says.

    The room on the GPU is judged over `others` (this node's pods), or asked of `usage(index, exclude_uid)` (the
    node index) when given."""
    ref = pod_ref(pod)
    who = f"pod {ref} (container {', '.join(repr(c) for c in containers)})"
    node = (pod.get("spec") or {}).get("nodeName")
    if node != ctx.node_name:
        raise Refusal(f"{who} is bound to node {node!r}, not to this node {ctx.node_name!r}; restart the kubelet")
    if terminating(pod):
        raise deleting_refusal(who, ctx)
    if ctx.contract.intent_key not in read_annotations(pod):
        return legacy_restart(pod, containers, device_ids, ctx, who)  # a pod from before the webhook
    intent = stamped_intent(pod, ctx, who)
    _check_units(intent, containers, len(device_ids), ctx, who)
    annotations = read_annotations(pod)
    try:
        assignment = parse_assignment(annotations)
    except ProtocolError as exc:
        raise Refusal(f"{who} has a bad assignment: {exc}", reason="GpuShareBadAssignment") from exc
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    pin = ctx.pins.get(uid) if uid else None
    move = moved(pin, assignment.index, None, who, ctx.node_name) if pin else None
    if move:
        raise Refusal(move, reason="GpuShareMoved")
    problems = assignment_problems(intent, assignment)
    if problems:
        raise Refusal(f"{who} has a bad assignment: {'; '.join(problems)}", reason="GpuShareBadAssignment")
    if assignment.index is None:
        if ctx.placement == "node":
            return NeedsPlacement(ref, intent)
        raise Refusal(
            f"{who} has no {IDX} annotation, so no scheduler extender placed it on a GPU; configure the gpushare "
            "scheduler extender, or run webhook and plugins with GPUSHARE_DELIVERY=cdi and GPUSHARE_PLACEMENT=node",
            reason="GpuShareNotPlaced",
        )
    gpu = _assigned_gpu(assignment, ctx, who)
    move = moved(pin, gpu.index, gpu.uuid, who, ctx.node_name) if pin else None
    if move:  # the same index on another GPU: the inventory changed under a running pod
        raise Refusal(move, reason="GpuShareMoved")
    slot = slot_of(device_ids)
    if usage is not None:
        _, holders = usage(gpu.index, uid)
    else:
        _, holders = node_usage(others, ctx, exclude_uid=uid).on(gpu.index)
    no_room = room_refusal(who, intent.total, gpu, holders, ctx)
    if no_room is not None:
        raise no_room
    recorded = _recorded(annotations, intent, assignment, gpu, ctx, who=who)
    key = ctx.contract.allocation_key
    merged = dict(recorded)
    for name in containers:
        merged[name] = ContainerSlot(len(device_ids), slot)
    allocation = Allocation(intent.allocation_id, ctx.node_name, gpu.index, gpu.uuid, merged)
    patch: dict[str, str] = {}
    if merged != recorded or key not in annotations:
        patch[key] = allocation.to_json()
    if assignment.assigned is not True:
        patch[ASSIGNED] = "true"
    return Accepted(ref, intent, gpu, slot, allocation, patch)
