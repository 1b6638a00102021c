"""The judgement of the pod that holds a container's devices: may the container start, on which GPU, and what to
record; decided from plain data (the pod, its pin, what its GPU carries), no I/O (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

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
    read_annotations,
)
from deviceplugin.devices import slot_of
from deviceplugin.errors import Refusal
from deviceplugin.evidence import LegacyAccepted, Trusted
from deviceplugin.pins import Pin
from deviceplugin.trust import Context
from deviceplugin.usage import Holder, node_usage
from node.inventory import Gpu


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


class Load(Protocol):
    """What a GPU of this node carries, one pod left out: the units at once, who holds them only to word a refusal
    (the node index keeps the units per GPU as pods come and go: deviceplugin/nodeindex.py)."""

    def units_on(self, index: int, exclude_uid: str = "") -> int: ...

    def holders_on(self, index: int, exclude_uid: str = "") -> list[Holder]: ...


def validate(
    belief: Trusted, pod: Mapping[str, Any], containers: Sequence[str], device_ids: Sequence[str], ctx: Context, *,
    others: Sequence[Mapping[str, Any]] = (), load: Load | None = None,
) -> Accepted | NeedsPlacement:
    """Accept the pod holding these devices, whose word deviceplugin/evidence.py took (`belief`), only if its
    assignment holds up, its GPU has room and it never moves; place it first where this node places pods.

    The room on the GPU is asked of `load` (the node index) when given, else judged over `others` (this node's
    pods)."""
    ref, who, intent = belief.ref, belief.who, belief.intent
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
    _check_room(who, intent.total, gpu, ctx, uid=uid, others=others, load=load)
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


def _check_room(who: str, need: int, gpu: Gpu, ctx: Context, *, uid: str, others: Sequence[Mapping[str, Any]],
                load: Load | None) -> None:
    if load is None:
        _, holders = node_usage(others, ctx, exclude_uid=uid).on(gpu.index)
    elif load.units_on(gpu.index, uid) + need <= gpu.memory_units:
        return
    else:
        holders = load.holders_on(gpu.index, uid)
    no_room = room_refusal(who, need, gpu, holders, ctx)
    if no_room is not None:
        raise no_room


def moved(pin: Pin, index: int | None, uuid: str | None, who: str, node: str) -> str | None:
    """Why a pod pinned to `pin` may not start on GPU `index` (`uuid`), or None when it is the same GPU."""
    if index == pin.index and uuid in (None, pin.uuid):
        return None
    now = f"names GPU {index}" if index is not None else "names no GPU"
    if index == pin.index:
        now = f"names GPU {index}, which is now {uuid}"
    return (
        f"{who} was allocated GPU {pin.index} ({pin.uuid}) of node {node}, but its {IDX} annotation or allocation "
        f"record now {now}; a pod never moves to another GPU once allocated, so the container is not started; "
        f"set {IDX} and the allocation record back to GPU {pin.index}, or delete the pod and create it again"
    )


def _leaving(holders: Sequence[Holder]) -> tuple[int, str, bool]:
    """(units held by pods being deleted, their names, whether there is more than one)."""
    leaving = [h for h in holders if h.leaving]
    return sum(h.units for h in leaving), ", ".join(str(h) for h in leaving[:5]), len(leaving) > 1


def room_refusal(who: str, need: int, gpu: Gpu, holders: Sequence[Holder], ctx: Context) -> Refusal | None:
    """None when `need` more units fit on `gpu` beside what `holders` hold there; else the refusal, which says whether
    it clears by itself (the room is held by pods being deleted whose GPU containers still run) or what to do."""
    used = sum(h.units for h in holders)
    if used + need <= gpu.memory_units:
        return None
    unit = ctx.contract.unit
    leaving, names, several = _leaving(holders)
    head = f"{who} needs {need} {unit} on GPU {gpu.index}, but {used} of its {gpu.memory_units} {unit}"
    if used - leaving + need <= gpu.memory_units:
        pods, runs, stop, its = (("pods", "are", "those pods have", "their") if several
                                 else ("pod", "is", "that pod has", "its"))
        why = (" (the scheduler extender counts a pod's memory as free as soon as the pod is deleted)"
               if ctx.placement == "extender" else "")
        return Refusal(
            f"{head} are still held, {leaving} {unit} of them by the {pods} {names}, which {runs} being deleted while "
            f"GPU containers of {'them' if several else 'it'} still run{why}; the container is not started yet, the "
            f"kubelet retries the start by itself, and it succeeds once {stop} stopped (within {its} termination "
            "grace period): nothing to do",
            reason="GpuShareNoRoom",
        )
    users = ", ".join(str(h) for h in holders[:5])
    later = (f"; even once {names}, being deleted, {'have' if several else 'has'} stopped, {used - leaving} {unit} "
             "stay promised") if leaving else ""
    if ctx.placement == "extender":
        started = [str(h) for h in holders if h.legacy][:3]
        legacy = (f"; or pods the previous device plugin started on another GPU than their {IDX} names, which it "
                  "counts there and this plugin counts where the kubelet's checkpoint shows them, such as "
                  f"{', '.join(started)}" if started else "")
        cause = ("the scheduler extender counted less on this GPU when it placed the pod (more than one extender "
                 "replica placing pods at once, or pods whose init containers or sidecars ask for more than their app "
                 f"containers, which it does not count, lead to that{legacy})")
    else:
        cause = f"this node's plugin placed the pod on GPU {gpu.index} before those pods were counted there"
    return Refusal(
        f"{head} are already promised to {users}{later}; {cause}, so the container is not started; delete this pod so "
        "that it is placed again (its controller recreates it), or free the GPU by deleting one of those pods",
        reason="GpuShareNoRoom",
    )
