"""What Allocate may hand out: the live, validated pods of this node with a container waiting for devices of a size,
and notes on those that came close (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contract import (
    IDX,
    ContainerSlot,
    ProtocolError,
    demand_of,
    parse_allocation,
    parse_assignment,
    pod_ref,
    read_annotations,
)
from deviceplugin.errors import Refusal
from deviceplugin.trust import Context
from deviceplugin.usage import live_on_node


@dataclass(frozen=True)
class Offer:
    """A validated pod's containers as Allocate sees them: (units, slot it already holds or None) for each."""

    ref: str
    containers: tuple[tuple[int, str | None], ...]

    def takes(self, units: int, slot: str) -> bool:
        """A container asks for exactly `units` and holds no devices yet (or holds this very slot)."""
        return any(u == units and held in (None, slot) for u, held in self.containers)


def allocation_offer(pod: Mapping[str, Any], ctx: Context) -> Offer | str | None:
    """What a live pod on this node offers Allocate, a note on why a GPU-share pod does not qualify, or None
    for a pod that is not a live GPU-share pod of this node."""
    if not live_on_node(pod, ctx.node_name):
        return None
    ref = pod_ref(pod)
    try:
        if not demand_of(pod, ctx.contract.resource).wants_gpu:
            return None
    except ProtocolError:
        return None
    verdict = ctx.verdicts.intent(pod, ctx)  # checked once per pod version
    if isinstance(verdict, Refusal):
        return str(verdict)
    annotations = read_annotations(pod)
    try:
        assignment = parse_assignment(annotations)
    except ProtocolError as exc:
        return str(exc)
    if assignment.index is None and ctx.placement != "node":
        return f"pod {ref} has no {IDX} annotation (is the scheduler extender configured?)"
    recorded: Mapping[str, ContainerSlot] = {}
    key = ctx.contract.allocation_key
    if key in annotations:
        try:
            recorded = parse_allocation(annotations[key], key).containers
        except ProtocolError as exc:
            return f"pod {ref}: {exc}"
    names = [*verdict.containers, *verdict.init_containers]
    held = {n: recorded[n].slot if n in recorded else None for n in names}
    return Offer(ref, tuple((verdict.units_of(n), held[n]) for n in names if verdict.units_of(n)))


def allocation_candidates(
    pods: Sequence[Mapping[str, Any]], units: int, slot: str, ctx: Context
) -> tuple[list[str], list[str]]:
    """Pods on this node with a validated container that asks for exactly `units` and holds no devices yet
    (or holds this very slot: the kubelet may ask again); and notes on the pods that came close."""
    found: list[str] = []
    notes: list[str] = []
    for pod in pods:
        try:
            demand = demand_of(pod, ctx.contract.resource)
        except ProtocolError:
            continue
        if units not in [u for _, u in demand.containers] + [i.units for i in demand.init_containers]:
            continue  # a pod of another size is neither a candidate nor worth a note
        offer = allocation_offer(pod, ctx)
        if isinstance(offer, str):
            notes.append(offer)
        elif offer is not None and offer.takes(units, slot):
            found.append(offer.ref)
            break  # one is enough: the check only proves the devices go to some validated pod
    return found, notes
