"""The optional monitoring component: PodMonitors that find the metrics ports, and a dashboard of real metrics."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from certs.build import dev_bundle
from certs.cli import write_files
from common.settings import metrics_address
from contract import Contract
from deviceplugin.devices import UnitInventory
from deviceplugin.metrics import NodeCollector, PluginMetrics
from deviceplugin.trust import Context
from node.inventory import fake_gpus
from tests.harness.manifests.render import (
    MANIFESTS,
    NAMESPACE,
    OVERLAYS,
    container,
    env_of,
    find,
    pod_spec,
    render_with_component,
)
from webhook.server.metrics import CertificateExpiry, WebhookMetrics

WORKLOADS = [("Deployment", "gpushare-webhook", "webhook"), ("DaemonSet", "gpushare-device-plugin", "device-plugin")]


def render_with_monitoring(overlay: str, tmp_path: Path) -> list[dict[str, Any]]:
    return render_with_component(overlay, "monitoring", tmp_path)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_monitors_scrape_the_port_the_programs_listen_on(overlay: str, tmp_path: Path) -> None:
    objs = render_with_monitoring(overlay, tmp_path)
    for kind, name, container_name in WORKLOADS:
        monitor = find(objs, "PodMonitor", name)
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["namespace"] == NAMESPACE
        labels = find(objs, kind, name)["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
        ctr = container(pod_spec(objs, kind, name), container_name)
        ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["path"] == "/metrics"
        bind = metrics_address(env_of(ctr, objs)["GPUSHARE_METRICS_BIND"])
        assert bind == ("0.0.0.0", ports[endpoint["port"]])  # every interface of the pod, on the named port


def known_metric_names(tmp_path: Path) -> set[str]:
    """Every sample name the webhook and the plugin expose (counters with _total, histograms with their series)."""
    write_files(tmp_path, dev_bundle(datetime.datetime.now(datetime.UTC)))
    inventory = UnitInventory(fake_gpus("1x8GiB", "node-a", "GiB"), "GiB", 4096)
    ctx = Context(contract=Contract(), node_name="node-a", public_key=Ed25519PrivateKey.generate().public_key(),
                  gpus={g.index: g for g in inventory.gpus}, healthy=inventory.healthy)
    plugin = PluginMetrics()
    collectors = [
        WebhookMetrics().registry, plugin.registry, CertificateExpiry(str(tmp_path / "tls.crt")),
        NodeCollector(inventory, ctx, list, plugin),
    ]
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {family.name + suffix for c in collectors for family in c.collect() for suffix in suffixes[family.type]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_dashboard_uses_only_metrics_that_exist(overlay: str, tmp_path: Path) -> None:
    text = (MANIFESTS / "monitoring" / "grafana-dashboard.json").read_text()
    dashboard = json.loads(text)
    (tmp_path / "render").mkdir()
    objs = render_with_monitoring(overlay, tmp_path / "render")
    shipped = find(objs, "ConfigMap", "gpushare-grafana-dashboard")
    assert shipped["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(shipped["data"]["gpushare.json"]) == dashboard
    known = known_metric_names(tmp_path)
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    used = {name for expr in exprs for name in re.findall(r"gpushare_[a-z_]+", expr)}
    assert used and used <= known, sorted(used - known)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
