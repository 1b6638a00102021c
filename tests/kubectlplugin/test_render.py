"""The tables and the JSON of `kubectl gpushare`: a golden file pins the tables of a cluster with pods in every state.

After an intended change of the tables, rewrite the golden file with GPUSHARE_UPDATE_GOLDEN=1 and review its diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kubectlplugin import render
from kubectlplugin.model import Report, build
from tests.harness.kubectl_fixtures import CONTRACT, golden_cluster

GOLDEN = Path(__file__).parent / "golden" / "table.txt"


def golden_report(namespace: str | None = None) -> Report:
    nodes, pods, events = golden_cluster()
    return build(nodes, pods, events, CONTRACT, namespace=namespace)


def test_golden_table() -> None:
    report = golden_report()
    shown = render.summary(report) + "\n\n" + render.details(report) + "\n"
    if os.environ.get("GPUSHARE_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(shown)
    assert shown == GOLDEN.read_text(), "the tables changed; if intended, rerun with GPUSHARE_UPDATE_GOLDEN=1"


def test_columns_are_aligned_without_trailing_blanks() -> None:
    assert render.columns([["A", "BB", ""], ["CCC", "D", ""]]) == "A     BB\nCCC   D"


def test_json_holds_every_figure_and_pod() -> None:
    report = golden_report()
    doc = json.loads(render.as_json(report))
    assert doc == render.document(report)
    assert list(doc)[:2] == ["apiVersion", "kind"]
    assert (doc["apiVersion"], doc["kind"], doc["resource"], doc["unit"], doc["namespace"], doc["selector"]) == (
        "gpushare.io/v1", "GpushareStatus", "aliyun.com/gpu-mem", "GiB", None, None)
    gpu_b = next(n for n in doc["nodes"] if n["name"] == "gpu-b")
    assert gpu_b["gpus"] == [{
        "index": 0, "memory": 24, "promised": 12, "allocated": 0, "free": 12,
        "pods": [{"namespace": "ml", "name": "eval", "node": "gpu-b", "gpu": 0, "units": 12, "state": "refused",
                  "reason": "GpuShareNoRoom: Pod ml/eval does not fit on GPU 0 of node gpu-b: 12 GiB asked, 8 GiB "
                            "free; delete pods on that GPU or recreate the pod.",
                  "counted": True, "containers": [{"name": "main", "units": 12, "init": False}]}],
    }]
    assert [(p["name"], p["state"], p["counted"]) for p in gpu_b["unplaced"]] == [("direct", "refused", False)]
    assert [(p["name"], p["state"], p["node"]) for p in doc["pending"]] == [("fresh", "requested", None),
                                                                            ("huge", "stamped", None)]


def test_a_namespace_view_says_it_counts_one_namespace() -> None:
    text = render.summary(golden_report("ml"))
    assert text.endswith("Only pods of namespace ml are counted; run without -n to count every namespace.")


@pytest.mark.parametrize(("show", "expected"), [
    (render.summary, "No node offers aliyun.com/gpu-mem and no pod asks for it."),
    (render.details, "No pod asks for aliyun.com/gpu-mem."),
])
def test_an_empty_cluster_gets_a_sentence(show: object, expected: str) -> None:
    assert callable(show)
    assert show(build([], [], [], CONTRACT)) == expected
