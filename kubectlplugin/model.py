"""What `kubectl gpushare` shows, decided from nodes, pods and Events as plain dicts (pure: no API access)."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from webhook.holding import holds_memory, still_running, terminating
from webhook.protocol import (
    DEV,
    IDX,
    POD,
    Contract,
    Demand,
    ProtocolError,
    demand_of,
    parse_allocation,
    parse_assigned,
    parse_intent,
    read_annotations,
)

Obj = Mapping[str, Any]

# The node capacity our device plugin and the reference one (pkg/gpu/nvidia/const.go, CountName) publish beside the
# memory resource.
GPU_COUNT: Final = "aliyun.com/gpu-count"
# The Events our device plugin posts carry this component (deviceplugin/apiserver.py COMPONENT).
PLUGIN_COMPONENT: Final = "gpushare-device-plugin"
ALLOCATED_REASON: Final = "GpuShareAllocated"
# What the kubelet reports when a device plugin's Allocate fails (pkg/kubelet/lifecycle/predicate.go).
ADMISSION_REFUSED: Final = "UnexpectedAdmissionError"
# Container start failures whose message comes from the plugin's PreStartContainer (pkg/kubelet/cm/devicemanager).
START_FAILURES: Final = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")

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


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def _int(value: object) -> int | None:
    text = str(value).strip() if value is not None else ""
    return int(text) if text.isdigit() and len(text) <= 19 else None


def _timestamp(event: Obj) -> datetime.datetime:
    """When an Event last happened; core/v1 Events carry lastTimestamp, events.k8s.io ones eventTime."""
    for value in (event.get("lastTimestamp"), event.get("eventTime"), event.get("firstTimestamp"),
                  _meta(event).get("creationTimestamp")):
        if isinstance(value, str) and value:
            try:
                when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
            return when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)
    return datetime.datetime.min.replace(tzinfo=datetime.UTC)


def _involved(event: Obj) -> Obj:
    involved: Obj = event.get("involvedObject") or event.get("regarding") or {}
    return involved


def _ours(event: Obj) -> bool:
    """An Event our device plugin posted about a pod (core/v1 `source`, or events.k8s.io's reporting fields)."""
    source = (event.get("source") or {}).get("component") or event.get("reportingComponent") or \
        event.get("reportingController")
    return source == PLUGIN_COMPONENT and _involved(event).get("kind") == "Pod"


def _plugin_events(events: Iterable[Obj]) -> dict[str, list[Obj]]:
    """Our device plugin's Events, by the uid of the pod they are about."""
    out: dict[str, list[Obj]] = {}
    for event in events:
        uid = _involved(event).get("uid")
        if uid and _ours(event):
            out.setdefault(str(uid), []).append(event)
    return out


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def refusal(pod: Obj, events: Sequence[Obj]) -> str:
    """Why the pod was refused ('' when it was not): the kubelet's admission failure, a start failure, or our
    plugin's latest Warning Event when no allocation followed it."""
    status = pod.get("status") or {}
    if status.get("reason") == ADMISSION_REFUSED:
        return _one_line(f"{ADMISSION_REFUSED}: {status.get('message', '')}")
    events = [e for e in events if _ours(e)]
    latest_allocation = max((_timestamp(e) for e in events if e.get("reason") == ALLOCATED_REASON), default=None)
    warnings = sorted((e for e in events if e.get("type") == "Warning"
                       and (latest_allocation is None or _timestamp(e) > latest_allocation)), key=_timestamp)
    if warnings:
        return _one_line(f"{warnings[-1].get('reason', '')}: {warnings[-1].get('message', '')}")
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in START_FAILURES and "PreStartContainer" in str(waiting.get("message", "")):
            return _one_line(f"{waiting['reason']}: {waiting.get('message', '')}")
    return ""


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
    index, memory, pod_units = (_int(annotations.get(k)) for k in (IDX, DEV, POD))
    for key, value in ((IDX, index), (DEV, memory), (POD, pod_units)):
        if key in annotations and value is None:
            problems.append(f"annotation {key} is {annotations[key]!r}, not a whole number")
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
    """Why a pod being deleted holds its units, or why it holds none (webhook/holding.py)."""
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


def pod_row(pod: Obj, contract: Contract, events: Sequence[Obj] = ()) -> tuple[PodRow, int | None] | None:
    """The pod as a row, and the GPU memory its DEV annotation states; None when it is no GPU-share pod or it
    has finished (a finished pod holds no GPU memory)."""
    read = _read(pod, contract)
    if read is None or _finished(pod):
        return None
    state, reason = _state(pod, read, refusal(pod, events))
    meta = _meta(pod)
    node = (pod.get("spec") or {}).get("nodeName") or None
    counted = holds_memory(pod, [c.name for c in read.containers], read.delivered)
    row = PodRow(str(meta.get("namespace", "")), str(meta.get("name", "")), node, read.index, read.total,
                 read.containers, state, reason, counted)
    return row, read.memory


def _gpu_layout(node: Obj, resource: str) -> tuple[int, int | None]:
    """(GPU count, memory of one GPU) from node capacity; the reference extender assumes the GPUs alike."""
    capacity = (node.get("status") or {}).get("capacity") or {}
    count, total = _int(capacity.get(GPU_COUNT)), _int(capacity.get(resource))
    if not count:
        return 0, None
    return count, (total // count if total is not None else None)


def build(nodes: Iterable[Obj], pods: Iterable[Obj], events: Iterable[Obj], contract: Contract, *,
          namespace: str | None = None, only_nodes: Sequence[str] = ()) -> Report:
    """Every GPU of every GPU-share node with the pods promised to it; pods bound without a GPU; pods pending."""
    by_uid = _plugin_events(events)
    rows: list[tuple[PodRow, int | None]] = []
    for pod in pods:
        found = pod_row(pod, contract, by_uid.get(str(_meta(pod).get("uid", "")), ()))
        if found is not None:
            rows.append(found)
    layouts = {}
    for node in nodes:
        name = str(_meta(node).get("name", ""))
        count, memory = _gpu_layout(node, contract.resource)
        capacity = ((node.get("status") or {}).get("capacity") or {}).get(contract.resource)
        if count or _int(capacity):
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
