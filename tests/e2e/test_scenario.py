"""The bug report's scenario on a real node: 30 GPU-share pods of 8 GiB at once, 10 deleted while the image is
pulled, the real ReplicaSet controller replacing them; every container must be on its own pod's GPU."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.e2e import workloads as w

REPLICAS, UNITS, DELETE = 30, 8, 10
PULL_MS = 10000


def outcome(cluster: Cluster, kubectl: Kubectl, namespace: str, delivery: str,
            live: list[dict[str, Any]]) -> dict[str, Any]:
    """Count what happened to every live pod of the ReplicaSet."""
    s = cluster.settings
    table: dict[str, Any] = {"started": 0, "on_recorded_gpu": 0, "wrong_gpu": [], "made_up": [], "stuck": []}
    for p in live:
        name = p["metadata"]["name"]
        if not w.running(p):
            table["stuck"].append(f"{name}: {w.reason(p)}")
            continue
        table["started"] += 1
        rep = w.report(kubectl, namespace, name, "main")
        got = None if rep is None else w.gpu_of(rep, delivery, s.node_name, s.fake_gpus)
        if got is None:
            table["made_up"].append(f"{name}: {rep}")
        elif got != w.assigned_index(p):
            table["wrong_gpu"].append(f"{name}: got GPU {got}, annotation says {w.assigned_index(p)}")
        else:
            table["on_recorded_gpu"] += 1
    table["promised_per_gpu"] = w.promised(live)
    return table


def test_bug_report_scenario(cluster: Cluster, delivery: str, kubectl: Kubectl, namespace: str) -> None:
    img = w.image(cluster, PULL_MS)
    template = w.pod("x", [w.container("main", img, UNITS)])
    started = time.monotonic()
    code, out = w.create(kubectl, namespace, w.replicaset("bug", REPLICAS, template))
    assert code == 0, out

    def pulling() -> list[str]:
        items = w.pods(kubectl, namespace, "app=bug")
        return [p["metadata"]["name"] for p in items if p["spec"].get("nodeName") and not w.running(p)]

    # Delete pods the kubelet has admitted (their devices are allocated) while their image is still pulled.
    w.wait(f"{DELETE} pods bound and still pulling", lambda: len(pulling()) >= DELETE, 120, 0.5)
    victims = pulling()[:DELETE]
    kubectl.ok(["delete", "pods", "-n", namespace, "--wait=false", *victims])

    def replaced_and_settled() -> bool:
        items = [p for p in w.pods(kubectl, namespace, "app=bug") if not p["metadata"].get("deletionTimestamp")]
        return len(items) == REPLICAS and all(w.settled(p) for p in items)

    w.wait("30 live pods, all running or failed", replaced_and_settled, 300, 2)
    elapsed = time.monotonic() - started
    live = [p for p in w.pods(kubectl, namespace, "app=bug") if not p["metadata"].get("deletionTimestamp")]
    table = outcome(cluster, kubectl, namespace, delivery, live)
    table["seconds_to_last_start"] = round(elapsed, 1)
    print(f"\nbug-report scenario on the real node, delivery {delivery}: {json.dumps(table)}", file=sys.stderr)
    assert table["wrong_gpu"] == [] and table["made_up"] == []
    assert all(units <= 64 for units in table["promised_per_gpu"].values()), table["promised_per_gpu"]
    assert table["stuck"] == [], "30 pods of 8 GiB fit 4 x 64 GiB: none may be refused"
    assert table["started"] == table["on_recorded_gpu"] == REPLICAS
