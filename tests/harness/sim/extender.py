"""A kube-scheduler + gpushare-extender stand-in that models the real extender: it bin-packs pending GPU-share pods
onto a node and GPU, then binds.

As the real extender's code does (../shared/reference-stack/gpushare-scheduler-extender, pkg/cache and pkg/utils):
- it places a pod by, and books on the GPU, the sum of its app containers' limits only (`spec.containers`,
  GetGPUMemoryFromPodResource), and writes that as ALIYUN_COM_GPU_MEM_POD;
- its cache frees a pod's memory as soon as the pod has a deletionTimestamp or is Succeeded/Failed (IsCompletePod),
  so it places the next pod on that GPU while the deleted one is still terminating;
- each binding writes ALIYUN_COM_GPU_MEM_IDX/DEV/POD/ASSUME_TIME and ASSIGNED="false" with a strategic-merge PATCH as
  the extender's service account, then POSTs the Binding;
- a pod whose app containers ask for nothing but whose init containers do passes its filter and fails every bind
  ("can't place the pod"), for ever.
The kube-scheduler beside it fits the pod's effective request (init containers and sidecars included) to the node's
allocatable, counting every pod bound there that is not finished, the terminating ones too: a replacement waits for
node room the kubelet still holds. Like the scheduler's asynchronous binding cycle, several bindings run at once with
seeded random delays, so the order of ASSUME_TIME and the order in which pods reach the kubelet differ. Decisions
themselves are serial.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

from contract import ProtocolError, demand_of, parse_assignment, read_annotations
from contract.keys import ASSIGNED, ASSUME_TIME, DEFAULT_RESOURCE, DEV, IDX, POD
from node.inventory import Gpu
from tests.harness.apiserver.ports import ApiError, Pod, PodApi

log = logging.getLogger(__name__)

EXTENDER_USER = "system:serviceaccount:kube-system:gpushare-schd-extender"


@dataclass(frozen=True)
class SimNode:
    name: str
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True)
class Placement:
    node: str
    index: int | None  # None: a pod without GPU-share limits, or one whose GPU the device plugin picks
    device_units: int
    pod_units: int  # what the extender books on the GPU and writes as POD: the app containers' sum
    request: int = 0  # what the scheduler counts on the node: the pod's effective request


def _meta(pod: Pod) -> dict[str, Any]:
    meta: dict[str, Any] = pod.get("metadata") or {}
    return meta


def _finished(pod: Pod) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_total(pod: Pod, resource: str) -> int:
    """The pod's effective request, which the kube-scheduler and the kubelet count."""
    try:
        return demand_of(pod, resource).total
    except ProtocolError:
        return 0


def app_units(pod: Pod, resource: str) -> int:
    """What the real extender places and books a pod by: its app containers' limits (GetGPUMemoryFromPodResource)."""
    try:
        return sum(units for _, units in demand_of(pod, resource).containers)
    except ProtocolError:
        return 0


def used_units(pods: Sequence[Pod], inflight: Sequence[Placement]) -> dict[tuple[str, int], int]:
    """Units per (node, GPU) in the real extender's cache: placed pods by their POD annotation, except complete ones
    (IsCompletePod: a deletionTimestamp, or Succeeded/Failed), whose memory it frees at once."""
    used: dict[tuple[str, int], int] = {}
    for pod in pods:
        if _finished(pod) or _meta(pod).get("deletionTimestamp"):
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        try:
            assignment = parse_assignment(read_annotations(pod))
        except ProtocolError:
            continue
        if node and assignment.index is not None and assignment.pod_units is not None:
            used[(node, assignment.index)] = used.get((node, assignment.index), 0) + assignment.pod_units
    for place in inflight:
        if place.index is not None:
            used[(place.node, place.index)] = used.get((place.node, place.index), 0) + place.pod_units
    return used


