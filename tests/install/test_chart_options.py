"""The chart as an operator types it: `helm install -n gpushare-system --create-namespace`, the image by digest
through a pull secret, the webhook's pods at a PriorityClass of the cluster's; then `helm test`, which asks the
API server for a dry-run GPU-share pod and checks that the webhook, through its Service, stamped it.

The tests of this module run in order on one install (the first installs, the last uninstalls).
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from e2e import gpushare, install
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from e2e.projectimage import manifest_of
from tests.harness.realtier import workloads as w
from tests.install.test_install import PODS, _ours, _ready, assert_nothing_of_ours_left

pytestmark = pytest.mark.usefixtures("needs_extender")

NAMESPACE = gpushare.NAMESPACE  # the release lives where its objects do, as users type it
PRIORITY_CLASS = "gpushare-e2e-critical"
PRIORITY = 900_000_000
PULL_SECRET = "gpushare-e2e-pull"


def _digest(cluster: Cluster) -> str:
    image = cluster.toolchain.image
    assert image is not None, "the project's image was not built"
    return "sha256:" + hashlib.sha256(manifest_of(image.layout, image.tag)).hexdigest()


def _pull_secret(registry: str) -> dict[str, Any]:
    auth = base64.b64encode(b"gpushare:e2e").decode()
    config = {"auths": {registry: {"auth": auth}}}
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": PULL_SECRET, "namespace": NAMESPACE},
            "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()}}


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[Cluster]:
    kubectl = cluster.kubectl()
    kubectl.ok(["label", "node", cluster.settings.node_name, install.GPU_NODE_LABEL, "--overwrite"])
    kubectl.ok(["create", "-f", "-"], stdin=json.dumps({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": PRIORITY_CLASS},
        "value": PRIORITY, "description": "the install tier's class for the webhook's pods"}))
    image = install.image_values(cluster)
    values = install.write_values(cluster, cluster.run / "install" / "options.yaml", certificates="self-signed",
                                  extra={"image": {**image, "digest": _digest(cluster)},
                                         "imagePullSecrets": [{"name": PULL_SECRET}],
                                         "webhook": {"priorityClassName": PRIORITY_CLASS}})
    try:
        install.helm(cluster, "install", install.RELEASE, str(cluster.chart), "--namespace", NAMESPACE,
                     "--create-namespace", "-f", str(values))
        registry = str(image["repository"]).split("/", 1)[0]
        kubectl.ok(["create", "-f", "-"], stdin=json.dumps(_pull_secret(registry)))
        install.certs_install(cluster)
        yield cluster
    finally:
        install.helm(cluster, "uninstall", install.RELEASE, "--namespace", NAMESPACE, "--ignore-not-found",
                     install.wait())
        kubectl.run(["delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true"], timeout=180)
        kubectl.run(["delete", "priorityclass", PRIORITY_CLASS, "--ignore-not-found"])


def test_the_release_in_gpushare_system_runs_the_image_by_digest(installed: Cluster, kubectl: Kubectl) -> None:
    w.wait("2 webhook pods Ready",
           lambda: sum(map(_ready, _ours(kubectl, "app.kubernetes.io/name=gpushare-webhook"))) == 2, 240, 2)
    w.wait("the device plugin's pod Ready",
           lambda: sum(map(_ready, _ours(kubectl, "app.kubernetes.io/name=gpushare-device-plugin"))) == 1, 120, 2)
    namespace = kubectl.json(["get", "namespace", NAMESPACE])["metadata"]
    assert "pod-security.kubernetes.io/enforce" not in (namespace.get("labels") or {}), "Helm made it, unlabelled"
    reference = f"{install.image_values(installed)['repository']}@{_digest(installed)}"
    for p in _ours(kubectl, PODS):
        name = p["metadata"]["name"]
        assert {c["image"] for c in p["spec"]["containers"]} == {reference}, name
        assert p["spec"]["imagePullSecrets"] == [{"name": PULL_SECRET}], name
        # What the container runs is the digest asked for (the kubelet reports the resolved image ID).
        assert all(s["imageID"].endswith(_digest(installed)) for s in p["status"]["containerStatuses"]), name
    for p in _ours(kubectl, "app.kubernetes.io/name=gpushare-webhook"):
        assert (p["spec"]["priorityClassName"], p["spec"]["priority"]) == (PRIORITY_CLASS, PRIORITY)
    release = json.loads(install.helm(installed, "list", "--namespace", NAMESPACE, "-o", "json"))
    assert [(r["name"], r["status"]) for r in release] == [(install.RELEASE, "deployed")], release


def test_helm_test_passes_through_the_webhooks_service(installed: Cluster, kubectl: Kubectl) -> None:
    install.wait_serving(installed)
    out = install.helm(installed, "test", install.RELEASE, "--namespace", NAMESPACE, "--logs", "--timeout", "120s")
    print(f"\nhelm test:\n{out}", file=sys.stderr)
    assert "through the webhook's Service, stamped gpushare.io/intent=" in out, out
    # hook-succeeded: nothing of the test is left, least of all its permission to create pods in default.
    for kind, where in (("pod", NAMESPACE), ("serviceaccount", NAMESPACE), ("role", "default"),
                        ("rolebinding", "default")):
        assert kubectl.run(["get", kind, "gpushare-helm-test", "-n", where], timeout=10)[0] != 0, kind


def test_uninstall_and_the_namespace_leave_nothing_of_ours(installed: Cluster, kubectl: Kubectl) -> None:
    install.helm(installed, "uninstall", install.RELEASE, "--namespace", NAMESPACE, install.wait())
    # Helm leaves the namespace it created (helm uninstall never deletes one); deleting it is the operator's step.
    kubectl.ok(["delete", "namespace", NAMESPACE, "--wait=true"], timeout=180)
    assert_nothing_of_ours_left(kubectl)
