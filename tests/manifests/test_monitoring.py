"""The optional monitoring component: PodMonitors that find the metrics ports, and a dashboard of real metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from common.settings import metrics_address
from tests.harness.alerts import known_metric_names, product_registries, used_metric_names
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
    used = used_metric_names(exprs)
    assert used and used <= known, sorted(used - known)
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_dashboard_shows_every_metric_of_the_dra_driver(tmp_path: Path) -> None:
    dashboard = json.loads((MANIFESTS / "monitoring" / "grafana-dashboard.json").read_text())
    used = used_metric_names(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    [registry] = product_registries(tmp_path)["dra-plugin"]
    suffixes = {"counter": "_total", "gauge": ""}
    driver = {f.name + suffixes[f.type] for f in registry.collect()} - {"gpushare_build_info"}
    assert driver and driver <= used, sorted(driver - used)
