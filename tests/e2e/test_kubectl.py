"""What users do with kubectl against the real API server, which calls the real webhook over TLS with the
caBundle that `gpushare-certs install` set: create, apply, get, annotate, and updates through pods/status."""

from __future__ import annotations

import json

import pytest

from contract import IDX
from e2e import gpushare
from e2e.cluster import Cluster
from e2e.kube import Kubectl, KubeError, Rest
from tests.harness.realtier import workloads as w

# GPU-share pods here are placed by the reference scheduler extender (skipped, with the reason, without it).
pytestmark = pytest.mark.usefixtures("needs_extender")


def test_apply_and_get_show_a_stamped_pod(cluster: Cluster, kubectl: Kubectl, namespace: str) -> None:
    spec = w.pod("applied", [w.container("main", w.image(cluster), 4)])
    tenant = cluster.kubectl(as_tenant=True)
    tenant.ok(["apply", "-n", namespace, "-f", "-"], stdin=json.dumps(spec))
    running = w.wait_running(kubectl, namespace, 1, 120)[0]
    shown = tenant.json(["get", "pod", "applied", "-n", namespace])
    annotations = w.annotations_of(shown)
    assert "gpushare.io/intent" in annotations and "gpushare.io/intent-signature" in annotations
    assert annotations["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "true" and "gpushare.io/allocation" in annotations
    assert w.assigned_index(shown) == w.assigned_index(running)
    # A second apply of the same file changes nothing the webhook guards.
    tenant.ok(["apply", "-n", namespace, "-f", "-"], stdin=json.dumps(spec))


def test_an_ordinary_user_cannot_move_a_pod_to_another_gpu(cluster: Cluster, kubectl: Kubectl,
                                                           namespace: str) -> None:
    assert w.create(kubectl, namespace, w.pod("mine", [w.container("main", w.image(cluster), 4)]))[0] == 0
    pod = w.wait_running(kubectl, namespace, 1, 120)[0]
    other = (w.assigned_index(pod) or 0) + 1
    tenant = cluster.kubectl(as_tenant=True)
    code, out, err = tenant.run(["annotate", "pod", "mine", "-n", namespace, f"{IDX}={other}", "--overwrite"])
    assert code != 0 and "ALIYUN_COM_GPU_MEM_" in err, err + out
    code, _, err = tenant.run(["annotate", "pod", "mine", "-n", namespace, "gpushare.io/intent-"])
    assert code != 0 and "gpushare.io/" in err, err
    assert w.assigned_index(kubectl.json(["get", "pod", "mine", "-n", namespace])) == w.assigned_index(pod)


def test_reserved_annotations_at_create_are_refused(cluster: Cluster, namespace: str) -> None:
    spec = w.pod("forged", [w.container("main", w.image(cluster), 4)])
    spec["metadata"]["annotations"] = {IDX: "2"}
    code, out = w.create(cluster.kubectl(as_tenant=True), namespace, spec)
    assert code != 0 and "ALIYUN_COM_GPU_MEM_" in out, out


def test_a_status_update_cannot_change_reserved_annotations(cluster: Cluster, kubectl: Kubectl,
                                                            namespace: str) -> None:
    """pods/status can change metadata.annotations in the real API server (podStatusStrategy keeps them)."""
    assert w.create(kubectl, namespace, w.pod("status", [w.container("main", w.image(cluster), 4)]))[0] == 0
    pod = w.wait_running(kubectl, namespace, 1, 120)[0]
    kubectl.ok(["create", "role", "status-writer", "-n", namespace, "--verb=get,patch,update",
                "--resource=pods/status,pods"])
    kubectl.ok(["create", "rolebinding", "status-writer", "-n", namespace, "--role=status-writer",
                "--user=tenant-user"])
    other = (w.assigned_index(pod) or 0) + 1
    patch = json.dumps({"metadata": {"annotations": {IDX: str(other)}}})
    code, out, err = cluster.kubectl(as_tenant=True).run(
        ["patch", "pod", "status", "-n", namespace, "--subresource=status", "--type=merge", "-p", patch])
    assert code != 0 and "ALIYUN_COM_GPU_MEM_" in err, f"a status update moved the pod's GPU: {out}{err}"
    assert w.assigned_index(kubectl.json(["get", "pod", "status", "-n", namespace])) == w.assigned_index(pod)


def test_the_plugin_identity_of_another_node_cannot_touch_this_nodes_pods(cluster: Cluster, kubectl: Kubectl,
                                                                          namespace: str) -> None:
    """One plugin identity for every node: a token bound to another Node names that node, and the policy lets it
    write only pods bound there. The other node is a Node object without a kubelet."""
    assert w.create(kubectl, namespace, w.pod("target", [w.container("main", w.image(cluster), 4)]))[0] == 0
    w.wait_running(kubectl, namespace, 1, 120)
    other = "gpushare-e2e-other-node"
    if kubectl.run(["get", "node", other])[0] != 0:
        kubectl.ok(["create", "-f", "-"], stdin=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                            "metadata": {"name": other}}))
    token = gpushare.token(kubectl, *gpushare.PLUGIN_SA, node=other)
    stranger = Rest(cluster.server, cluster.pki_dir / "ca.crt", token=token)
    patch = {"metadata": {"annotations": {"gpushare.io/allocation": "{}"}}}
    with pytest.raises(KubeError) as refused:
        stranger.call("PATCH", f"/api/v1/namespaces/{namespace}/pods/target", patch, "application/merge-patch+json")
    assert refused.value.status == 403 and f"of node {other} changed gpushare.io/allocation" in refused.value.message
