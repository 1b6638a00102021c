"""The Helm chart on the real cluster: `helm template | kubectl apply` of charts/gpushare, with the values the tier
runs with, brings up a working webhook, and leaves the cluster as the other tests expect it.

The tier's equivalent of installing the chart (see e2e/gpushare.py): the webhook and the device plugin run on the
host, so the Deployment, DaemonSet and PodDisruptionBudget are not applied, and each webhook's
`clientConfig.service` becomes a URL on 127.0.0.1. The chart's self-signed mode, like manifests/self-signed, leaves
caBundle to `gpushare-certs install`, which the test runs as the chart's NOTES say.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from e2e import gpushare
from e2e import settings as ports
from e2e.cluster import REPO, Cluster
from e2e.kube import Kubectl
from tests.e2e import workloads as w
from tests.manifests import helm

# GPU-share pods here are placed by the reference scheduler extender (skipped, with the reason, without it).
pytestmark = pytest.mark.usefixtures("needs_extender")

CONFIGURATIONS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
STAMP = ("gpushare.io/intent", "gpushare.io/intent-signature")


def certs_install(cluster: Cluster) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "certs.cli", "install", "--namespace", gpushare.NAMESPACE,
         "--kubeconfig", str(cluster.admin_kubeconfig), "--extra-host", "127.0.0.1"],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    assert done.returncode == 0, f"gpushare-certs install failed: {done.stderr or done.stdout}"


def configurations(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in CONFIGURATIONS]


def dry_run_annotations(kubectl: Kubectl, namespace: str, pod: dict[str, Any]) -> dict[str, str]:
    """The pod as the API server would store it, admission included, without creating it."""
    out = kubectl.ok(["create", "-n", namespace, "-f", "-", "--dry-run=server", "-o", "json"], stdin=json.dumps(pod))
    return w.annotations_of(json.loads(out))


def test_the_chart_brings_up_a_working_webhook(cluster: Cluster, kubectl: Kubectl, namespace: str) -> None:
    port = cluster.settings.port(ports.WEBHOOK)
    values = ["certificates=self-signed", f"config.delivery={cluster.delivery}"]
    chart = gpushare.for_cluster(helm.template(sets=values), port)
    tier_configurations = configurations(gpushare.for_cluster(gpushare.render(kubectl), port))
    assert configurations(chart), "the chart renders no webhook configuration"
    pod = w.pod("after-helm", [w.container("main", w.image(cluster), 2)])
    try:
        # Without the tier's configurations nothing stamps a GPU-share pod: the chart's must bring it back.
        for kind in CONFIGURATIONS:
            kubectl.ok(["delete", kind.lower(), "gpushare-webhook"])
        assert not set(STAMP) & set(dry_run_annotations(kubectl, namespace, pod))

        gpushare.apply(kubectl, chart)
        certs_install(cluster)
        for kind in CONFIGURATIONS:
            live = kubectl.json(["get", kind.lower(), "gpushare-webhook"])
            assert all(h["clientConfig"].get("caBundle") for h in live["webhooks"]), f"{kind} has no caBundle"

        code, out = w.create(kubectl, namespace, pod)
        assert code == 0, out
        running = w.wait_running(kubectl, namespace, 1, 120)[0]
        annotations = w.annotations_of(running)
        assert set(STAMP) <= set(annotations), f"the pod created after the install is not stamped: {annotations}"
        # The plugin verified the chart webhook's signature and allocated the pod a GPU.
        assert annotations.get("ALIYUN_COM_GPU_MEM_ASSIGNED") == "true"
    finally:
        # Leave the configurations as the tier made them (a no-op after a pass: the chart's are the same objects).
        gpushare.apply(kubectl, tier_configurations)
        certs_install(cluster)
