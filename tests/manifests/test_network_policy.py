"""The optional network-policy component: rendered into an overlay, it admits only its ipBlocks to the serving port."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.manifests.render import (
    MANIFESTS,
    NAMESPACE,
    OVERLAYS,
    container,
    find,
    kubectl,
    pod_spec,
    render_with_component,
)


def render_with_policy(overlay: str, tmp_path: Path) -> list[dict[str, Any]]:
    return render_with_component(overlay, "network-policy", tmp_path)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_policy_selects_the_webhook_pods_and_admits_only_its_port(overlay: str, tmp_path: Path) -> None:
    objs = render_with_policy(overlay, tmp_path)
    policy = find(objs, "NetworkPolicy", "gpushare-webhook-from-apiserver")
    assert policy["metadata"]["namespace"] == NAMESPACE
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    template_labels = find(objs, "Deployment", "gpushare-webhook")["spec"]["template"]["metadata"]["labels"]
    assert all(template_labels.get(k) == v for k, v in spec["podSelector"]["matchLabels"].items())
    ports = [p["containerPort"] for p in container(pod_spec(objs, "Deployment", "gpushare-webhook"),
                                                   "webhook")["ports"] if p["name"] == "https"]  # not metrics
    [rule] = spec["ingress"]
    assert [p["port"] for p in rule["ports"]] == ports
    assert all(set(source) == {"ipBlock"} for source in rule["from"]), "only address ranges, never a pod selector"


def test_the_overlays_alone_have_no_network_policy() -> None:
    for overlay in OVERLAYS:
        done = subprocess.run([kubectl(), "kustomize", str(MANIFESTS / overlay)], capture_output=True, text=True,
                              timeout=60, check=True)
        assert "NetworkPolicy" not in done.stdout
