"""What the device plugin's identity may do, enforced by the real API server: only its own annotations, only on pods
bound to the node its token names, and of node status only its own node's GPU count. The plugin's ServiceAccount has
cluster-wide pod patch rights (RBAC cannot say "pods of my node"), so without the admission policies one GPU node's
token could rewrite any pod in the cluster, e.g. the image of a kube-system pod on another node."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from contract import ASSIGNED
from e2e import gpushare
from e2e.cluster import Cluster
from e2e.kube import Kubectl, KubeError, Rest
from tests.harness.realtier import workloads as w

OTHER = "gpushare-e2e-other-node"  # a Node object without a kubelet: pods bound to it stay Pending
STRATEGIC = "application/strategic-merge-patch+json"


@pytest.fixture(scope="module")
def other_node(cluster: Cluster) -> Iterator[str]:
    kubectl = cluster.kubectl()
    if kubectl.run(["get", "node", OTHER])[0] != 0:
        kubectl.ok(["create", "-f", "-"], stdin=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                            "metadata": {"name": OTHER}}))
    yield OTHER


def plugin(cluster: Cluster, node: str) -> Rest:
    """The plugin's identity with a token bound to `node`, as the DaemonSet's projected token is."""
    token = gpushare.token(cluster.kubectl(), *gpushare.PLUGIN_SA, node=node)
    return Rest(cluster.server, cluster.pki_dir / "ca.crt", token=token)


def refused(api: Rest, method: str, path: str, body: object, content_type: str = STRATEGIC) -> str:
    with pytest.raises(KubeError) as caught:
        api.call(method, path, body, content_type)
    assert caught.value.status in (403, 422), caught.value
    return caught.value.message


def test_the_plugin_cannot_change_a_pod_of_another_node(cluster: Cluster, kubectl: Kubectl, other_node: str) -> None:
    """The review's finding as it was: a plugin token from one node patching the image of a kube-system pod bound to
    another node. The pod is bound there at creation (spec.nodeName), so no kubelet runs it."""
    name = "gpushare-e2e-victim"
    kubectl.run(["delete", "pod", name, "-n", "kube-system", "--grace-period=0", "--force"])
    victim = w.pod(name, [w.container("main", w.image(cluster))])
    victim["spec"]["nodeName"] = other_node
    assert w.create(kubectl, "kube-system", victim)[0] == 0
    try:
        path = f"/api/v1/namespaces/kube-system/pods/{name}"
        image = {"spec": {"containers": [{"name": "main", "image": "attacker/evil:1"}]}}
        for node in (cluster.settings.node_name, other_node):  # a token of this node, and one of the pod's own node
            message = refused(plugin(cluster, node), "PATCH", path, image)
            assert "spec" in message, message
        label = {"metadata": {"labels": {"pwned": "yes"}}}
        assert "label" in refused(plugin(cluster, other_node), "PATCH", path, label)
        shown = kubectl.json(["get", "pod", name, "-n", "kube-system"])
        assert shown["spec"]["containers"][0]["image"] == victim["spec"]["containers"][0]["image"]
        assert "pwned" not in (shown["metadata"].get("labels") or {})
    finally:
        kubectl.run(["delete", "pod", name, "-n", "kube-system", "--grace-period=0", "--force"])


def test_the_plugin_of_this_node_changes_only_its_own_annotations(cluster: Cluster, needs_extender: None,
                                                                  kubectl: Kubectl, namespace: str) -> None:
    assert w.create(kubectl, namespace, w.pod("mine", [w.container("main", w.image(cluster), 4)]))[0] == 0
    pod = w.wait_running(kubectl, namespace, 1, 120)[0]
    api = plugin(cluster, cluster.settings.node_name)
    path = f"/api/v1/namespaces/{namespace}/pods/mine"
    # What the plugin writes (ASSIGNED, already "true" here) passes; anything else of the pod does not.
    api.call("PATCH", path, {"metadata": {"annotations": {ASSIGNED: "true"}}}, STRATEGIC)
    for change in ({"spec": {"containers": [{"name": "main", "image": "attacker/evil:1"}]}},
                   {"metadata": {"labels": {"pwned": "yes"}}},
                   {"metadata": {"annotations": {"example.com/other": "x"}}}):
        refused(api, "PATCH", path, change)
    refused(api, "PATCH", path + "/status", {"status": {"phase": "Failed"}})
    after = kubectl.json(["get", "pod", "mine", "-n", namespace])
    assert after["spec"]["containers"][0]["image"] == pod["spec"]["containers"][0]["image"]
    assert "example.com/other" not in w.annotations_of(after) and w.phase(after) == "Running"


def test_the_plugin_sets_only_its_own_nodes_gpu_count(cluster: Cluster, other_node: str) -> None:
    api = plugin(cluster, cluster.settings.node_name)
    count = {"status": {"capacity": {"aliyun.com/gpu-count": "8"}}}
    refused(api, "PATCH", f"/api/v1/nodes/{other_node}/status", count)
    refused(api, "PATCH", f"/api/v1/nodes/{cluster.settings.node_name}/status",
            {"status": {"capacity": {"cpu": "64"}}})


def test_a_binding_carries_reserved_annotations_only_from_the_extender(cluster: Cluster, kubectl: Kubectl,
                                                                       namespace: str, other_node: str) -> None:
    """A Binding's annotations are copied onto the pod by the API server without a pod UPDATE (storage.go,
    setPodNodeAndMetadata), so the Binding itself is checked: an administrator's Binding naming a GPU is refused,
    a plain one binds. The extender's own Bindings carry no annotations (test_extender_writes audits them)."""
    spec = w.pod("unscheduled", [w.container("main", w.image(cluster))])
    spec["spec"]["schedulerName"] = "gpushare-e2e-no-such-scheduler"  # nothing schedules it: it waits for a Binding
    assert w.create(kubectl, namespace, spec)[0] == 0
    api = Rest(cluster.server, cluster.pki_dir / "ca.crt",
               client=(cluster.pki_dir / "admin.crt", cluster.pki_dir / "admin.key"))
    path = f"/api/v1/namespaces/{namespace}/pods/unscheduled/binding"

    def binding(annotations: dict[str, str]) -> dict[str, object]:
        return {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": "unscheduled", "namespace": namespace, "annotations": annotations},
                "target": {"apiVersion": "v1", "kind": "Node", "name": other_node}}

    message = refused(api, "POST", path, binding({"ALIYUN_COM_GPU_MEM_IDX": "0"}), "application/json")
    assert "ALIYUN_COM_GPU_MEM_IDX" in message, message
    assert not kubectl.json(["get", "pod", "unscheduled", "-n", namespace])["spec"].get("nodeName")
    api.call("POST", path, binding({}))
    assert kubectl.json(["get", "pod", "unscheduled", "-n", namespace])["spec"]["nodeName"] == other_node


