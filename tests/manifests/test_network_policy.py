"""The base install's NetworkPolicies: every TCP port of the webhook and the device plugin is admitted by exactly one
rule, the admission port to the API server's sources, the metrics ports to the monitoring stack."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.manifests.render import NAMESPACE, OVERLAYS, container, env_of, find, pod_spec, render

MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
WORKLOADS = [  # (kind, name, container, policy)
    ("Deployment", "gpushare-webhook", "webhook", "gpushare-webhook"),
    ("DaemonSet", "gpushare-device-plugin", "device-plugin", "gpushare-device-plugin"),
]


def rules_by_port(policy: dict[str, Any]) -> dict[int, list[Any]]:
    """Container port -> the peers of the one rule that admits it."""
    out: dict[int, list[Any]] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["protocol"] == "TCP" and port["port"] not in out
            out[port["port"]] = rule.get("from", [])
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize(("kind", "name", "ctr", "policy_name"), WORKLOADS)
def test_each_workload_has_a_policy_for_exactly_its_ports(overlay: str, kind: str, name: str, ctr: str,
                                                           policy_name: str) -> None:
    objs = render(overlay)
    policy = find(objs, "NetworkPolicy", policy_name)
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert policy["spec"]["policyTypes"] == ["Ingress"], "egress (to the API server) is left alone"
    spec = pod_spec(objs, kind, name)
    labels = find(objs, kind, name)["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    assert not spec.get("hostNetwork"), "a NetworkPolicy does not apply to a pod in the host network"
    ports = {p["containerPort"] for p in container(spec, ctr)["ports"]}
    assert set(rules_by_port(policy)) == ports


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_admission_port_admits_every_source_until_the_api_servers_are_set(overlay: str) -> None:
    objs = render(overlay)
    env = env_of(container(pod_spec(objs, "Deployment", "gpushare-webhook"), "webhook"), objs)
    webhook = rules_by_port(find(objs, "NetworkPolicy", "gpushare-webhook"))
    assert webhook[int(env["GPUSHARE_BIND"].rsplit(":", 1)[1])] == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_metrics_ports_admit_the_monitoring_namespace_alone(overlay: str) -> None:
    objs = render(overlay)
    for kind, name, ctr, policy_name in WORKLOADS:
        env = env_of(container(pod_spec(objs, kind, name), ctr), objs)
        port = int(env["GPUSHARE_METRICS_BIND"].rsplit(":", 1)[1])
        assert rules_by_port(find(objs, "NetworkPolicy", policy_name))[port] == MONITORING
