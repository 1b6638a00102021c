"""What this node's GPUs already carry by the pods' annotations, best-fit placement, preferred device IDs (pure)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from deviceplugin.inventory import Gpu
from webhook.protocol import Assignment, Intent, ProtocolError, demand_of, parse_assignment, pod_ref, read_annotations

TERMINAL_PHASES = ("Succeeded", "Failed")


def live_on_node(pod: Mapping[str, Any], node_name: str) -> bool:
    return (pod.get("spec") or {}).get("nodeName") == node_name and (pod.get("status") or {}).get(
        "phase"
    ) not in TERMINAL_PHASES


def promised_units(pod: Mapping[str, Any], resource: str) -> tuple[int | None, int]:
    """(GPU index, units) a pod holds by its annotations; index None when it is not placed."""
    try:
        assignment: Assignment = parse_assignment(read_annotations(pod))
    except ProtocolError:
        return None, 0
    if assignment.index is None:
        return None, 0
    if assignment.pod_units is not None:
        return assignment.index, assignment.pod_units
    try:
        return assignment.index, demand_of(pod, resource).total
    except ProtocolError:
        return assignment.index, 0


def usage_by_gpu(
    pods: Sequence[Mapping[str, Any]], node_name: str, resource: str, exclude_uid: str = ""
) -> dict[int, int]:
    used: dict[int, int] = {}
    for pod in pods:
        if not live_on_node(pod, node_name) or (pod.get("metadata") or {}).get("uid") == exclude_uid:
            continue
        index, units = promised_units(pod, resource)
        if index is not None:
            used[index] = used.get(index, 0) + units
    return used


def usage_on_gpu(
    pods: Sequence[Mapping[str, Any]], node_name: str, index: int, exclude_uid: str, resource: str
) -> tuple[int, list[str]]:
    used, users = 0, []
    for pod in pods:
        if not live_on_node(pod, node_name) or (pod.get("metadata") or {}).get("uid") == exclude_uid:
            continue
        gpu_index, units = promised_units(pod, resource)
        if gpu_index == index and units:
            used += units
            users.append(f"{pod_ref(pod)} ({units})")
    return used, users


def best_fit(gpus: Sequence[Gpu], used: Mapping[int, int], need: int, healthy: Callable[[int], bool]) -> Gpu | None:
    """The healthy GPU with the least free room that still fits `need` (lowest index on ties)."""
    fitting = [g for g in gpus if healthy(g.index) and g.memory_units - used.get(g.index, 0) >= need]
    if not fitting:
        return None
    return min(fitting, key=lambda g: (g.memory_units - used.get(g.index, 0), g.index))


def placement_annotations(gpu: Gpu, intent: Intent, now_ns: int) -> dict[str, str]:
    return Assignment(gpu.index, gpu.memory_units, intent.total, now_ns, False).annotations()


def preferred_devices(
    available: Sequence[str], must_include: Sequence[str], size: int, handed: Mapping[str, int]
) -> list[str]:
    """The required IDs, then the IDs handed out least recently (never handed out first, in name order, so one
    GPU's units before the next); `handed` maps an ID to when it was last handed out (a counter)."""
    chosen = list(dict.fromkeys(must_include))
    rest = sorted(set(available) - set(chosen), key=lambda device: (handed.get(device, 0), device))
    return chosen + rest[: max(0, size - len(chosen))]
