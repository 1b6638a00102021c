"""Seeded randomized scenarios on the simulated cluster, in env and cdi delivery, all invariants must hold.

GPUSHARE_SIM_SCENARIOS=N runs N seeds per delivery mode (default 100, so 200 per CI run), plus N/4 seeds of
node-local placement (cdi delivery, no extender: the plugin picks the GPU).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from concurrent import futures
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.harness.scenarios import PodShape, Scenario, random_scenario
from tests.harness.sim.cluster import ClusterSpec, SimCluster
from tests.harness.sim.scenario import Result, run_scenario
from tests.harness.webhook.server import RunningWebhook, webhook_server

SCENARIOS = int(os.environ.get("GPUSHARE_SIM_SCENARIOS", "100"))
TOPOLOGIES = ((1, "2x8GiB"), (2, "2x8GiB"))


class Clusters:
    """One webhook per delivery mode and one cluster per (mode, topology), started on first use."""

    def __init__(self, stack: ExitStack) -> None:
        self.stack = stack
        self.hooks: dict[tuple[str, str], RunningWebhook] = {}
        self.clusters: dict[tuple[str, int, str, str], SimCluster] = {}

    def get(self, delivery: str, nodes: int, gpus: str, placement: str = "extender") -> SimCluster:
        if (delivery, placement) not in self.hooks:  # the webhook reads both cluster-wide settings
            directory = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="gs-hook-")))
            self.hooks[(delivery, placement)] = self.stack.enter_context(
                webhook_server(directory, {"GPUSHARE_DELIVERY": delivery, "GPUSHARE_PLACEMENT": placement}))
        key = (delivery, nodes, gpus, placement)
        if key not in self.clusters:
            spec = ClusterSpec(nodes=nodes, gpus=gpus, delivery=delivery, seed=nodes, placement=placement)
            cluster = SimCluster(spec, self.hooks[(delivery, placement)])
            cluster.start()
            self.clusters[key] = cluster
        return self.clusters[key]

    def close(self) -> None:
        with futures.ThreadPoolExecutor(max_workers=max(1, len(self.clusters))) as pool:
            list(pool.map(SimCluster.close, self.clusters.values()))


@pytest.fixture(scope="module")
def clusters() -> Iterator[Clusters]:
    with ExitStack() as stack:
        pool = Clusters(stack)
        try:
            yield pool
        finally:
            pool.close()


def _only_running_or_waiting_for_room(result: Result) -> list[str]:
    """With our webhook and plugin nothing may fail: every pod runs, or waits unscheduled for room."""
    bad = []
    for pod in result.observation.pods:
        meta = pod["metadata"]
        if pod.get("status", {}).get("phase") != "Running" and meta["uid"] not in result.observation.unschedulable:
            bad.append(f"{meta['name']}: {pod.get('status')}")
    return bad


@pytest.mark.timeout(90)
@pytest.mark.parametrize("delivery", ["env", "cdi"])
@pytest.mark.parametrize("seed", range(SCENARIOS))
def test_random_scenario_holds_every_invariant(clusters: Clusters, delivery: str, seed: int) -> None:
    nodes, gpus = TOPOLOGIES[seed % len(TOPOLOGIES)]
    result = run_scenario(clusters.get(delivery, nodes, gpus), random_scenario(seed))
    assert not result.violations, result.explain()
    assert not result.create_errors, result.explain()
    assert not _only_running_or_waiting_for_room(result), result.explain()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("seed", range(max(1, SCENARIOS // 4)))
def test_node_local_placement_holds_every_invariant(clusters: Clusters, seed: int) -> None:
    nodes, gpus = TOPOLOGIES[seed % len(TOPOLOGIES)]
    result = run_scenario(clusters.get("cdi", nodes, gpus, placement="node"), random_scenario(seed, placement="node"))
    assert not result.violations, result.explain()
    assert not result.create_errors, result.explain()
    # The scheduler only counts a node's total units, so a pod may land where no single GPU has room left:
    # the plugin must then refuse it with that reason, and nothing else may go wrong.
    for problem in _only_running_or_waiting_for_room(result):
        assert "has that much room" in problem, result.explain() + "\n" + problem


def _shapes(scenarios: list[Scenario]) -> list[PodShape]:
    return [s for sc in scenarios for s in (*sc.pods, *(g.shape for g in sc.groups))]


def test_the_seeds_cover_every_shape() -> None:
    scenarios = [random_scenario(seed) for seed in range(max(SCENARIOS, 100))]
    shapes = _shapes(scenarios)
    assert any(len([u for u in s.containers if u]) > 1 for s in shapes), "multi-container GPU pods"
    assert any(s.init and any(s.init) for s in shapes), "init containers with GPU memory"
    assert any(s.sidecar for s in shapes), "restartable sidecars"
    assert any(0 in s.containers for s in shapes), "containers without GPU memory"
    assert any(sc.restarts for sc in scenarios), "kubelet restarts"
    assert any(sc.delete for sc in scenarios), "deletions"
    assert any(sc.groups for sc in scenarios), "ReplicaSet groups"
    # Under the extender every pod is bookable (the app containers' sum is its whole request) ...
    assert all(max((*s.init, 0)) <= sum(s.containers) and not (s.sidecar and s.init[0]) for s in shapes)
    # ... and node placement, which books the whole pod, has the others: larger init containers, GPU sidecars.
    whole = _shapes([random_scenario(seed, placement="node") for seed in range(max(SCENARIOS // 4, 25))])
    assert any(s.init and max(s.init) > sum(s.containers) for s in whole), "init containers larger than the apps"
    assert any(s.sidecar and s.init[0] for s in whole), "sidecars with GPU memory"


# Pods the scheduler extender cannot book (it books the app containers' sum only): refused at creation under
# extender placement, with the message that says so; node placement runs them (the test above).
UNBOOKABLE = (PodShape((2,), (6,)), PodShape((0,), (3,)), PodShape((2,), (1, 0), sidecar=True))


@pytest.mark.timeout(60)
def test_pods_the_extender_cannot_book_are_refused_at_creation(clusters: Clusters) -> None:
    result = run_scenario(clusters.get("env", *TOPOLOGIES[0]), Scenario(seed=30_000, pods=UNBOOKABLE))
    assert not result.violations, result.explain()
    assert not result.observation.pods, result.explain()
    assert len(result.create_errors) == 3, result.explain()
    for error in result.create_errors:
        assert "the gpushare scheduler extender books only the sum of the app containers' limits" in error, error
        assert "GPUSHARE_PLACEMENT=node" in error, error


@pytest.mark.timeout(60)
def test_the_real_plugin_registers_again_after_a_kubelet_restart(clusters: Clusters) -> None:
    cluster = clusters.get("env", *TOPOLOGIES[0])
    kubelet = cluster.kubelets[0]
    before = kubelet.registration.registrations
    kubelet.restart()
    assert kubelet.wait_registered(10)
    assert kubelet.registration.registrations > before
    result = run_scenario(cluster, Scenario(seed=10_000, pods=(PodShape((2,)), PodShape((1, 1)))))
    assert not result.violations, result.explain()
    assert result.summary.started == result.summary.right_gpu == 2, result.explain()


# Containers that request no GPU memory, on images whose env selects every GPU: ordinary pods, a limit of "0", a
# GPU pod's sidecar and init container, a restartable sidecar without GPU memory.
WITHOUT_GPU_MEMORY = (PodShape((0,)), PodShape((0, 0), (0,)), PodShape((0,), zero_limit=True), PodShape((2, 0)),
                      PodShape((1,), (0, 0), sidecar=True), PodShape((2, 0), (1,)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("delivery", ["env", "cdi"])
@pytest.mark.parametrize("cuda_images", [True, False])
def test_containers_without_gpu_memory_see_no_gpu(clusters: Clusters, delivery: str, cuda_images: bool) -> None:
    result = run_scenario(clusters.get(delivery, *TOPOLOGIES[0]),
                          Scenario(seed=20_000, pods=WITHOUT_GPU_MEMORY, cuda_images=cuda_images))
    assert not result.violations, result.explain()
    assert not result.create_errors, result.explain()
    assert not _only_running_or_waiting_for_room(result), result.explain()
    bare = [r for r in result.observation.runs if r.started and not r.units]
    assert len({(r.pod_uid, r.container) for r in bare}) == 9, result.explain()
    if delivery == "env":  # the webhook neutralised each of them, over the image's `all`
        assert {r.env.get("NVIDIA_VISIBLE_DEVICES") for r in bare} == {"void"}, result.explain()
    elif cuda_images:  # the image's `all` is there, and the runtime ignores it
        assert {r.env.get("NVIDIA_VISIBLE_DEVICES") for r in bare} == {"all"}, result.explain()
