"""What the gpushare scheduler extender can book of a pod: the app containers' sum only (pure)."""

from __future__ import annotations

from contract import Contract, Demand

_NODE_PLACEMENT = "or use cdi delivery with GPUSHARE_PLACEMENT=node, where the device plugin books the whole pod"


def booking_problems(demand: Demand, contract: Contract) -> list[str]:
    """What the gpushare scheduler extender cannot book: it places a pod by, and books on the GPU, the sum of the
    app containers' limits only (`spec.containers`; gpushare-scheduler-extender pkg/utils/pod.go,
    GetGPUMemoryFromPodResource), so a pod whose effective request (Demand.total) is larger would land on a GPU
    without its room, and one with GPU memory only in init containers is never bound ("can't place the pod")."""
    apps = sum(units for _, units in demand.containers)
    if demand.total == apps:
        return []
    unit, resource = contract.unit, contract.resource
    books = (f"the gpushare scheduler extender books only the sum of the app containers' limits of {resource} "
             f"({apps} {unit} for this pod)")
    problems: list[str] = []
    for init in demand.init_containers:
        if init.units and init.restartable:
            problems.append(
                f"sidecar {init.name!r} (a restartable init container) asks for {init.units} {unit} of {resource}, "
                f"but {books}: GPU memory in a sidecar is not booked by the extender; move it into an app "
                f"container, {_NODE_PLACEMENT}"
            )
    larger = [i for i in demand.init_containers if not i.restartable and i.units > apps]
    if larger:
        them = "init containers" if len(larger) > 1 else "init container"
        names = ", ".join(f"{i.name!r} ({i.units} {unit})" for i in larger)
        what = (f"the GPU it picks may lack room for the {them}" if apps
                else "it cannot place the pod at all: its bind fails until the pod is deleted")
        problems.append(
            f"{them} {names} need{'' if len(larger) > 1 else 's'} more {resource} than the app containers "
            f"together, but {books}, so {what}; give the app containers at least {max(i.units for i in larger)} "
            f"{unit} in total, or run the {them} without GPU memory, {_NODE_PLACEMENT}"
        )
    return problems