def node_room(nodes: Sequence[SimNode], pods: Sequence[Pod], inflight: Sequence[Placement], units: int,
              resource: str) -> list[tuple[int, SimNode]]:
    """The kube-scheduler's node fit: (units left after this pod, node) for each node whose allocatable still holds
    the pod's effective request beside every pod bound there that is not finished (terminating ones included)."""
    used: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and not _finished(pod):
            used[node] = used.get(node, 0) + pod_total(pod, resource)
    for place in inflight:
        used[place.node] = used.get(place.node, 0) + place.request
    room = [(sum(g.memory_units for g in node.gpus) - used.get(node.name, 0) - units, node) for node in nodes]
    return [(left, node) for left, node in room if left >= 0]


def node_fit(nodes: Sequence[SimNode], pods: Sequence[Pod], inflight: Sequence[Placement], units: int,
             resource: str) -> Placement | None:
    """The default scheduler without the extender: the node left with the least room; the GPU is left for the
    device plugin to pick (node-local placement)."""
    room = node_room(nodes, pods, inflight, units, resource)
    if not room:
        return None
    _, node = min(room, key=lambda r: (r[0], r[1].name))
    return Placement(node.name, None, 0, units, units)


def best_fit(nodes: Sequence[SimNode], used: dict[tuple[str, int], int], units: int,
             request: int = 0) -> Placement | None:
    """The GPU left with the least free memory after placing `units` (bin packing, as allocateGPUID picks the GPU
    with the least available memory that fits); ties: node, then index."""
    best: tuple[int, str, int] | None = None
    for node in nodes:
        for gpu in node.gpus:
            left = gpu.memory_units - used.get((node.name, gpu.index), 0) - units
            if left >= 0 and (best is None or (left, node.name, gpu.index) < best):
                best = (left, node.name, gpu.index)
    if best is None:
        return None
    node = next(n for n in nodes if n.name == best[1])
    gpu = next(g for g in node.gpus if g.index == best[2])
    return Placement(node.name, gpu.index, gpu.memory_units, units, request or units)


