"""The monitoring component's alerts: each on metrics the programs define, with a severity, a summary, a
description and a runbook section, and each firing under promtool (Prometheus's own rule evaluator) when the
series the programs expose are driven into its condition, and quiet when they are not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.harness import alerts, promtool
from tests.harness.manifests.render import OVERLAYS, find, render_with_component

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
    assert failures == {}, "\n\n".join(f"{alert}:\n{text}" for alert, text in failures.items())
