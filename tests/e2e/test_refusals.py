"""Pods that cannot be served are refused with an Event and a message that says why, on the real node."""

from __future__ import annotations

from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.e2e import workloads as w


def test_a_pod_larger_than_any_gpu_waits_with_the_extenders_reason(cluster: Cluster, kubectl: Kubectl,
                                                                  namespace: str) -> None:
    assert w.create(kubectl, namespace, w.pod("huge", [w.container("main", w.image(cluster), 80)]))[0] == 0

    def explained() -> bool:
        return any(e.get("reason") == "FailedScheduling" and "has 80 units free" in e.get("message", "")
                   for e in w.events(kubectl, namespace, "huge"))

    w.wait("a FailedScheduling event with the extender's reason", explained, 60)
    assert not w.pods(kubectl, namespace)[0]["spec"].get("nodeName")


def test_a_pod_bound_past_the_extender_is_refused_by_the_plugin(cluster: Cluster, kubectl: Kubectl,
                                                                namespace: str) -> None:
    """`spec.nodeName` at create skips the scheduler, so no extender wrote ALIYUN_COM_GPU_MEM_IDX: the plugin
    refuses Allocate with a message, which the kubelet turns into UnexpectedAdmissionError, and nothing runs."""
    spec = w.pod("unplaced", [w.container("main", w.image(cluster), 4)])
    spec["spec"]["nodeName"] = cluster.settings.node_name
    assert w.create(kubectl, namespace, spec)[0] == 0
    w.wait("the pod failed", lambda: w.phase(w.pods(kubectl, namespace)[0]) == "Failed", 60)
    pod = w.pods(kubectl, namespace)[0]
    assert pod["status"]["reason"] == "UnexpectedAdmissionError", pod["status"]
    assert "ALIYUN_COM_GPU_MEM_IDX" in pod["status"]["message"] and "scheduler extender" in pod["status"]["message"]
    messages = " ".join(e.get("message", "") for e in w.events(kubectl, namespace, "unplaced"))
    assert "ALIYUN_COM_GPU_MEM_IDX" in messages, messages
