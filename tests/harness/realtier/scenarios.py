"""Running a scenario (tests/harness/scenarios.py: the bug report and its relatives) on the real node, for any stack,
and counting what every live pod's GPU containers received, and what the device plugin said about them, into the
judge's Outcome (tests/harness/judge.py).

Stacks: "reference" (the reference extender with the reference device plugin, no admission control; its plugin
answers NVIDIA_VISIBLE_DEVICES=<GPU index> or no-gpu-has-…), "env" and "cdi" (the reference extender with ours).
Each scenario's groups are ReplicaSets created with one `kubectl create`.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from typing import Any

from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.harness.judge import Outcome, over_capacity
from tests.harness.realtier import workloads as w
from tests.harness.scenarios import PodShape, Scenario

SETTLE_S = 300
PLUGIN = "gpushare-device-plugin"  # the source component of our plugin's Events
ALLOCATED = "GpuShareAllocated"  # its Normal Event for a container given its GPU; every other reason is a refusal
# What the kubelet logs for every plugin that registers (pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go).
REGISTERED = b"Got registration request from device plugin"


def template(shape: PodShape, img: str) -> dict[str, Any]:
    """A group's pod on the real node: app containers "c0", "c1", ... with the shape's units, and its first init
    container (if any) as "prep"."""
    init = [w.container("prep", img, shape.init[0], then="exit 0")] if shape.init and shape.init[0] else None
    return w.pod("x", [w.container(f"c{i}", img, u) for i, u in enumerate(shape.containers)], init)


def gpu_containers(shape: PodShape) -> dict[str, int]:
    named = {f"c{i}": u for i, u in enumerate(shape.containers)}
    return {**({"prep": shape.init[0]} if shape.init and shape.init[0] else {}), **named}


def received_gpu(rep: w.Report, stack: str, cluster: Cluster) -> int | None:
    """The GPU index a container really received, or None when what it received names no GPU of the node. The
    reference plugin at its pinned commit answers the index (allocate.go; its #50), as env delivery does."""
    s = cluster.settings
    return w.gpu_of(rep, "env" if stack == "reference" else stack, s.node_name, s.fake_gpus)


def _shape_of(pod: dict[str, Any], scenario: Scenario) -> PodShape:
    app = (pod["metadata"].get("labels") or {}).get("app")
    return next(g.shape for g in scenario.groups if g.name == app)


def outcome(cluster: Cluster, kubectl: Kubectl, namespace: str, stack: str, scenario: Scenario,
            every: list[dict[str, Any]]) -> Outcome:
    s = cluster.settings
    capacity = w.fake_capacity(s)
    live = [p for p in every if not p["metadata"].get("deletionTimestamp")]
    out = Outcome(stack, scenario.name, namespace, pods=len(live), promised_per_gpu=w.promised(live))
    received: dict[int, int] = {}
    running = w.sort_live(live, out.rejected, out.stuck)
    out.started = len(running)
    for p in running:
        name = p["metadata"]["name"]
        shape, recorded, gpus = _shape_of(p, scenario), w.assigned_index(p), set()
        for container_name in gpu_containers(shape):
            rep = w.report(kubectl, namespace, name, container_name)
            got = None if rep is None else received_gpu(rep, stack, cluster)
            out.received(f"{name}/{container_name}", got, recorded, rep.visible if rep else "no report")
            if got is not None:
                gpus.add(got)
        if gpus == {recorded}:
            out.on_recorded_gpu += 1
        for gpu in gpus:  # a pod holds its whole request on every GPU its containers were given
            received[gpu] = received.get(gpu, 0) + sum(shape.containers)
    out.over_committed = over_capacity(received, lambda _: capacity)
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
    w.time_to_start(out, running, live, created)
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
        code, text = w.create(kubectl, namespace, *[w.replicaset(g.name, g.replicas, template(g.shape, img))
                                                     for g in scenario.groups])
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
