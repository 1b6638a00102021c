"""The reference stack beside ours on the real node, and the extender's writes as our validating webhook judged them.

- The reference algorithm (e2e.reference_plugin, the reference plugin's Allocate as a real device plugin, with the
  extender stand-in and no admission control, as the reference deploys it) runs the bug report's scenario up to
  three times (stopping at a run that shows the failure: a container on no-gpu-has-… or on another pod's GPU,
  refused or stuck, or a GPU over-committed); every admitted pod goes through its Allocate. Whether it fails is
  printed, not asserted: on this kubelet the pods are admitted in bind order and its guess holds (see the note
  in the test). Its failure is asserted where its own rule makes it certain: a pod with two GPU containers gets
  no-gpu-has-4GiB-to-run in both.
- Ours shows none, in env and in cdi delivery. One run per mode here: test_scenario.py runs the same scenario once
  more per mode in the same session, and each run takes about a minute and a half of the tier's time; three runs
  per mode, with the tables, come from `./dev demo --real` (docs/migrating-from-reference.md).
- Compatibility: every annotation write of the extender (its ServiceAccount) that reached the gpushare validating
  webhook, in every scenario of the session so far, is listed (operation, user, keys, verdict) and none is refused.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from e2e import audit
from e2e.cluster import Cluster
from e2e.control import EXTENDER_USER
from e2e.kube import Kubectl
from e2e.refstack import Stacks
from tests.e2e import bugreport
from tests.e2e.demo import scratch_namespace
from webhook.protocol import ASSIGNED, ASSUME_TIME, DEV, IDX, POD

RUNS = 3
EXTENDER_KEYS = {IDX, DEV, POD, ASSUME_TIME, ASSIGNED}


class Runs:
    def __init__(self, cluster: Cluster) -> None:
        self.stacks = Stacks(cluster)
        self.reference_namespaces: set[str] = set()


@pytest.fixture(scope="module")
def shared(cluster: Cluster) -> Runs:
    return Runs(cluster)


@pytest.fixture
def runs(cluster: Cluster, shared: Runs) -> Iterator[Runs]:
    """Each test leaves the tier as it found it: our stack, in the delivery mode the session's other tests set."""
    before = cluster.delivery
    yield shared
    shared.stacks.use_ours(before)


def test_reference_algorithm_on_the_bug_reports_scenario(cluster: Cluster, kubectl: Kubectl, runs: Runs) -> None:
    runs.stacks.use_reference()
    log = cluster.log("reference-plugin")
    seen = []
    for n in range(1, RUNS + 1):
        offset = log.stat().st_size
        with scratch_namespace(cluster, kubectl) as namespace:
            runs.reference_namespaces.add(namespace)
            outcome = bugreport.run(cluster, kubectl, namespace, "reference")
        decisions = log.read_text(errors="replace")[offset:]
        guesses = decisions.count(f"guessed pod {namespace}/") + decisions.count("answered NVIDIA_VISIBLE_DEVICES=")
        print(f"\nreference algorithm, run {n}: {guesses} Allocate decisions; {outcome.as_json()}", file=sys.stderr)
        # Every pod the kubelet admitted went through the reference algorithm's own Allocate.
        assert guesses >= bugreport.REPLICAS, decisions
        assert outcome.pods == bugreport.REPLICAS
        seen.append(outcome)
        if outcome.failed:
            break
    # What the real node shows: its kubelet admits the pods one at a time, in the order the extender bound them,
    # which is the order of ALIYUN_COM_GPU_MEM_ASSUME_TIME; so the oldest assumed pod is the one being admitted and
    # the guess is right, unless something else reorders admissions (see docs/migrating-from-reference.md).
    for outcome in seen:
        if outcome.failed:
            print(f"the reference algorithm failed: {outcome.as_json()}", file=sys.stderr)


def test_reference_algorithm_gives_a_two_container_pod_made_up_devices(cluster: Cluster, kubectl: Kubectl,
                                                                      runs: Runs) -> None:
    """The kubelet calls Allocate once per container (4 device IDs each); the reference matches a pod whose app
    containers add up to the IDs of one call, so it finds none and answers no-gpu-has-4GiB-to-run."""
    runs.stacks.use_reference()
    with scratch_namespace(cluster, kubectl) as namespace:
        runs.reference_namespaces.add(namespace)
        probe = bugreport.two_containers(cluster, kubectl, namespace, "reference")
    assert not probe.ok and probe.detail.count("no-gpu-has-4GiB-to-run") == 2, probe.detail


@pytest.mark.parametrize("mode", ["env", "cdi"])
def test_ours_shows_none(cluster: Cluster, kubectl: Kubectl, runs: Runs, mode: str) -> None:
    runs.stacks.use_ours(mode)
    with scratch_namespace(cluster, kubectl) as namespace:
        outcome = bugreport.run(cluster, kubectl, namespace, mode)
    with scratch_namespace(cluster, kubectl) as namespace:
        probe = bugreport.two_containers(cluster, kubectl, namespace, mode)
    print(f"\ngpushare {mode}: {outcome.as_json()}; two containers: {probe.detail}", file=sys.stderr)
    assert not outcome.failed, outcome.as_json()
    assert outcome.started == outcome.on_recorded_gpu == outcome.pods == bugreport.REPLICAS
    assert probe.ok, probe.detail


def test_extender_writes_are_never_refused_by_the_webhook(cluster: Cluster, runs: Runs) -> None:
    writes = audit.read(cluster.audit_log, EXTENDER_USER)
    judged = [w for w in writes if w.judged_by_webhook and w.pod.split("/")[0] not in runs.reference_namespaces]
    print(f"\nthe extender's writes judged by the validating webhook ({len(judged)}):", file=sys.stderr)
    for write in judged:
        print("  " + write.row(), file=sys.stderr)
    assert len(judged) >= 2 * bugreport.REPLICAS, "the scenarios above bind at least 60 GPU-share pods"
    assert [w.row() for w in judged if w.verdict != "allowed"] == []
    assert all(w.operation == "UPDATE" and set(w.keys) <= EXTENDER_KEYS for w in judged)
    bindings = [w for w in writes if w.subresource == "binding"]
    assert bindings and all(w.verdict == "allowed" for w in bindings)
