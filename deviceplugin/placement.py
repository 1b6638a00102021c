"""Best-fit placement on this node's GPUs and the device IDs the plugin prefers to hand out (pure)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from contract import Assignment, Intent
from node.inventory import Gpu


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
