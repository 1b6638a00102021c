"""The bug report's scenario and its relatives on the real node, for any stack: run one, and count what every live
pod's GPU containers received, and what the device plugin said about them.

Stacks: "reference" (the reference extender with the reference device plugin, no admission control; its plugin
answers NVIDIA_VISIBLE_DEVICES=<GPU index> or no-gpu-has-…), "env" and "cdi" (the reference extender with ours).
Scenarios (each a set of ReplicaSets created with one `kubectl create`):
- BUG_REPORT: 30 pods of 8 GiB on 4 x 64 GiB, a 10-second pull, 10 pods deleted while their image is pulled and
  replaced by the real ReplicaSet controller;
- MIXED: four sizes created together, 8 deleted while pulling;
- INIT: pods whose init container has GPU memory (no more than the app containers), two app containers after one;
- KUBELET_DOWN: 16 pods of 8 GiB bound while the kubelet is down, admitted as one batch when it starts.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.harness.realtier import workloads as w

SETTLE_S = 300
PLUGIN = "gpushare-device-plugin"  # the source component of our plugin's Events
ALLOCATED = "GpuShareAllocated"  # its Normal Event for a container given its GPU; every other reason is a refusal
# What the kubelet logs for every plugin that registers (pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go).
REGISTERED = b"Got registration request from device plugin"


@dataclass(frozen=True)
class Shape:
    """One ReplicaSet: app containers "c0", "c1", … with these units, and optionally one init container "prep"."""

    name: str
    replicas: int
    units: tuple[int, ...]
    init_units: int | None = None

    def template(self, img: str) -> dict[str, Any]:
        init = [w.container("prep", img, self.init_units, then="exit 0")] if self.init_units else None
        return w.pod("x", [w.container(f"c{i}", img, u) for i, u in enumerate(self.units)], init)

    @property
    def gpu_containers(self) -> dict[str, int]:
        named = {f"c{i}": u for i, u in enumerate(self.units)}
        return {**({"prep": self.init_units} if self.init_units else {}), **named}


@dataclass(frozen=True)
class Scenario:
    name: str
    shapes: tuple[Shape, ...]
    pull_ms: int
    delete: int = 0  # pods deleted while their image is pulled
    kubelet_down: bool = False  # bound while the kubelet is stopped, admitted as one batch when it starts

    @property
    def replicas(self) -> int:
        return sum(s.replicas for s in self.shapes)


BUG_REPORT = Scenario("the bug report", (Shape("bug", 30, (8,)),), 10000, delete=10)
MIXED = Scenario("mixed sizes, deletions while pulling",
                 (Shape("s4", 8, (4,)), Shape("s8", 6, (8,)), Shape("s12", 4, (12,)), Shape("s16", 4, (16,))),
                 8000, delete=8)
INIT = Scenario("init containers with GPU memory",
                (Shape("init-smaller", 4, (8,), init_units=4), Shape("init-equal", 4, (8,), init_units=8),
                 Shape("two-apps", 4, (4, 4), init_units=8)), 4000, delete=3)
TWO_CONTAINERS = Scenario("two GPU containers per pod", (Shape("two", 4, (4, 4)),), 2000)
KUBELET_DOWN = Scenario("bound while the kubelet is down", (Shape("down", 16, (8,)),), 4000, kubelet_down=True)
SCENARIOS = (BUG_REPORT, MIXED, INIT, TWO_CONTAINERS, KUBELET_DOWN)


@dataclass
class Outcome:
    stack: str
    scenario: str
    namespace: str
    pods: int = 0
    started: int = 0
    on_recorded_gpu: int = 0
    wrong_gpu: list[str] = field(default_factory=list)
    made_up: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # failed admission (UnexpectedAdmissionError), replaced
    over_committed: dict[int, int] = field(default_factory=dict)  # GPU index -> units received on it, over capacity
    promised_per_gpu: dict[int, int] = field(default_factory=dict)
    plugin_refusals: dict[str, int] = field(default_factory=dict)  # our plugin's refusal Events by reason
    plugin_messages: list[str] = field(default_factory=list)  # one refusal message per reason
    seconds: float | None = None  # the first ReplicaSet's creation to the last container start (API server clock)
    last_pod: dict[str, Any] = field(default_factory=dict)  # where that time went (workloads.last_start_path)

    @property
    def failed(self) -> bool:
        """The bug report's failure: a container refused or stuck, started on a made-up device or on a GPU its
        pod was not given, or a GPU given more than it has."""
        return bool(self.wrong_gpu or self.made_up or self.stuck or self.over_committed)

    def as_json(self) -> str:
        return json.dumps(self.__dict__)


def received_gpu(rep: w.Report, stack: str, cluster: Cluster) -> int | None:
    """The GPU index a container really received, or None when what it received names no GPU of the node. The
    reference plugin at its pinned commit answers the index (allocate.go; its #50), as env delivery does."""
    s = cluster.settings
    return w.gpu_of(rep, "env" if stack == "reference" else stack, s.node_name, s.fake_gpus)


def _shape_of(pod: dict[str, Any], scenario: Scenario) -> Shape:
    app = (pod["metadata"].get("labels") or {}).get("app")
    return next(s for s in scenario.shapes if s.name == app)


def outcome(cluster: Cluster, kubectl: Kubectl, namespace: str, stack: str, scenario: Scenario,
            every: list[dict[str, Any]]) -> Outcome:
    s = cluster.settings
    capacity = w.fake_capacity(s)
    live = [p for p in every if not p["metadata"].get("deletionTimestamp")]
    out = Outcome(stack, scenario.name, namespace, pods=len(live), promised_per_gpu=w.promised(live))
    received: dict[int, int] = {}
    starts: list[datetime] = []
    for p in live:
        name = p["metadata"]["name"]
        if w.phase(p) == "Failed":
            out.rejected.append(f"{name}: {w.reason(p)}")
            continue
        if not w.running(p):
            out.stuck.append(f"{name}: {w.reason(p)}")
            continue
        out.started += 1
        starts.extend(w.started_at(p))
        shape, recorded, gpus = _shape_of(p, scenario), w.assigned_index(p), set()
        for container_name in shape.gpu_containers:
            rep = w.report(kubectl, namespace, name, container_name)
            got = None if rep is None else received_gpu(rep, stack, cluster)
            if got is None:
                out.made_up.append(f"{name}/{container_name}: {rep.visible if rep else 'no report'}")
            elif got != recorded:
                out.wrong_gpu.append(f"{name}/{container_name}: got GPU {got}, annotation says {recorded}")
            if got is not None:
                gpus.add(got)
        if gpus == {recorded}:
            out.on_recorded_gpu += 1
        for gpu in gpus:  # a pod holds its whole request on every GPU its containers were given
            received[gpu] = received.get(gpu, 0) + sum(shape.units)
    out.over_committed = {gpu: units for gpu, units in sorted(received.items()) if units > capacity}
    plugin_events = [e for e in kubectl.json(["get", "events", "-n", namespace])["items"]
                     if ((e.get("source") or {}).get("component") == PLUGIN
                         or (e.get("reportingComponent") or "") == PLUGIN) and e.get("reason") != ALLOCATED]
    refusals: Counter[str] = Counter()
    for e in plugin_events:
        refusals[str(e.get("reason"))] += int(e.get("count") or 1)  # the API server folds repeats into one Event
    out.plugin_refusals = dict(refusals)
    out.plugin_messages = list({str(e.get("reason")): str(e.get("message")) for e in plugin_events}.values())
    created = [w.stamp(t) for t in kubectl.ok(["get", "replicasets", "-n", namespace, "-o",
                                               "jsonpath={.items[*].metadata.creationTimestamp}"]).split()]
    if starts and created:
        out.seconds = (max(starts) - min(created)).total_seconds()
        out.last_pod = w.last_start_path(live, min(created))
    return out


def _bound(p: dict[str, Any]) -> bool:
    return bool(p["spec"].get("nodeName")) and w.assigned_index(p) is not None


def restart_kubelet(cluster: Cluster) -> None:
    """Start the kubelet again and wait until a device plugin (whichever runs) has registered with it."""
    log = cluster.log("kubelet")
    offset = log.stat().st_size
    cluster.start_kubelet()
    cluster.procs.wait_ready("kubelet", lambda: REGISTERED in log.read_bytes()[offset:], 60,
                             "a device plugin registered again")


def run(cluster: Cluster, kubectl: Kubectl, namespace: str, stack: str, scenario: Scenario) -> Outcome:
    """Create, (delete while pulling | bind while the kubelet is down), wait (bounded) for every live pod running
    or failed, and count."""
    img = w.image(cluster, scenario.pull_ms)
    if scenario.kubelet_down:
        cluster.procs.stop("kubelet")
    try:
        code, text = w.create(kubectl, namespace, *[w.replicaset(s.name, s.replicas, s.template(img))
                                                     for s in scenario.shapes])
        if code != 0:
            raise AssertionError(f"creating the ReplicaSets of {scenario.name} failed: {text}")
        if scenario.kubelet_down:
            # Within the node controller's grace period (40 s here) the node is still Ready and pods are bound.
            w.wait(f"{scenario.replicas} pods bound by the extender while the kubelet is down",
                   lambda: sum(map(_bound, w.pods(kubectl, namespace))) >= scenario.replicas, 30, 0.5)
    finally:
        if scenario.kubelet_down:
            restart_kubelet(cluster)

    def pulling() -> list[str]:
        return [p["metadata"]["name"] for p in w.pods(kubectl, namespace)
                if p["spec"].get("nodeName") and not w.running(p) and w.phase(p) == "Pending"]

    if scenario.delete:
        # Delete pods the kubelet has admitted (their devices are allocated) while their image is still pulled.
        w.wait(f"{scenario.delete} pods bound and still pulling", lambda: len(pulling()) >= scenario.delete, 120, 0.5)
        kubectl.ok(["delete", "pods", "-n", namespace, "--wait=false", *pulling()[:scenario.delete]])

    def live() -> list[dict[str, Any]]:
        return [p for p in w.pods(kubectl, namespace) if not p["metadata"].get("deletionTimestamp")]

    def settled() -> bool:
        items = live()
        # A pod the kubelet rejected stays Failed beside its replacement: count the pods that may still run.
        return len([p for p in items if w.phase(p) != "Failed"]) >= scenario.replicas and all(map(w.settled, items))

    with contextlib.suppress(AssertionError):  # a pod that never settles is counted as stuck, with its reason
        w.wait(f"{scenario.replicas} live pods of {scenario.name}, all running or failed", settled, SETTLE_S, 2)
    time.sleep(1)  # the last Events reach the API server
    return outcome(cluster, kubectl, namespace, stack, scenario, w.pods(kubectl, namespace))
