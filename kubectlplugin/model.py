"""What `kubectl gpushare` shows, decided from nodes, pods and Events as plain dicts (pure: no API access).

A pod's state comes from what the cluster guards: its annotations (the webhook and the policies decide who writes
them) and its status (the kubelet's). Events decide no state (kubectlplugin/events.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from contract import (
    DEV,
    IDX,
    POD,
    Contract,
    Demand,
    ProtocolError,
    demand_of,
    int_annotation,
    parse_allocation,
    parse_assigned,
    parse_intent,
    parse_units,
    read_annotations,
)
from contract.holding import holds_memory, still_running, terminating
from contract.keys import GPU_COUNT
from kubectlplugin.events import by_pod, plugin_refusal

Obj = Mapping[str, Any]

# What the kubelet reports when a device plugin's Allocate fails (pkg/kubelet/lifecycle/predicate.go).
ADMISSION_REFUSED: Final = "UnexpectedAdmissionError"
# Container start failures whose message comes from the plugin's PreStartContainer (pkg/kubelet/cm/devicemanager).
START_FAILURES: Final = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")

# A GPU count above this is not believed: each GPU is a row, and a node's status (the plugin writes its GPU count)
# could claim 10**18 of them. The largest servers hold 16 GPUs.
MAX_GPUS: Final = 256

STATES: Final = ("requested", "stamped", "assigned", "allocated", "deleting", "refused", "invalid")


@dataclass(frozen=True)
class ContainerRow:
    name: str
    units: int
    init: bool = False


@dataclass(frozen=True)
class PodRow:
    namespace: str
    name: str
    node: str | None
    gpu: int | None
    units: int
    containers: tuple[ContainerRow, ...]
    state: str
    reason: str = ""
    # False for a pod that holds nothing on its GPU: the kubelet refused it at admission (it has failed), or it is
    # being deleted and no GPU-share container of it runs (the scheduler extender gave its memory away).
    counted: bool = True


@dataclass(frozen=True)
class GpuRow:
    index: int
    memory: int | None
    pods: tuple[PodRow, ...]

    @property
    def promised(self) -> int:
        return sum(p.units for p in self.pods if p.counted)

    @property
    def allocated(self) -> int:
        return sum(p.units for p in self.pods if p.counted and p.state == "allocated")


@dataclass(frozen=True)
class NodeRow:
    name: str
    gpus: tuple[GpuRow, ...]
    unplaced: tuple[PodRow, ...] = ()  # bound to the node without a GPU index


@dataclass(frozen=True)
class Report:
    resource: str
    unit: str
    namespace: str | None  # None: every namespace
    nodes: tuple[NodeRow, ...]
    pending: tuple[PodRow, ...] = ()  # not on a node yet
    selector: str = ""  # the label selector the pods were listed with (-l); "" for every pod


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def _quantity(value: object) -> int | None:
    """A node capacity as the protocol reads a quantity (ASCII digits, optional suffix); None when it is none."""
    if value is None:
        return None
    try:
        return parse_units(value, "capacity")
    except ProtocolError:
        return None


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _start_failure(status: Obj) -> str:
    """The kubelet's record of a container start the plugin's PreStartContainer refused ('' when there is none)."""
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in START_FAILURES and "PreStartContainer" in str(waiting.get("message", "")):
            return _one_line(f"{waiting['reason']}: {waiting.get('message', '')}")
    return ""


def refusal(pod: Obj, events: Sequence[Obj], now: datetime.datetime | None = None) -> str:
    """Why the pod was refused ('' when it was not), as the kubelet recorded it in the pod's status: its admission
    failure (Allocate refused), or a container start PreStartContainer refused. For the latter our plugin's latest
    believed Warning Event gives the words, where there is one (kubectlplugin/events.py)."""
    status = pod.get("status") or {}
    if status.get("reason") == ADMISSION_REFUSED:
        return _one_line(f"{ADMISSION_REFUSED}: {status.get('message', '')}")
    failure = _start_failure(status)
    if not failure:
        return ""
    return plugin_refusal(pod, events, now or datetime.datetime.now(datetime.UTC)) or failure


def _finished(pod: Obj) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") in ("Succeeded", "Failed") and status.get("reason") != ADMISSION_REFUSED


@dataclass(frozen=True)
class _Read:
    """A pod's GPU-share facts read from its annotations and spec; `problem` says what could not be read."""

    containers: tuple[ContainerRow, ...]
    total: int
    stamped: bool
    index: int | None
    assigned: bool | None
    memory: int | None
    problem: str = ""
    delivered: frozenset[str] = frozenset()  # the containers the device plugin's allocation record lists


def _containers(containers: Mapping[str, int], init: Mapping[str, int]) -> tuple[ContainerRow, ...]:
    return (*(ContainerRow(n, u, True) for n, u in init.items() if u),
            *(ContainerRow(n, u) for n, u in containers.items() if u))


