"""Which pod a refused Allocate was for, when only one pod can be, and why it was refused (pure).

Allocate names device IDs only. When it is refused no pod on the node qualified, and the pod being admitted is
one of those bound to this node, not started, with a container asking for exactly that many units that has no
allocation recorded. If exactly one pod fits, the refusal is that pod's; otherwise nobody can tell, and the
refusal goes to the log and a counter instead of an Event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contract import IDX, ProtocolError, demand_of, parse_allocation, parse_assignment, pod_ref, read_annotations
from deviceplugin.errors import Refusal
from deviceplugin.trust import Context, stamped_intent
from deviceplugin.usage import live_on_node


def waiting_pods(pods: Sequence[Mapping[str, Any]], units: int, ctx: Context) -> list[Mapping[str, Any]]:
    """Pods on this node, not running yet, with a container of exactly `units` whose allocation is not recorded."""
    out = []
    for pod in pods:
        if not live_on_node(pod, ctx.node_name) or (pod.get("status") or {}).get("phase") not in (None, "Pending"):
            continue
        try:
            demand = demand_of(pod, ctx.contract.resource)
        except ProtocolError:
            continue
        names = [n for n, u in demand.containers if u == units] + [i.name for i in demand.init_containers
                                                                    if i.units == units]
        if names and any(name not in _recorded(pod, ctx) for name in names):
            out.append(pod)
    return out


def _recorded(pod: Mapping[str, Any], ctx: Context) -> set[str]:
    text = read_annotations(pod).get(ctx.contract.allocation_key)
    if text is None:
        return set()
    try:
        return set(parse_allocation(text, ctx.contract.allocation_key).containers)
    except ProtocolError:
        return set()


def allocate_refusal(pod: Mapping[str, Any], units: int, ctx: Context) -> Refusal:
    """Why this pod got no devices from Allocate: the first of its problems, with the fix."""
    ref = pod_ref(pod)
    head = (f"The kubelet's Allocate of {units} {ctx.contract.unit} of {ctx.contract.resource} for pod {ref} on node "
            f"{ctx.node_name} was refused, so the pod is not admitted")
    try:
        stamped_intent(pod, ctx, f"pod {ref}")
        assignment = parse_assignment(read_annotations(pod))
    except Refusal as refusal:
        return Refusal(f"{head}: {refusal.message}.", refusal.reason)
    except ProtocolError as exc:
        return Refusal(f"{head}: its assignment cannot be read ({exc}); recreate the pod.", "GpuShareBadAssignment")
    if assignment.index is None and ctx.placement != "node":
        return Refusal(
            f"{head}: it has no {IDX} annotation, so no scheduler extender placed it on a GPU; configure the gpushare "
            "scheduler extender (a pod created with spec.nodeName skips it), or run webhook and plugins with "
            "GPUSHARE_DELIVERY=cdi and GPUSHARE_PLACEMENT=node; then recreate the pod.", "GpuShareNotPlaced",
        )
    return Refusal(f"{head}: its allocation record already gives these units to another device set; recreate the "
                   "pod.", "GpuShareNoCandidate")
