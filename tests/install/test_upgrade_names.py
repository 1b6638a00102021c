"""`helm upgrade` from the chart before the names of the reference stack were given up: the previous chart (the
commit below, from this repository's history) installed with its node label `gpushare=true`, a pod running, then
the upgrade as docs/helm.md "Upgrading" says: the node labelled `gpushare.io/gpu-memory=device-plugin` first, then
`helm upgrade`, then the old label removed. The running pod is untouched, the plugin's pod is replaced and registers
again, the old ClusterRole and binding `gpushare-device-plugin` are gone (Helm deletes what the new chart lacks), and
a new pod lands on its recorded GPU.
"""

from __future__ import annotations

import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import gpushare, install
from e2e.cluster import REPO, Cluster
from e2e.kube import Kubectl
from tests.harness.realtier import scenarios
from tests.harness.realtier import workloads as w

pytestmark = pytest.mark.usefixtures("needs_extender")

# The last commit whose chart used the names the reference stack uses (ClusterRole gpushare-device-plugin, node
# label gpushare=true).
PREVIOUS = "cf9f2a8da40f4b43d066f42d6cf48f3ef258c576"
OLD_LABEL = "gpushare=true"
OLD_NAME = "gpushare-device-plugin"


def previous_chart(into: Path) -> Path:
    """charts/gpushare at PREVIOUS, extracted from the repository's history."""
    found = subprocess.run(["git", "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], cwd=REPO, capture_output=True,
                           check=False)
    if found.returncode != 0:
        pytest.fail(f"commit {PREVIOUS} is not in this clone's history (a shallow clone?): the upgrade test needs "
                    "the previous chart from it; clone with full history (git fetch --unshallow)")
    into.mkdir(parents=True, exist_ok=True)
    archive = into / "previous.tar"
    subprocess.run(["git", "archive", "--output", str(archive), PREVIOUS, "charts/gpushare"], cwd=REPO, check=True,
                   capture_output=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "charts" / "gpushare"


@pytest.fixture(scope="module")
def previous(cluster: Cluster) -> Iterator[Cluster]:
    kubectl = cluster.kubectl()
    node = cluster.settings.node_name
    kubectl.ok(["label", "node", node, f"{install.GPU_NODE_LABEL_KEY}-", OLD_LABEL, "--overwrite"])
    chart = previous_chart(cluster.run / "install" / "previous")
    values = install.write_values(cluster, cluster.run / "install" / "upgrade-names.yaml", certificates="self-signed")
    try:
        install.helm(cluster, "install", install.RELEASE, str(chart), "--namespace", install.RELEASE_NAMESPACE,
                     "-f", str(values))
        install.certs_install(cluster)
        install.wait_serving(cluster)
        install.wait_node_serving(cluster)
        yield cluster
    finally:
        install.helm(cluster, "uninstall", install.RELEASE, "--namespace", install.RELEASE_NAMESPACE,
                     "--ignore-not-found", install.wait())
        kubectl.ok(["label", "node", node, "gpushare-", f"{install.GPU_NODE_LABEL_KEY}-"])


def _running_on_recorded_gpu(cluster: Cluster, kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    [pod] = [p for p in w.pods(kubectl, namespace) if p["metadata"]["name"] == name]
    rep = w.report(kubectl, namespace, name, "main")
    got = None if rep is None else w.gpu_of(rep, "env", cluster.settings.node_name, cluster.settings.fake_gpus)
    assert got is not None and got == w.assigned_index(pod), w.why_no_gpu(kubectl, namespace, name, "main", rep)
    return pod


def assert_kept_and_placing(cluster: Cluster, kubectl: Kubectl, namespace: str, before: dict[str, Any]) -> None:
    """After an upgrade: the pod `before` (running before it) is the same pod with the same containers, never
    restarted, still on its recorded GPU; and a new pod lands on its own recorded GPU."""
    after = _running_on_recorded_gpu(cluster, kubectl, namespace, "before")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert [(s["containerID"], s["restartCount"]) for s in after["status"]["containerStatuses"]] == [
        (s["containerID"], s["restartCount"]) for s in before["status"]["containerStatuses"]]
    assert w.create(kubectl, namespace, w.pod("after", [w.container("main", w.image(cluster), 2)]))[0] == 0
    w.wait_running(kubectl, namespace, 2, 180)
    _running_on_recorded_gpu(cluster, kubectl, namespace, "after")


def test_an_upgrade_from_the_previous_chart_keeps_pods_and_drops_the_old_names(
        previous: Cluster, kubectl: Kubectl, namespace: str) -> None:
    img = w.image(previous)
    assert w.create(kubectl, namespace, w.pod("before", [w.container("main", img, 2)]))[0] == 0
    w.wait_running(kubectl, namespace, 1, 180)
    before = _running_on_recorded_gpu(previous, kubectl, namespace, "before")
    assert kubectl.run(["get", "clusterrole", OLD_NAME], timeout=20)[0] == 0, "the previous chart's ClusterRole"

    node = previous.settings.node_name
    kubectl.ok(["label", "node", node, install.GPU_NODE_LABEL, "--overwrite"])
    log = previous.log("kubelet")
    offset = log.stat().st_size
    values = previous.run / "install" / "upgrade-names.yaml"
    install.helm(previous, "upgrade", install.RELEASE, str(previous.chart), "--namespace", install.RELEASE_NAMESPACE,
                 "-f", str(values), install.wait(), "--timeout", "5m")
    kubectl.ok(["label", "node", node, "gpushare-"])
    w.wait("the upgraded plugin registered with the kubelet", lambda: scenarios.REGISTERED in log.read_bytes()[offset:],
           180, 2)
    install.wait_serving(previous)
    install.wait_node_serving(previous)

    for kind in ("clusterrole", "clusterrolebinding"):
        assert kubectl.run(["get", kind, OLD_NAME], timeout=20)[0] != 0, f"the old {kind} {OLD_NAME} is left"
        assert kubectl.run(["get", kind, "gpushare-system-device-plugin"], timeout=20)[0] == 0, kind
    plugins = w.pods(kubectl, gpushare.NAMESPACE, "app.kubernetes.io/name=gpushare-device-plugin")
    assert len(plugins) == 1 and plugins[0]["spec"]["nodeSelector"] == {"gpushare.io/gpu-memory": "device-plugin"}

    assert_kept_and_placing(previous, kubectl, namespace, before)