def _read(pod: Obj, contract: Contract) -> _Read | None:
    """None when the pod has nothing to do with the shared resource."""
    annotations = read_annotations(pod)
    problems: list[str] = []
    try:
        demand = demand_of(pod, contract.resource)
    except ProtocolError as exc:
        demand, problems = Demand((), ()), [str(exc)]
    stamped = contract.intent_key in annotations
    containers = _containers(dict(demand.containers), {i.name: i.units for i in demand.init_containers})
    total = demand.total
    if stamped:
        try:
            intent = parse_intent(annotations[contract.intent_key], contract.intent_key)
            containers, total = _containers(intent.containers, intent.init_containers), intent.total
        except ProtocolError as exc:
            problems.append(str(exc))
    numbers: dict[str, int | None] = {}
    for key in (IDX, DEV, POD):
        try:
            numbers[key] = int_annotation(annotations, key)
        except ProtocolError as exc:
            numbers[key] = None
            problems.append(str(exc))
    index, memory, pod_units = numbers[IDX], numbers[DEV], numbers[POD]
    try:
        assigned = parse_assigned(annotations)
    except ProtocolError as exc:
        assigned, problems = None, [*problems, str(exc)]
    delivered: frozenset[str] = frozenset()
    if assigned and contract.allocation_key in annotations:
        try:
            delivered = frozenset(parse_allocation(annotations[contract.allocation_key],
                                                   contract.allocation_key).containers)
        except ProtocolError as exc:
            problems.append(str(exc))
    if not (total or stamped or index is not None or problems):
        return None
    # The extender promises the POD annotation's units on the GPU; without it the spec says what the pod asks.
    return _Read(containers, pod_units if pod_units is not None else total, stamped, index, assigned, memory,
                 "; ".join(problems), delivered)


def _deleting(pod: Obj, read: _Read) -> str:
    """Why a pod being deleted holds its units, or why it holds none (contract/holding.py)."""
    running = still_running(pod, [c.name for c in read.containers], read.delivered)
    if running:
        them = "containers" if len(running) > 1 else "container"
        return f"being deleted; GPU {them} {', '.join(running)} may still run, so its units are held until they stop"
    return "being deleted before a GPU container ran; its units are free again"


def _state(pod: Obj, read: _Read, refused: str) -> tuple[str, str]:
    if read.problem:
        return "invalid", read.problem
    if terminating(pod):
        return "deleting", _deleting(pod, read)
    if refused:
        return "refused", refused
    if read.assigned:
        return "allocated", ""
    if read.index is not None:
        return "assigned", ""
    return ("stamped", "") if read.stamped else ("requested", "")


def pod_row(pod: Obj, contract: Contract, events: Sequence[Obj] = (), now: datetime.datetime | None = None
            ) -> tuple[PodRow, int | None] | None:
    """The pod as a row, and the GPU memory its DEV annotation states; None when it is no GPU-share pod or it
    has finished (a finished pod holds no GPU memory). `now`: this machine's clock (default: read it)."""
    read = _read(pod, contract)
    if read is None or _finished(pod):
        return None
    state, reason = _state(pod, read, refusal(pod, events, now))
    meta = _meta(pod)
    node = (pod.get("spec") or {}).get("nodeName") or None
    counted = holds_memory(pod, [c.name for c in read.containers], read.delivered)
    row = PodRow(str(meta.get("namespace", "")), str(meta.get("name", "")), node, read.index, read.total,
                 read.containers, state, reason, counted)
    return row, read.memory


def _gpu_layout(node: Obj, resource: str) -> tuple[int, int | None]:
    """(GPU count, memory of one GPU) from node capacity; the reference extender assumes the GPUs alike. A count
    that is none, or more than MAX_GPUS, gives no GPU (the pods' indexes still do)."""
    capacity = (node.get("status") or {}).get("capacity") or {}
    count, total = _quantity(capacity.get(GPU_COUNT)), _quantity(capacity.get(resource))
    if not count or count > MAX_GPUS:
        return 0, None
    return count, (total // count if total is not None else None)


def build(nodes: Iterable[Obj], pods: Iterable[Obj], events: Iterable[Obj], contract: Contract, *,
          namespace: str | None = None, only_nodes: Sequence[str] = (), now: datetime.datetime | None = None,
          shares: Iterable[PodRow] = ()) -> Report:
    """Every GPU of every GPU-share node with the pods promised to it; pods bound without a GPU; pods pending.
    `shares`: rows of GPU memory held otherwise (DRA claims, kubectlplugin/dra.py), counted alike."""
    by_uid = by_pod(events)
    moment = now or datetime.datetime.now(datetime.UTC)
    rows: list[tuple[PodRow, int | None]] = [(row, None) for row in shares]
    for pod in pods:
        found = pod_row(pod, contract, by_uid.get(str(_meta(pod).get("uid", "")), ()), moment)
        if found is not None:
            rows.append(found)
    layouts = {}
    for node in nodes:
        name = str(_meta(node).get("name", ""))
        count, memory = _gpu_layout(node, contract.resource)
        capacity = ((node.get("status") or {}).get("capacity") or {}).get(contract.resource)
        if count or _quantity(capacity):
            layouts[name] = (count, memory)
    names = set(layouts) | {r.node for r, _ in rows if r.node}
    if only_nodes:
        names &= set(only_nodes)
    out = []
    for name in sorted(names):
        count, memory = layouts.get(name, (0, None))
        mine = [(r, m) for r, m in rows if r.node == name]
        indexes = sorted(set(range(count)) | {r.gpu for r, _ in mine if r.gpu is not None})
        gpus = []
        for index in indexes:
            on_gpu = [(r, m) for r, m in mine if r.gpu == index]
            stated = max((m for _, m in on_gpu if m is not None), default=None)
            gpus.append(GpuRow(index, stated if stated is not None else memory, _sorted(r for r, _ in on_gpu)))
        out.append(NodeRow(name, tuple(gpus), _sorted(r for r, _ in mine if r.gpu is None)))
    pending = () if only_nodes else _sorted(r for r, _ in rows if r.node is None)
    return Report(contract.resource, contract.unit, namespace, tuple(out), pending)


def _sorted(rows: Iterable[PodRow]) -> tuple[PodRow, ...]:
    return tuple(sorted(rows, key=lambda r: (r.namespace, r.name)))
