"""Refusals about room on a GPU: a container of a pod being deleted, and a GPU whose units are promised to others,
worded by whether the refusal clears by itself (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from contract import IDX
from deviceplugin.errors import Refusal
from deviceplugin.trust import Context
from deviceplugin.usage import Holder
from node.inventory import Gpu


def deleting_refusal(who: str, ctx: Context) -> Refusal:
    """A container of a pod being deleted is never started: the kubelet may still start one whose image pull went on
    after the deletion, and the memory the pod was given already counts as free."""
    if ctx.placement == "extender":
        freed = ("the scheduler extender counts a deleted pod's GPU memory as free at once and may have placed another "
                 "pod there")
    else:
        freed = "this node's plugin counts a deleted pod's GPU memory as free once none of its GPU containers runs"
    return Refusal(
        f"{who} is being deleted, so the container is not started: {freed}, and starting it could put more on the GPU "
        "than it holds; nothing to do, the pod goes away by itself",
        reason="GpuSharePodDeleting",
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