class Extender:
    """Watches all pods; schedules unbound ones serially; binds concurrently with jitter (seeded).

    With `place_gpus=False` it is the default scheduler alone: it fits pods to a node's total units and binds
    them without annotations, which is what node-local placement (cdi delivery) runs with.
    """

    def __init__(self, api: PodApi, nodes: Sequence[SimNode], *, resource: str = DEFAULT_RESOURCE, seed: int = 0,
                 max_jitter_s: float = 0.02, binders: int = 4, place_gpus: bool = True) -> None:
        self.api = api
        self.place_gpus = place_gpus
        self.nodes = tuple(nodes)
        self.resource = resource
        self.max_jitter_s = max_jitter_s
        self.unschedulable: dict[str, str] = {}  # pod uid -> why it waits
        self.bind_errors: dict[str, str] = {}
        self.bound: list[tuple[str, str, int | None]] = []  # (namespace/name, node, index) in bind order
        self._rng = random.Random(seed)
        self._pods: dict[str, Pod] = {}
        self._inflight: dict[str, Placement] = {}
        self._lock = threading.Condition()
        self._dirty = True
        self._closed = threading.Event()
        self._pool = futures.ThreadPoolExecutor(max_workers=binders, thread_name_prefix="sim-extender-bind")
        self._threads = [threading.Thread(target=self._watch_loop, name="sim-extender-watch", daemon=True),
                         threading.Thread(target=self._schedule_loop, name="sim-extender", daemon=True)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _watch_loop(self) -> None:
        version = ""
        while not self._closed.is_set():
            try:
                if not version:
                    pods, version = self.api.list_pods()
                    with self._lock:
                        self._pods = {_meta(p)["uid"]: p for p in pods}
                        self._dirty = True
                        self._lock.notify_all()
                for kind, pod in self.api.watch_pods(version, timeout_s=0.5):
                    version = _meta(pod).get("resourceVersion", version)
                    with self._lock:
                        uid = _meta(pod)["uid"]
                        if kind == "DELETED":
                            self._pods.pop(uid, None)
                            self._inflight.pop(uid, None)
                        else:
                            self._pods[uid] = pod
                            if (pod.get("spec") or {}).get("nodeName"):
                                self._inflight.pop(uid, None)
                        self._dirty = True
                        self._lock.notify_all()
            except ApiError as exc:
                if exc.code == 410:
                    version = ""
                self._closed.wait(0.1)
            except Exception:  # keep watching through a flaky server
                log.exception("extender: watching pods failed; retrying")
                self._closed.wait(0.1)

    def _schedule_loop(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                while not self._dirty and not self._closed.is_set():
                    self._lock.wait(0.5)
                self._dirty = False
                skip = self._inflight.keys() | self.bind_errors.keys()
                pending = sorted(
                    (p for uid, p in self._pods.items() if uid not in skip and self._unbound(p)),
                    key=lambda p: (_meta(p).get("creationTimestamp", ""), _meta(p).get("name", "")),
                )
                for pod in pending:
                    self._schedule(pod)

    @staticmethod
    def _unbound(pod: Pod) -> bool:
        return (not (pod.get("spec") or {}).get("nodeName") and not _meta(pod).get("deletionTimestamp")
                and (pod.get("status") or {}).get("phase", "Pending") == "Pending")

    def _schedule(self, pod: Pod) -> None:
        """Called with the lock held: decide, remember the assumption, hand the binding to a binder."""
        uid = _meta(pod)["uid"]
        units = pod_total(pod, self.resource)
        if units:
            place = self._fit(pod, units)
            if place is None:
                where = "GPU" if self.place_gpus else "node"
                self.unschedulable[uid] = (
                    f"0/{len(self.nodes)} nodes are available: no {where} has {units} free units for pod "
                    f"{_meta(pod).get('namespace')}/{_meta(pod).get('name')}"
                )
                return
        else:
            place = Placement(self.nodes[len(self.bound) % len(self.nodes)].name, None, 0, 0)
        self.unschedulable.pop(uid, None)
        self._inflight[uid] = place
        jitter = self._rng.uniform(0, self.max_jitter_s)
        self._pool.submit(self._bind, pod, place, jitter)

    def _fit(self, pod: Pod, units: int) -> Placement | None:
        """The scheduler's node fit (the effective request), then, with the extender, its GPU fit by the app
        containers' sum; a pod whose app containers ask for nothing passes the extender's filter on any node."""
        settled = [p for u, p in self._pods.items() if u not in self._inflight]
        inflight = list(self._inflight.values())
        if not self.place_gpus:
            return node_fit(self.nodes, settled, inflight, units, self.resource)
        room = [node for _, node in node_room(self.nodes, settled, inflight, units, self.resource)]
        booked = app_units(pod, self.resource)
        if not booked:
            return Placement(room[0].name, None, 0, 0, units) if room else None  # its bind will fail
        return best_fit(room, used_units(settled, inflight), booked, units)

    def _bind(self, pod: Pod, place: Placement, jitter: float) -> None:
        meta = _meta(pod)
        namespace, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta["uid"]
        try:
            if self.place_gpus and place.index is None and place.request:
                # allocateGPUID finds no GPU for a request of 0 (Allocate in pkg/cache/nodeinfo.go).
                raise ApiError(500, f"The node {place.node} can't place the pod {name} in ns {namespace}")
            if place.index is not None:
                annotations = {IDX: str(place.index), DEV: str(place.device_units), POD: str(place.pod_units),
                               ASSUME_TIME: str(time.time_ns()), ASSIGNED: "false"}
                self.api.patch_pod(namespace, name, {"metadata": {"annotations": annotations}}, strategic=True)
            time.sleep(jitter)  # the binding goroutines race each other here
            self.api.bind(namespace, name, place.node)
            with self._lock:
                self.bound.append((f"{namespace}/{name}", place.node, place.index))
        except ApiError as exc:
            with self._lock:
                if exc.code != 404:
                    self.bind_errors[uid] = exc.message
                self._inflight.pop(uid, None)
            return
        with self._lock:
            # Keep the assumption until the watch shows the bound pod, so its units are never counted twice
            # nor missed: drop it once the cache has the node name.
            cached = self._pods.get(uid)
            if cached is None or (cached.get("spec") or {}).get("nodeName"):
                self._inflight.pop(uid, None)
            else:
                self._inflight[uid] = place
            self._dirty = True
            self._lock.notify_all()
