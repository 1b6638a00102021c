"""Running a scenario (tests/harness/scenarios.py) on a simulated cluster: concurrent creation, deletions during the
pull, kubelet restarts, and the judge's verdict."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

from tests.harness.apiserver.ports import ApiError, Pod
from tests.harness.judge import Observation, Summary, Violation, check, summarize
from tests.harness.scenarios import BUG_REPORT_GPUS, PodShape, Scenario
from tests.harness.sim.cluster import ClusterSpec, PluginKind, SimCluster
from tests.harness.sim.replicaset import ReplicaSet

_namespaces = itertools.count()


@dataclass
class Result:
    scenario: Scenario
    namespace: str
    observation: Observation
    violations: list[Violation]
    summary: Summary
    elapsed_s: float
    create_errors: list[str] = field(default_factory=list)
    deleted_names: dict[str, str] = field(default_factory=dict)  # UID -> name of each pod the scenario deleted

    def explain(self) -> str:
        lines = [f"scenario {self.scenario} in namespace {self.namespace}: {self.summary}"]
        lines += [f"  {v.kind}: {v.message}" for v in self.violations]
        lines += [f"  create refused: {e}" for e in self.create_errors]
        return "\n".join(lines)


def _meta(pod: Pod) -> dict[str, Any]:
    meta: dict[str, Any] = pod.get("metadata") or {}
    return meta


def _pods(cluster: SimCluster, namespace: str) -> list[Pod]:
    return [p for p in cluster.admin.list_pods()[0] if _meta(p).get("namespace") == namespace]


def _settled(cluster: SimCluster, namespace: str, groups: Sequence[ReplicaSet]) -> bool:
    extender = cluster.extender
    waiting = set(extender.unschedulable) | set(extender.bind_errors) if extender is not None else set()
    for pod in _pods(cluster, namespace):
        status = pod.get("status") or {}
        phase = status.get("phase", "Pending")
        if _meta(pod).get("deletionTimestamp"):
            return False
        if phase in ("Running", "Failed", "Succeeded"):
            continue
        bound = (pod.get("spec") or {}).get("nodeName")
        messages = [((s.get("state") or {}).get("waiting") or {}).get("message")
                    for s in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]]
        if bound and any(messages):
            continue
        if not bound and _meta(pod).get("uid") in waiting:
            continue
        return False
    return all(rs.settled() for rs in groups)


def wait_settled(cluster: SimCluster, namespace: str, groups: Sequence[ReplicaSet], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    stable = 0
    while time.monotonic() < deadline:
        stable = stable + 1 if _settled(cluster, namespace, groups) else 0
        if stable >= 3:
            return True
        time.sleep(0.03)
    return False


def _delete_some(cluster: SimCluster, namespace: str, scenario: Scenario, rng: random.Random,
                 total: int) -> dict[str, str]:
    """Delete pods as their owner would, preferring pods that are admitted by their kubelet but not yet running
    (pulling)."""
    deadline = time.monotonic() + 10
    extender = cluster.extender
    while time.monotonic() < deadline:  # until every first pod is bound, or waits for room with a reason
        waiting = set(extender.unschedulable) | set(extender.bind_errors) if extender is not None else set()
        pods = _pods(cluster, namespace)
        placed = [p for p in pods if (p.get("spec") or {}).get("nodeName") or _meta(p).get("uid") in waiting]
        if len(placed) >= total:
            break
        time.sleep(0.01)
    time.sleep(scenario.delete_after_s)
    # Pulling: bound, not running, and admitted by its kubelet (its devices allocated), as a pod whose image is
    # being pulled is. On a loaded machine the kubelet may not have admitted them yet: wait (bounded) for it.
    deadline = time.monotonic() + 5
    while True:
        admitted = {uid for k in cluster.kubelets for uid in k.devices.by_pod()}
        pods = sorted(_pods(cluster, namespace), key=lambda p: _meta(p).get("name", ""))
        bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")
                 and (p.get("status") or {}).get("phase") == "Pending"]
        pulling = [p for p in bound if _meta(p).get("uid") in admitted]
        if len(pulling) >= scenario.delete or len(pulling) == len(bound) or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    chosen = rng.sample(pulling, min(scenario.delete, len(pulling)))
    rest = [p for p in pods if p not in chosen]
    chosen += rng.sample(rest, min(scenario.delete - len(chosen), len(rest)))
    deleted: dict[str, str] = {}
    for pod in chosen:
        try:
            cluster.user.delete_pod(namespace, _meta(pod)["name"])
            deleted[_meta(pod)["uid"]] = _meta(pod)["name"]
        except ApiError as exc:
            if exc.code != 404:
                raise
    return deleted


def _image(scenario: Scenario, namespace: str, tag: str) -> str:
    """A fresh image per scenario, so pulls happen; an nvidia/cuda one when the scenario asks for it."""
    return f"registry.example/{namespace}/{'nvidia/cuda' if scenario.cuda_images else 'app'}:{tag}"


def run_scenario(cluster: SimCluster, scenario: Scenario) -> Result:
    """Run one scenario in a fresh namespace, judge it, then delete everything it made and check the release."""
    started = time.monotonic()
    rng = random.Random(scenario.seed)
    namespace = f"sim-{scenario.seed}-{next(_namespaces)}"
    cluster.api.add_namespace(namespace)
    errors: list[str] = []
    restarters = [threading.Timer(delay, cluster.kubelets[rng.randrange(len(cluster.kubelets))].restart)
                  for delay in scenario.restarts]
    for timer in restarters:
        timer.daemon = True
        timer.start()
    groups = [cluster.replicaset(namespace, g.name, g.replicas,
                                 g.shape.pod(generate_name=f"{g.name}-", image=_image(scenario, namespace, g.name)))
              for g in scenario.groups]

    def create(index: int, shape: PodShape) -> bool:
        try:
            image = _image(scenario, namespace, f"app-{index % 3}")
            cluster.user.create_pod(namespace, shape.pod(name=f"pod-{index}", image=image))
            return True
        except ApiError as exc:
            errors.append(exc.message)
            return False

    with futures.ThreadPoolExecutor(max_workers=max(1, len(scenario.pods))) as pool:
        created = sum(pool.map(create, range(len(scenario.pods)), scenario.pods))
    total = created + scenario.replicas
    deleted = _delete_some(cluster, namespace, scenario, rng, total) if scenario.delete else {}
    for timer in restarters:
        timer.join()
    settled = wait_settled(cluster, namespace, groups, scenario.settle_timeout_s)
    observation = cluster.observe(namespace, set(deleted))
    violations = check(observation)
    if not settled:
        violations.append(Violation("not-settled", namespace, f"the pods of {namespace} were still changing "
                                    f"(deleting, starting or being replaced) after {scenario.settle_timeout_s:g} s"))
    summary = summarize(observation)
    errors += [e for rs in groups for e in rs.errors]
    violations += _tear_down(cluster, namespace, groups)
    return Result(scenario, namespace, observation, violations, summary, time.monotonic() - started, errors, deleted)


def _tear_down(cluster: SimCluster, namespace: str, groups: Sequence[ReplicaSet]) -> list[Violation]:
    """Delete the scenario's pods and check every kubelet lets go of their devices."""
    for rs in groups:
        rs.close()
        cluster.replicasets.remove(rs)
    uids = set()
    for pod in _pods(cluster, namespace):
        uids.add(_meta(pod)["uid"])
        try:
            cluster.admin.delete_pod(namespace, _meta(pod)["name"])
        except ApiError as exc:
            if exc.code != 404:
                raise
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        held = {uid for k in cluster.kubelets for uid in k.devices.by_pod()} & uids
        if not _pods(cluster, namespace) and not held:
            return []
        time.sleep(0.02)
    held = {uid for k in cluster.kubelets for uid in k.devices.by_pod()} & uids
    return [Violation("not-released", namespace, f"after deleting every pod of {namespace}, "
                      f"{len(_pods(cluster, namespace))} pods remain and {len(held)} still hold devices")]


def reference_cluster(plugin: str, delivery: str = "env", seed: int = 26) -> ClusterSpec:
    """One node with 4 GPUs of 64 units, 2-second image pulls, up to 16 bindings at once, each up to 0.2 s."""
    kind: PluginKind = "baseline" if plugin == "baseline" else "ours"
    return ClusterSpec(nodes=1, gpus=BUG_REPORT_GPUS, plugin=kind, delivery=delivery, seed=seed, pull_delay=(2.0, 2.0),
                       max_jitter_s=0.2, binders=16)