def test_without_the_policy_the_webhook_still_holds_the_plugin_to_its_node(cluster: Cluster, needs_extender: None,
                                                                           kubectl: Kubectl, namespace: str,
                                                                           other_node: str) -> None:
    """Clusters without ValidatingAdmissionPolicies (older than 1.30, or the policies left out) rely on the webhook,
    which reads the node from the token's userInfo.extra: with the policy's binding removed, a plugin token of
    another node is refused by the webhook entry validate-plugin.gpushare.io itself."""
    assert w.create(kubectl, namespace, w.pod("target", [w.container("main", w.image(cluster), 4)]))[0] == 0
    w.wait_running(kubectl, namespace, 1, 120)
    api, path = plugin(cluster, other_node), f"/api/v1/namespaces/{namespace}/pods/target"
    saved = kubectl.json(["get", "validatingadmissionpolicybinding", "gpushare-device-plugin-pods"])
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        saved["metadata"].pop(key, None)
    kubectl.ok(["delete", "validatingadmissionpolicybinding", "gpushare-device-plugin-pods"])
    try:
        deadline, message = time.monotonic() + 60, ""
        while "validate-plugin.gpushare.io" not in message:  # the API server drops the policy asynchronously
            assert time.monotonic() < deadline, f"the policy's removal took no effect within 60 s: {message}"
            message = refused(api, "PATCH", path, {"metadata": {"annotations": {ASSIGNED: "true"}}})
            time.sleep(0.5)
        assert f"of node {other_node}" in message and "bound to node" in message, message
    finally:
        kubectl.ok(["create", "-f", "-"], stdin=json.dumps(saved))
