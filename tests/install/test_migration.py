"""Live migration from the reference stack, node by node, with its pods running (docs/migrating-from-reference.md).

The reference device plugin is installed as its README says (e2e.refinstall: its RBAC file and DaemonSet, the node
labelled `gpushare=true`) beside the reference extender the tier always runs, and the bug report's workload runs on
it. Then, as the migration document says: `helm install` of our chart, pods created meanwhile, the node's label
switched to ours (`gpushare=` off, `gpushare.io/gpu-memory=device-plugin` on), a crash of an old pod's container,
new pods on the migrated node; and the way back (the label switched back, our chart uninstalled).

Held at every step: no pod that ran before restarted or moved (same UID, node, container IDs and restart counts,
but for the container crashed on purpose), every container on its pod's recorded GPU, no GPU promised more than
it has, and our plugin counting the memory of the pods the reference plugin started.
The tests of this module run in order on one cluster (the first installs the reference stack).
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from e2e import gpushare, install, refinstall
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.harness.realtier import scenarios
from tests.harness.realtier import workloads as w
from tests.harness.scenarios import BUG_REPORT

pytestmark = pytest.mark.usefixtures("needs_extender")

OLD, DURING, AFTER, BACK = "migrate-old", "migrate-during", "migrate-after", "migrate-back"
OURS_PODS = "app.kubernetes.io/name=gpushare-device-plugin"
# The container that crashes on demand: it exits 3 once /tmp/crash exists, and the kubelet starts it again.
CRASHABLE = 'while [ ! -e /tmp/crash ]; do sleep 1; done; exit 3'
# The bug report's 30 pods of 8 GiB leave 16 GiB of the tier's 4 GPUs of 64 GiB: every later pod asks for 2.
UNITS = 2
STATE: dict[str, Any] = {}


def _switch(kubectl: Kubectl, node: str, *labels: str) -> None:
    kubectl.ok(["label", "node", node, *labels, "--overwrite"])


@pytest.fixture(scope="module")
def reference(cluster: Cluster) -> Iterator[Cluster]:
    kubectl = cluster.kubectl()
    node = cluster.settings.node_name
    _switch(kubectl, node, f"{install.GPU_NODE_LABEL_KEY}-")
    for name in (OLD, DURING, AFTER, BACK):
        kubectl.ok(["create", "namespace", name])
    try:
        refinstall.install(cluster)
        _switch(kubectl, node, refinstall.NODE_LABEL)
        _wait_reference_serving(cluster, kubectl)
        yield cluster
    finally:
        install.helm(cluster, "uninstall", install.RELEASE, "--namespace", install.RELEASE_NAMESPACE,
                     "--ignore-not-found", install.wait())
        for name in (OLD, DURING, AFTER, BACK):
            kubectl.run(["delete", "namespace", name, "--wait=false"])
            kubectl.run(["delete", "pods", "--all", "-n", name, "--grace-period=0", "--force"], timeout=60)
        refinstall.uninstall(cluster)
        _switch(kubectl, node, "gpushare-", f"{install.GPU_NODE_LABEL_KEY}-")


def _wait_reference_serving(cluster: Cluster, kubectl: Kubectl) -> None:
    def registered() -> bool:
        pods = w.pods(kubectl, refinstall.NAMESPACE, refinstall.PODS)
        return len(pods) == 1 and w.running(pods[0]) and b"Registered device plugin with Kubelet" in kubectl.ok(
            ["logs", "-n", refinstall.NAMESPACE, pods[0]["metadata"]["name"]]).encode()
    w.wait("the reference plugin's pod running and registered with the kubelet", registered, 180, 2)
    install.wait_node_serving(cluster)


def _live(kubectl: Kubectl, *namespaces: str) -> list[dict[str, Any]]:
    return [p for ns in namespaces for p in w.pods(kubectl, ns)
            if not p["metadata"].get("deletionTimestamp") and w.phase(p) not in ("Failed", "Succeeded")]


def _snapshot(kubectl: Kubectl, *namespaces: str) -> dict[str, tuple[str, str, tuple[tuple[str, str, int], ...]]]:
    """Per running pod: UID, node, and (container, container ID, restart count) of each container."""
    out = {}
    for p in _live(kubectl, *namespaces):
        statuses = tuple(sorted((s["name"], s.get("containerID", ""), int(s.get("restartCount", 0)))
                                for s in p["status"].get("containerStatuses") or []))
        out[f"{p['metadata']['namespace']}/{p['metadata']['name']}"] = (p["metadata"]["uid"], p["spec"]["nodeName"],
                                                                        statuses)
    return out


def _assert_untouched(kubectl: Kubectl, before: dict[str, Any], *, except_pod: str = "") -> None:
    now = _snapshot(kubectl, *{k.split("/")[0] for k in before})
    changed = {k: (v, now.get(k)) for k, v in before.items() if k != except_pod and now.get(k) != v}
    assert not changed, f"pods restarted, moved or gone (before, now): {changed}"


def _assert_on_recorded_gpus(cluster: Cluster, kubectl: Kubectl, *namespaces: str) -> int:
    """Every live pod's every container on its pod's recorded GPU, no GPU promised more than it has; the count."""
    s, capacity = cluster.settings, w.fake_capacity(cluster.settings)
    live = _live(kubectl, *namespaces)
    wrong = []
    for p in live:
        ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
        assert w.running(p), f"{ns}/{name} is not running: {w.reason(p)}"
        for c in p["spec"]["containers"]:
            rep = w.report(kubectl, ns, name, c["name"])
            got = None if rep is None else w.gpu_of(rep, "env", s.node_name, s.fake_gpus)
            if got is None or got != w.assigned_index(p):
                wrong.append(f"{ns}/{name}/{c['name']}: {w.why_no_gpu(kubectl, ns, name, c['name'], rep)}, "
                             f"recorded GPU {w.assigned_index(p)}")
    assert not wrong, f"containers not on their recorded GPU: {wrong}"
    over = {gpu: units for gpu, units in w.promised(live).items() if units > capacity}
    assert not over, f"GPUs promised more than their {capacity} GiB: {over}"
    return len(live)


def _crashable_pod(cluster: Cluster, name: str, units: int) -> dict[str, Any]:
    return w.pod(name, [w.container("main", w.image(cluster), units, then=CRASHABLE)])


def test_the_bug_report_runs_on_the_reference_stack(reference: Cluster, kubectl: Kubectl) -> None:
    out = scenarios.run(reference, kubectl, OLD, "reference", BUG_REPORT)
    assert not out.failed, f"the reference stack itself misplaced pods before the migration: {out.as_json()}"
    code, text = w.create(kubectl, OLD, _crashable_pod(reference, "crashable", UNITS))
    assert code == 0, text
    w.wait("the crashable pod running", lambda: all(w.running(p) for p in _live(kubectl, OLD)), 120)
    STATE["running"] = _assert_on_recorded_gpus(reference, kubectl, OLD)
    STATE["before"] = _snapshot(kubectl, OLD)


def test_our_chart_installed_beside_it_touches_no_pod_and_pods_made_meanwhile_land_right(
        reference: Cluster, kubectl: Kubectl) -> None:
    values = install.write_values(reference, reference.run / "install" / "migration.yaml", certificates="self-signed")
    install.helm(reference, "install", install.RELEASE, str(reference.chart), "--namespace", install.RELEASE_NAMESPACE,
                 "-f", str(values))
    install.certs_install(reference)
    install.wait_serving(reference)
    assert not w.pods(kubectl, gpushare.NAMESPACE, OURS_PODS), "our plugin started on a node of the reference's"
    code, text = w.create(kubectl, DURING, w.pod("during", [w.container("main", w.image(reference), UNITS)]))
    assert code == 0, text
    w.wait("the pod created meanwhile running", lambda: all(w.running(p) for p in _live(kubectl, DURING))
           and len(_live(kubectl, DURING)) == 1, 120)
    _assert_on_recorded_gpus(reference, kubectl, OLD, DURING)
    _assert_untouched(kubectl, STATE["before"])
    STATE["before"] = _snapshot(kubectl, OLD, DURING)


def test_the_node_switches_to_our_plugin_with_its_pods_running(reference: Cluster, kubectl: Kubectl) -> None:
    node = reference.settings.node_name
    log = reference.log("kubelet")
    offset = log.stat().st_size
    _switch(kubectl, node, "gpushare-", install.GPU_NODE_LABEL)
    w.wait("the reference plugin's pod gone", lambda: not w.pods(kubectl, refinstall.NAMESPACE, refinstall.PODS),
           120, 2)
    w.wait("our plugin's pod registered with the kubelet", lambda: scenarios.REGISTERED in log.read_bytes()[offset:],
           180, 2)
    install.wait_node_serving(reference)
    _assert_untouched(kubectl, STATE["before"])
    _assert_on_recorded_gpus(reference, kubectl, OLD, DURING)


def _plugin_metrics(kubectl: Kubectl) -> str:
    """Our plugin's /metrics, from its pod's address on the tier's pod network."""
    [plugin] = w.pods(kubectl, gpushare.NAMESPACE, OURS_PODS)
    with urllib.request.urlopen(f"http://{plugin['status']['podIP']}:9103/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def _prestarts_answered(kubectl: Kubectl) -> float:
    found = re.search(r'^gpushare_deviceplugin_calls_total\{method="PreStartContainer",outcome="ok"\} (\S+)$',
                      _plugin_metrics(kubectl), re.M)
    return float(found[1]) if found else 0.0


def test_our_plugin_counts_the_memory_of_the_pods_it_did_not_start(reference: Cluster, kubectl: Kubectl) -> None:
    promised = w.promised(_live(kubectl, OLD, DURING))
    seen: dict[int, int] = {}

    def counted() -> bool:
        found = re.findall(r'^gpushare_deviceplugin_gpu_units_promised\{gpu="(\d+)"[^}]*\} (\S+)$',
                           _plugin_metrics(kubectl), re.M)
        seen.clear()
        seen.update({int(gpu): int(float(value)) for gpu, value in found if float(value)})
        return seen == promised

    try:
        w.wait(f"our plugin's count of promised units per GPU to be {promised}", counted, 60, 2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it counts {seen}") from None


def test_a_crashed_container_of_an_old_pod_restarts_on_its_gpu(reference: Cluster, kubectl: Kubectl) -> None:
    answered = _prestarts_answered(kubectl)
    kubectl.ok(["exec", "-n", OLD, "crashable", "-c", "main", "--", "sh", "-c", ": > /tmp/crash"])

    def restarted() -> bool:
        [p] = [p for p in w.pods(kubectl, OLD) if p["metadata"]["name"] == "crashable"]
        return w.running(p) and p["status"]["containerStatuses"][0].get("restartCount", 0) == 1
    w.wait("the crashed container started again by the kubelet", restarted, 120, 2)
    # The kubelet asked our plugin (PreStartContainer) and it said yes: the restart was judged, not let through.
    assert _prestarts_answered(kubectl) == answered + 1
    _assert_untouched(kubectl, STATE["before"], except_pod=f"{OLD}/crashable")
    _assert_on_recorded_gpus(reference, kubectl, OLD, DURING)
    STATE["before"] = _snapshot(kubectl, OLD, DURING)


def test_new_pods_on_the_migrated_node_are_placed_exactly(reference: Cluster, kubectl: Kubectl) -> None:
    img = w.image(reference, 2000)
    code, text = w.create(kubectl, AFTER, w.replicaset("after", 2, w.pod("x", [w.container("main", img, UNITS)])))
    assert code == 0, text
    w.wait_running(kubectl, AFTER, 2, 180)
    _assert_on_recorded_gpus(reference, kubectl, OLD, DURING, AFTER)
    _assert_untouched(kubectl, STATE["before"])
    STATE["before"] = _snapshot(kubectl, OLD, DURING, AFTER)


def test_the_way_back_to_the_reference_plugin(reference: Cluster, kubectl: Kubectl) -> None:
    node = reference.settings.node_name
    _switch(kubectl, node, f"{install.GPU_NODE_LABEL_KEY}-", refinstall.NODE_LABEL)
    w.wait("our plugin's pod gone", lambda: not w.pods(kubectl, gpushare.NAMESPACE, OURS_PODS), 120, 2)
    _wait_reference_serving(reference, kubectl)
    install.helm(reference, "uninstall", install.RELEASE, "--namespace", install.RELEASE_NAMESPACE, install.wait())
    _assert_untouched(kubectl, STATE["before"])
    code, text = w.create(kubectl, BACK, w.pod("back", [w.container("main", w.image(reference), UNITS)]))
    assert code == 0, text
    w.wait("a pod made after the way back running", lambda: len(_live(kubectl, BACK)) == 1
           and all(w.running(p) for p in _live(kubectl, BACK)), 120)
    _assert_on_recorded_gpus(reference, kubectl, OLD, DURING, AFTER, BACK)
    _assert_untouched(kubectl, STATE["before"])
