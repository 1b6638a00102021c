"""The scenarios both tiers run, in one vocabulary: pod shapes, ReplicaSet groups, and the bug report's scenario and
its relatives. The simulated tier runs them with tests/harness/sim/scenario.py, the real-cluster tier with
tests/harness/realtier/scenarios.py; tests/harness/judge.py judges what either saw."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from tests.harness.pods import Pod, shaped_pod

# The bug report's node (/work/shared/reference/bug-report-concurrent-creation.txt): 4 GPUs of 64 GiB.
BUG_REPORT_GPUS = "4x64GiB"


@dataclass(frozen=True)
class PodShape:
    """Units per app container and per init container (0: that container asks for no GPU memory)."""

    containers: tuple[int, ...] = (1,)
    init: tuple[int, ...] = ()
    sidecar: bool = False  # the first init container is a restartable sidecar
    zero_limit: bool = False  # a container asking for no GPU memory says so with a limit of "0"

    def pod(self, name: str = "", generate_name: str = "", image: str = "registry.example/cuda-app:1") -> Pod:
        return shaped_pod(self.containers, self.init, sidecar=self.sidecar, zero_limit=self.zero_limit, name=name,
                          generate_name=generate_name, image=image)


@dataclass(frozen=True)
class Group:
    """A ReplicaSet: `replicas` pods of one shape, labelled app=<name>."""

    name: str
    shape: PodShape
    replicas: int


@dataclass(frozen=True)
class Scenario:
    """Pods created at once, some deleted while their images are pulled. The simulated tier reads every field but
    `pull_ms` and `kubelet_down` (its pulls take what its ClusterSpec says); the real tier reads `name`, `groups`,
    `pull_ms`, `delete` and `kubelet_down`."""

    name: str = "random"
    groups: tuple[Group, ...] = ()  # ReplicaSets, created at once
    pods: tuple[PodShape, ...] = ()  # bare pods created at once by an ordinary user, one thread each
    delete: int = 0  # pods deleted while their images pull (or whenever they are, at that moment)
    pull_ms: int = 2000  # each image pull on the real node
    kubelet_down: bool = False  # bound while the kubelet is stopped, admitted as one batch when it starts
    seed: int = 0  # the simulated tier's random choices
    delete_after_s: float = 0.0  # delay after all first pods are bound
    restarts: tuple[float, ...] = ()  # kubelet restarts, seconds after creation starts
    settle_timeout_s: float = 30.0
    cuda_images: bool = False  # the pods run nvidia/cuda images, whose env selects every GPU

    @property
    def replicas(self) -> int:
        return sum(g.replicas for g in self.groups)


# The bug report: a Deployment of 30 pods of 8 GiB on 4 x 64 GiB, a 10-second pull, 10 pods deleted while their image
# is pulled and replaced by their ReplicaSet.
BUG_REPORT = Scenario("the bug report", (Group("bug", PodShape((8,)), 30),), pull_ms=10000, delete=10)
MIXED = Scenario("mixed sizes, deletions while pulling",
                 (Group("s4", PodShape((4,)), 8), Group("s8", PodShape((8,)), 6), Group("s12", PodShape((12,)), 4),
                  Group("s16", PodShape((16,)), 4)), pull_ms=8000, delete=8)
INIT = Scenario("init containers with GPU memory",
                (Group("init-smaller", PodShape((8,), (4,)), 4), Group("init-equal", PodShape((8,), (8,)), 4),
                 Group("two-apps", PodShape((4, 4), (8,)), 4)), pull_ms=4000, delete=3)
TWO_CONTAINERS = Scenario("two GPU containers per pod", (Group("two", PodShape((4, 4)), 4),), pull_ms=2000)
KUBELET_DOWN = Scenario("bound while the kubelet is down", (Group("down", PodShape((8,)), 16),), pull_ms=4000,
                        kubelet_down=True)
SCENARIOS = (BUG_REPORT, MIXED, INIT, TWO_CONTAINERS, KUBELET_DOWN)


def reference_scenario(seed: int = 26) -> Scenario:
    """The bug report on the simulated cluster: its deletions 0.3 s after the pods are bound, 90 s to settle."""
    return dataclasses.replace(BUG_REPORT, seed=seed, delete_after_s=0.3, settle_timeout_s=90.0)


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
    groups = (Group("group", shape(), rng.randint(2, 3)),) if rng.random() < 0.3 else ()
    pods = tuple(shape() for _ in range(count - sum(g.replicas for g in groups)))
    return Scenario(
        seed=seed,
        pods=pods,
        groups=groups,
        delete=rng.choice([0, 0, 1, 2]),
        delete_after_s=rng.uniform(0.0, 0.05),
        restarts=(rng.uniform(0.0, 0.1),) if rng.random() < 0.25 else (),
        cuda_images=rng.random() < 0.5,
    )
