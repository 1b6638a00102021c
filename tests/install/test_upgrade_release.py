"""`helm upgrade` from the previous release to this one, both from their artifacts: the previous tag's chart and
image (built in a git worktree of the tag, tests/harness/realtier/releases.py) installed with a pod running, then the
current release's packaged chart and image. The running pod is untouched, the plugin's pod is replaced and registers
again, every pod of ours runs the current image, and a new pod lands on its recorded GPU.

Skipped, saying so, while no earlier version is tagged (the first release is both the previous and the current one).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

from e2e import install
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.harness.realtier import scenarios
from tests.harness.realtier import workloads as w
from tests.harness.realtier.releases import Release, Releases
from tests.install.test_install import PODS, _ours
from tests.install.test_install_cert_manager import Loop, _check_loop_pods
from tests.install.test_upgrade_names import _running_on_recorded_gpu, assert_kept_and_placing

pytestmark = pytest.mark.usefixtures("needs_extender")


@pytest.fixture(scope="module")
def previous(releases: Releases, cluster: Cluster) -> Iterator[Release]:
    if releases.previous is None:
        if releases.previous_failed:
            pytest.fail(releases.no_previous)
        pytest.skip(releases.no_previous)
    kubectl = cluster.kubectl()
    kubectl.ok(["label", "node", cluster.settings.node_name, install.GPU_NODE_LABEL, "--overwrite"])
    values = install.write_values(cluster, cluster.run / "install" / "upgrade-release.yaml",
                                  certificates="self-signed", tag=releases.previous.version)
    try:
        install.helm(cluster, "install", install.RELEASE, str(releases.previous.artifacts.chart), "--namespace",
                     install.RELEASE_NAMESPACE, "-f", str(values))
        install.certs_install(cluster)
        install.wait_serving(cluster)
        install.wait_node_serving(cluster)
        yield releases.previous
    finally:
        install.helm(cluster, "uninstall", install.RELEASE, "--namespace", install.RELEASE_NAMESPACE,
                     "--ignore-not-found", install.wait())


def test_an_upgrade_from_the_previous_release_keeps_pods_and_runs_the_new_image(
        previous: Release, cluster: Cluster, kubectl: Kubectl, namespace: str) -> None:
    img = w.image(cluster)
    assert w.create(kubectl, namespace, w.pod("before", [w.container("main", img, 2)]))[0] == 0
    w.wait_running(kubectl, namespace, 1, 180)
    before = _running_on_recorded_gpu(cluster, kubectl, namespace, "before")

    log = cluster.log("kubelet")
    offset = log.stat().st_size
    # The same values as the install but the image: the current release's tag.
    values = install.write_values(cluster, cluster.run / "install" / "upgrade-release.yaml", certificates="self-signed")
    try:
        # Pods created throughout, every other one GPU-share: none refused at admission, none on a wrong GPU.
        with Loop(cluster, namespace) as loop:
            loop.until(20, 120)
            install.helm(cluster, "upgrade", install.RELEASE, str(cluster.chart), "--namespace",
                         install.RELEASE_NAMESPACE, "-f", str(values), install.wait(), "--timeout", "5m", timeout=360)
            loop.until(120, 600)
        checked, wrong, rejected = _check_loop_pods(cluster, kubectl, namespace, "env")  # write_values' default
    finally:
        kubectl.run(["delete", "--raw", f"/api/v1/namespaces/{namespace}/pods?labelSelector=loop"], timeout=120)
    print(f"\nhelm upgrade {previous.version} -> {install.image_values(cluster)['tag']} while creating pods: "
          f"{loop.created} created, {len(loop.refused)} refused at admission; {checked} GPU-share pods ran and were "
          f"checked, {len(wrong)} failed or not on their GPU; {len(rejected)} rejected by the kubelet while the "
          f"plugin re-registered: {rejected}", file=sys.stderr)
    assert loop.refused == [], loop.refused[:5]
    assert wrong == [], wrong[:10]
    w.wait("the upgraded plugin registered with the kubelet", lambda: scenarios.REGISTERED in log.read_bytes()[offset:],
           180, 2)
    install.wait_serving(cluster)
    install.wait_node_serving(cluster)
    image = install.image_values(cluster)
    ref = f"{image['repository']}:{image['tag']}"
    for p in _ours(kubectl, PODS):
        if w.phase(p) == "Running" and not p["metadata"].get("deletionTimestamp"):
            assert {c["image"] for c in p["spec"]["containers"]} == {ref}, p["metadata"]["name"]
    [release] = json.loads(install.helm(cluster, "list", "--namespace", install.RELEASE_NAMESPACE, "-o", "json"))
    assert (release["chart"], release["app_version"]) == (f"gpushare-{image['tag']}", image["tag"]), release

    assert_kept_and_placing(cluster, kubectl, namespace, before)
