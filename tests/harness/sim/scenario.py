"""Scenarios on a simulated cluster: concurrent creation, deletions during the pull, kubelet restarts, invariants."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

from contract.keys import DEFAULT_RESOURCE
from tests.harness.apiserver.ports import ApiError, Pod
from tests.harness.sim.cluster import ClusterSpec, PluginKind, SimCluster
from tests.harness.sim.invariants import Observation, Summary, Violation, check, summarize
from tests.harness.sim.replicaset import ReplicaSet

RESOURCE = DEFAULT_RESOURCE
_namespaces = itertools.count()


@dataclass(frozen=True)
class PodShape:
    """Units per app container and per init container (0: that container asks for no GPU memory)."""

    containers: tuple[int, ...] = (1,)
    init: tuple[int, ...] = ()
    sidecar: bool = False  # the first init container is a restartable sidecar
    zero_limit: bool = False  # a container asking for no GPU memory says so with a limit of "0"

    def pod(self, name: str = "", generate_name: str = "", image: str = "registry.example/cuda-app:1") -> Pod:
        def container(prefix: str, i: int, units: int) -> dict[str, Any]:
            out: dict[str, Any] = {"name": f"{prefix}{i}", "image": image}
            if units or self.zero_limit:
                out["resources"] = {"limits": {RESOURCE: str(units)}}
            return out

        meta: dict[str, Any] = {"name": name} if name else {"generateName": generate_name}
        spec: dict[str, Any] = {"containers": [container("app", i, u) for i, u in enumerate(self.containers)]}
        if self.init:
            spec["initContainers"] = [container("init", i, u) for i, u in enumerate(self.init)]
            if self.sidecar:
                spec["initContainers"][0]["restartPolicy"] = "Always"
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@dataclass(frozen=True)
class Scenario:
    seed: int
    pods: tuple[PodShape, ...] = ()  # created at once by an ordinary user, one thread each
    group: tuple[PodShape, int] | None = None  # a ReplicaSet-managed group: template and replicas
    delete: int = 0  # pods deleted while their images pull (or whenever they are, at that moment)
    delete_after_s: float = 0.0  # delay after all first pods are bound
    restarts: tuple[float, ...] = ()  # kubelet restarts, seconds after creation starts
    settle_timeout_s: float = 30.0
    cuda_images: bool = False  # the pods run nvidia/cuda images, whose env selects every GPU


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


def random_scenario(seed: int, gpu_units: int = 8, placement: str = "extender") -> Scenario:
    """A tiny seeded scenario: 2-8 pods of mixed shapes, maybe a group, deletions and a kubelet restart.

    Under extender placement every pod is one the scheduler extender can book (the webhook refuses the others):
    init containers no larger than the app container, sidecars without GPU memory. Node placement books the
    whole pod, so there init containers may be larger and sidecars have GPU memory."""
    rng = random.Random(seed)
    low = max(1, gpu_units // 8)
    high = max(low, gpu_units // 2)
    whole = placement == "node"

    def shape() -> PodShape:
        kind = rng.random()
        if kind < 0.45:
            return PodShape((rng.randint(low, high),))
        if kind < 0.7:
            return PodShape((rng.randint(low, high), rng.choice([0, rng.randint(low, high)])))
        if kind < 0.9:
            app, init = rng.randint(low, high), rng.randint(low, gpu_units // 2 + 1)
            return PodShape((app,), (init if whole else min(init, app),))
        if kind < 0.95:
            app, sidecar = rng.randint(low, high), rng.randint(low, high)
            return PodShape((app,), (sidecar if whole else 0, 0), sidecar=True)
        return PodShape((0,))

    count = rng.randint(2, 8)
    group = (shape(), rng.randint(2, 3)) if rng.random() < 0.3 else None
    pods = tuple(shape() for _ in range(count - (group[1] if group else 0)))
    return Scenario(
        seed=seed,
        pods=pods,
        group=group,
        delete=rng.choice([0, 0, 1, 2]),
        delete_after_s=rng.uniform(0.0, 0.05),
        restarts=(rng.uniform(0.0, 0.1),) if rng.random() < 0.25 else (),
        cuda_images=rng.random() < 0.5,
    )


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
    groups = []
    if scenario.group is not None:
        shape, replicas = scenario.group
        template = shape.pod(generate_name="group-", image=_image(scenario, namespace, "group"))
        groups.append(cluster.replicaset(namespace, "group", replicas, template))

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
    total = created + (scenario.group[1] if scenario.group else 0)
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


def reference_scenario(seed: int = 26) -> Scenario:
    """The bug report as a scenario: a Deployment of 30 pods x 8 units, 10 deleted while their images pull."""
    return Scenario(seed=seed, group=(PodShape((8,)), 30), delete=10, delete_after_s=0.3, settle_timeout_s=90.0)


def reference_cluster(plugin: str, delivery: str = "env", seed: int = 26) -> ClusterSpec:
    """One node with 4 GPUs of 64 units, 2-second image pulls, up to 16 bindings at once, each up to 0.2 s."""
    kind: PluginKind = "baseline" if plugin == "baseline" else "ours"
    return ClusterSpec(nodes=1, gpus="4x64GiB", plugin=kind, delivery=delivery, seed=seed, pull_delay=(2.0, 2.0),
                       max_jitter_s=0.2, binders=16)
