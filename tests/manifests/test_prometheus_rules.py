"""The monitoring component's alerts: each on metrics the programs define, with a severity, a summary, a
description and a runbook section, and each firing under promtool (Prometheus's own rule evaluator) when the
series the programs expose are driven into its condition, and quiet when they are not."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

from tests.harness import alerts, promtool
from tests.harness.manifests.render import OVERLAYS, find, render_with_component
from tests.harness.plugin.rig import make_rig
from tests.harness.webhook.server import webhook_server

TROUBLESHOOTING = alerts.REPO / "docs" / "troubleshooting.md"
SEVERITIES = {"warning", "critical"}


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings: lower case, punctuation dropped, spaces as dashes."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in markdown.splitlines() if line.startswith("#")}


def test_the_rules_use_only_metrics_that_the_programs_define(tmp_path: Path) -> None:
    used = alerts.used_metric_names(rule["expr"] for rule in alerts.rules())
    known = alerts.known_metric_names(tmp_path)
    assert used and used <= known, sorted(used - known)


@pytest.mark.parametrize("rule", alerts.rules(), ids=lambda r: f"{r['alert']}-{r['labels']['severity']}")
def test_every_alert_says_how_bad_what_and_where_to_read_on(rule: dict[str, object]) -> None:
    labels, annotations = rule["labels"], rule["annotations"]
    assert isinstance(labels, dict) and isinstance(annotations, dict)
    assert labels["severity"] in SEVERITIES
    assert annotations["summary"] and annotations["description"]
    page, anchor = str(annotations["runbook_url"]).split("#")
    assert page == "docs/troubleshooting.md"
    assert anchor == str(rule["alert"]).lower()
    assert anchor in _anchors(TROUBLESHOOTING.read_text()), f"no section for {rule['alert']} in {page}"


def test_every_alert_is_driven_by_series_the_programs_expose(tmp_path: Path) -> None:
    series = alerts.product_series(tmp_path)
    for name in alerts.alert_names():
        drives = [d for d in alerts.DRIVES if d.alert == name]
        assert drives, f"{name} has no drive in tests/harness/alerts.py"
        for drive in drives:
            assert any(drive.picks(key) for key in series), drive


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_component_ships_the_rules(overlay: str, tmp_path: Path) -> None:
    rule = find(render_with_component(overlay, "monitoring", tmp_path), "PrometheusRule", "gpushare")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]] == [r["alert"] for r in alerts.rules()]


@pytest.mark.timeout(promtool.BUILD_TIMEOUT)
def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    done = promtool.check_rules(alerts.rule_file(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(promtool.BUILD_TIMEOUT)
def test_each_alert_fires_when_driven_and_is_quiet_otherwise(tmp_path: Path) -> None:
    failures = alerts.check(alerts.product_series(tmp_path / "certs"), tmp_path / "promtool")
    assert failures == {}, alerts.report(failures)


@pytest.mark.timeout(promtool.BUILD_TIMEOUT)
def test_each_alert_fires_on_what_the_running_programs_serve(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The install tier's check (tests/install) on this machine: the real gunicorn webhook's and a registered
    device plugin's /metrics text, as served, turned into promtool's series."""
    rigs = make_rig(tmp_path_factory.mktemp("plugin"))
    rig = next(rigs)
    try:
        rig.kubelet.wait_registrations(1)
        assert rig.plugin.metrics_server is not None
        host, port = rig.plugin.metrics_server.address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as answer:
            series = alerts.series_of(answer.read().decode(), alerts.Target("device-plugin", "plugin-0"))
    finally:
        rigs.close()
    with webhook_server(tmp_path_factory.mktemp("hook"), {"GPUSHARE_WORKERS": "2"}) as hook:
        series.update(alerts.series_of(hook.scrape(), alerts.Target("webhook", "webhook-0")))
    assert series[("gpushare_deviceplugin_registered", _target("device-plugin", "plugin-0"))] == 1
    assert alerts.driven_alerts(series) == set(alerts.alert_names()) - {"GpuShareDraSlicesMissing"}
    failures = alerts.check(series, tmp_path_factory.mktemp("promtool"))
    assert failures == {}, alerts.report(failures)


def _target(program: str, pod: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(alerts.Target(program, pod).labels().items()))
