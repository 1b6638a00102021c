"""Best-fit placement on this node's GPUs, or the refusal when none has room, and the device IDs the plugin prefers
to hand out (pure)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from contract import Assignment, Intent
from deviceplugin.errors import Refusal
from deviceplugin.trust import Context
from deviceplugin.usage import Holder
from node.inventory import Gpu, Inventory


def best_fit(gpus: Sequence[Gpu], used: Mapping[int, int], need: int, healthy: Callable[[int], bool]) -> Gpu | None:
    """The healthy GPU with the least free room that still fits `need` (lowest index on ties)."""
    fitting = [g for g in gpus if healthy(g.index) and g.memory_units - used.get(g.index, 0) >= need]
    if not fitting:
        return None
    return min(fitting, key=lambda g: (g.memory_units - used.get(g.index, 0), g.index))


def choose_gpu(inventory: Inventory, used: Mapping[int, int], holders: Mapping[int, list[Holder]], *, need: int,
               who: str, ctx: Context) -> Gpu:
    """The best-fitting GPU for `need` units beside what is `used`; else the refusal, which says whether a GPU will
    have room once the pods being deleted there have stopped."""
    gpu = best_fit(inventory.gpus, used, need, inventory.healthy)
    if gpu is not None:
        return gpu
    unit = ctx.contract.unit
    free = ", ".join(f"GPU {g.index}: {g.memory_units - used.get(g.index, 0)}" for g in inventory.gpus)
    head = f"{who} needs {need} {unit} on one GPU but no GPU of node {ctx.node_name} has that much room"
    staying = {**used}
    for index, held in holders.items():
        staying[index] = staying.get(index, 0) - sum(h.units for h in held if h.leaving)
    later = best_fit(inventory.gpus, staying, need, inventory.healthy)
    if later is not None:
        leaving = [str(h) for h in holders.get(later.index, []) if h.leaving]
        several = len(leaving) > 1
        raise Refusal(
            f"{head} now (free {unit}: {free}); GPU {later.index} will once {', '.join(leaving[:5])}, being "
            f"deleted, {'have' if several else 'has'} stopped (within {'their' if several else 'its'} termination "
            "grace period): the container is not started yet and the kubelet retries the start by itself, so "
            "there is nothing to do",
            reason="GpuShareNoRoom",
        )
    raise Refusal(f"{head} (free {unit}: {free}); delete pods or recreate this one so it lands on another node",
                  reason="GpuShareNoRoom")


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
