"""The bug report's scenario on a real node: 30 GPU-share pods of 8 GiB at once, 10 deleted while the image is
pulled, the real ReplicaSet controller replacing them; every container must be on its own pod's GPU."""

from __future__ import annotations

import sys

from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.e2e import bugreport


def test_bug_report_scenario(cluster: Cluster, delivery: str, kubectl: Kubectl, namespace: str) -> None:
    table = bugreport.run(cluster, kubectl, namespace, delivery)
    print(f"\nbug-report scenario on the real node, delivery {delivery}: {table.as_json()}", file=sys.stderr)
    assert table.wrong_gpu == [] and table.made_up == []
    assert all(units <= 64 for units in table.promised_per_gpu.values()), table.promised_per_gpu
    assert table.over_committed == {}
    assert table.stuck == [], "30 pods of 8 GiB fit 4 x 64 GiB: none may be refused"
    assert table.started == table.on_recorded_gpu == table.pods == bugreport.REPLICAS
