"""The reference stack itself on the real node: the reference extender and the reference device plugin, both built
from their sources, no admission control (as the reference deploys it).

- Its own code fails where its guess cannot hold: the kubelet calls Allocate once per container, with 4 device IDs
  each for a pod of two 4 GiB containers, and the reference matches a pod whose app containers add up to the IDs of
  one call, so it finds none and answers a successful `no-gpu-has-4GiB-to-run` in both (allocate.go,
  buildErrResponse). Asserted, since its rule makes it certain.
- The bug report's scenario and pods bound while the kubelet is down run once each; what they show is printed, not
  asserted (whether its guess holds depends on the order in which this kubelet admits pods).
Ours runs the same scenarios in test_scenario.py; `./dev demo --real` puts the stacks side by side, three runs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from e2e.cluster import Cluster
from e2e.kube import Kubectl
from e2e.refstack import Stacks
from tests.harness.realtier import scenarios
from tests.harness.realtier.demo import scratch_namespace
from tests.harness.scenarios import BUG_REPORT, KUBELET_DOWN, TWO_CONTAINERS, Scenario

# GPU-share pods here are placed by the reference scheduler extender (skipped, with the reason, without it).
pytestmark = pytest.mark.usefixtures("needs_extender")


@pytest.fixture(scope="module")
def stacks(cluster: Cluster, needs_extender: None) -> Iterator[Stacks]:
    """The reference stack for this module; the tier is left in our stack and the delivery mode it was in."""
    before = cluster.delivery
    swap = Stacks(cluster)
    swap.use_reference()
    yield swap
    swap.use_ours(before)


def test_the_reference_plugin_gives_two_container_pods_made_up_devices(cluster: Cluster, kubectl: Kubectl,
                                                                     stacks: Stacks) -> None:
    with scratch_namespace(cluster, kubectl) as namespace:
        out = scenarios.run(cluster, kubectl, namespace, "reference", TWO_CONTAINERS)
    print(f"\nreference stack, {out.scenario}: {out.as_json()}", file=sys.stderr)
    assert out.started == TWO_CONTAINERS.replicas, out.as_json()
    assert len(out.made_up) == 2 * TWO_CONTAINERS.replicas, out.made_up
    assert all(m.endswith("no-gpu-has-4GiB-to-run") for m in out.made_up), out.made_up


@pytest.mark.parametrize("scenario", [BUG_REPORT, KUBELET_DOWN],
                         ids=lambda s: s.name.replace(" ", "-"))
def test_the_reference_stack_on_the_bug_reports_shapes(cluster: Cluster, kubectl: Kubectl, stacks: Stacks,
                                                       scenario: Scenario) -> None:
    with scratch_namespace(cluster, kubectl) as namespace:
        out = scenarios.run(cluster, kubectl, namespace, "reference", scenario)
    verdict = "failed" if out.failed else "held"
    print(f"\nreference stack, {scenario.name}: its guess {verdict}: {out.as_json()}", file=sys.stderr)
    # Every pod the kubelet admitted went through the reference plugin's own Allocate, which names a GPU index or
    # a made-up device in every answer.
    assert out.started + len(out.rejected) + len(out.stuck) >= scenario.replicas, out.as_json()
    assert out.started == out.on_recorded_gpu + len({m.split("/")[0] for m in out.made_up + out.wrong_gpu}), \
        out.as_json()
