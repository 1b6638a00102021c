"""Pods that cannot be served are refused with an Event and a message that says why, on the real node."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from e2e import settings as ports
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.harness.realtier import workloads as w


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_pod_larger_than_any_gpu_waits_with_the_extenders_reason(cluster: Cluster, needs_extender: None,
                                                                  kubectl: Kubectl, namespace: str) -> None:
    assert w.create(kubectl, namespace, w.pod("huge", [w.container("main", w.image(cluster), 80)]))[0] == 0

    def explained() -> bool:
        # The reference extender's filter (pkg/scheduler/predicate.go, checkNode), in the scheduler's Event.
        return any(e.get("reason") == "FailedScheduling" and "Insufficient GPU Memory in one device" in
                   e.get("message", "") for e in w.events(kubectl, namespace, "huge"))

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

    # The plugin's own Event on the pod it refused (the only pod waiting for 4 units), with the reason and the fix.
    def own_event() -> list[dict[str, object]]:
        return [e for e in w.events(kubectl, namespace, "unplaced") if e.get("reason") == "GpuShareNotPlaced"]

    w.wait("the plugin's GpuShareNotPlaced Event", lambda: bool(own_event()), 30)
    event = own_event()[0]
    assert event["type"] == "Warning" and event["source"] == {"component": "gpushare-device-plugin",
                                                               "host": cluster.settings.node_name}, event
    message = str(event["message"])
    assert f"for pod {namespace}/unplaced on node {cluster.settings.node_name} was refused" in message, message
    assert "configure the gpushare scheduler extender" in message, message
    plugin = scrape(cluster.settings.port(ports.PLUGIN_METRICS))
    refused = (("method", "Allocate"), ("reason", "GpuShareNotPlaced"))
    assert plugin[("gpushare_deviceplugin_refusals_total", refused)] >= 1
    assert plugin[("gpushare_deviceplugin_events_total", (("reason", "GpuShareNotPlaced"), ("type", "Warning")))] >= 1
    webhook = scrape(cluster.settings.port(ports.WEBHOOK_METRICS))
    stamped = (("endpoint", "mutate"), ("operation", "CREATE"), ("outcome", "allowed"))
    assert webhook[("gpushare_webhook_reviews_total", stamped)] >= 1
