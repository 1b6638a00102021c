"""The bug report's scenario on the real node, for any stack: run it, and count what every live pod received.

30 GPU-share pods of 8 GiB from a ReplicaSet (`kubectl create`) on 4 x 64 GiB, a 10-second image pull, 10 pods
deleted while their image is pulled and replaced by the real ReplicaSet controller. The stacks: "reference" (the
reference algorithm's plugin, NVIDIA_VISIBLE_DEVICES a GPU UUID or no-gpu-has-…), "env" and "cdi" (ours).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from deviceplugin.inventory import fake_gpus
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.e2e import workloads as w

REPLICAS, UNITS, DELETE = 30, 8, 10
PULL_MS = 10000
SETTLE_S = 300


@dataclass
class Outcome:
    stack: str
    namespace: str
    pods: int = 0
    started: int = 0
    on_recorded_gpu: int = 0
    wrong_gpu: list[str] = field(default_factory=list)
    made_up: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    over_committed: dict[int, int] = field(default_factory=dict)  # GPU index -> units received on it, over capacity
    promised_per_gpu: dict[int, int] = field(default_factory=dict)
    seconds: float | None = None  # the ReplicaSet's creation to the last container start (API server timestamps)

    @property
    def failed(self) -> bool:
        """The bug report's failure: a container refused or stuck, started on a made-up device or on a GPU its
        pod was not given, or a GPU given more than it has."""
        return bool(self.wrong_gpu or self.made_up or self.stuck or self.over_committed)

    def as_json(self) -> str:
        return json.dumps(self.__dict__)


def received_gpu(rep: w.Report, stack: str, cluster: Cluster) -> int | None:
    """The GPU index a container really received, or None when what it received names no GPU of the node."""
    s = cluster.settings
    if stack != "reference":
        return w.gpu_of(rep, stack, s.node_name, s.fake_gpus)
    # The reference answers NVIDIA_VISIBLE_DEVICES=<GPU UUID> (allocate.go, GetDeviceNameByIndex) or no-gpu-has-….
    return {g.uuid: g.index for g in fake_gpus(s.fake_gpus, s.node_name, "GiB")}.get(rep.visible)


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def outcome(cluster: Cluster, kubectl: Kubectl, namespace: str, stack: str, live: list[dict[str, Any]]) -> Outcome:
    s = cluster.settings
    capacity = fake_gpus(s.fake_gpus, s.node_name, "GiB")[0].memory_units
    out = Outcome(stack, namespace, pods=len(live), promised_per_gpu=w.promised(live))
    received: dict[int, int] = {}
    starts: list[datetime] = []
    for p in live:
        name = p["metadata"]["name"]
        if not w.running(p):
            out.stuck.append(f"{name}: {w.reason(p)}")
            continue
        out.started += 1
        for status in (p.get("status") or {}).get("containerStatuses") or []:
            started_at = ((status.get("state") or {}).get("running") or {}).get("startedAt")
            if started_at:
                starts.append(_time(started_at))
        rep = w.report(kubectl, namespace, name, "main")
        got = None if rep is None else received_gpu(rep, stack, cluster)
        if got is None:
            out.made_up.append(f"{name}: {rep.visible if rep else 'no report'}")
            continue
        received[got] = received.get(got, 0) + UNITS
        if got != w.assigned_index(p):
            out.wrong_gpu.append(f"{name}: got GPU {got}, annotation says {w.assigned_index(p)}")
        else:
            out.on_recorded_gpu += 1
    out.over_committed = {gpu: units for gpu, units in sorted(received.items()) if units > capacity}
    created = kubectl.ok(["get", "replicaset", "bug", "-n", namespace, "-o",
                          "jsonpath={.metadata.creationTimestamp}"]).strip()
    if starts and created:
        out.seconds = (max(starts) - _time(created)).total_seconds()
    return out


def run(cluster: Cluster, kubectl: Kubectl, namespace: str, stack: str) -> Outcome:
    """Create, delete while pulling, wait (bounded) for 30 live pods running or failed, and count."""
    template = w.pod("x", [w.container("main", w.image(cluster, PULL_MS), UNITS)])
    code, text = w.create(kubectl, namespace, w.replicaset("bug", REPLICAS, template))
    if code != 0:
        raise AssertionError(f"creating the ReplicaSet failed: {text}")

    def pulling() -> list[str]:
        items = w.pods(kubectl, namespace, "app=bug")
        return [p["metadata"]["name"] for p in items if p["spec"].get("nodeName") and not w.running(p)]

    # Delete pods the kubelet has admitted (their devices are allocated) while their image is still pulled.
    w.wait(f"{DELETE} pods bound and still pulling", lambda: len(pulling()) >= DELETE, 120, 0.5)
    kubectl.ok(["delete", "pods", "-n", namespace, "--wait=false", *pulling()[:DELETE]])

    def live() -> list[dict[str, Any]]:
        return [p for p in w.pods(kubectl, namespace, "app=bug") if not p["metadata"].get("deletionTimestamp")]

    with contextlib.suppress(AssertionError):  # a pod that never settles is counted as stuck, with its reason
        w.wait(f"{REPLICAS} live pods, all running or failed",
               lambda: len(items := live()) == REPLICAS and all(w.settled(p) for p in items), SETTLE_S, 2)
    return outcome(cluster, kubectl, namespace, stack, live())


@dataclass
class Probe:
    """A pod with two GPU containers of 4 GiB: what each container received."""

    stack: str
    ok: bool  # both containers started on the pod's recorded GPU
    detail: str


def two_containers(cluster: Cluster, kubectl: Kubectl, namespace: str, stack: str) -> Probe:
    """One pod whose 8 GiB are split over two containers: the kubelet calls Allocate once per container."""
    img = w.image(cluster)
    code, text = w.create(kubectl, namespace, w.pod("two", [w.container("a", img, 4), w.container("b", img, 4)]))
    if code != 0:
        return Probe(stack, False, f"refused at creation: {text.strip()}")
    with contextlib.suppress(AssertionError):
        w.wait("the two-container pod running or failed", lambda: all(map(w.settled, w.pods(kubectl, namespace))),
               120, 1)
    [p] = w.pods(kubectl, namespace)
    if not w.running(p):
        return Probe(stack, False, f"stuck: {w.reason(p)}")
    recorded = w.assigned_index(p)
    seen = []
    for name in ("a", "b"):
        rep = w.report(kubectl, namespace, "two", name)
        got = None if rep is None else received_gpu(rep, stack, cluster)
        seen.append((name, got, rep.visible if rep else "no report"))
    ok = all(got is not None and got == recorded for _, got, _ in seen)
    detail = "; ".join(f"{name}: {visible}" + ("" if got == recorded else f" (GPU {got})")
                       for name, got, visible in seen)
    return Probe(stack, ok, f"recorded GPU {recorded}; {detail}")
