"""The DRA path installed as users install it: `helm install` with `dra.enabled`, the node labelled
gpushare.io/gpu-memory=dra,
the driver as the chart's DaemonSet pod (its own ServiceAccount, the kubelet's plugin directories as hostPaths, the
fake NVML library through dra.extra* values as the device plugin gets it); the bug report's scenario with claims
through it, its pod replaced while pods pull, and `helm uninstall` leaving no class, slice or object of ours.

Runs after test_install_cert_manager.py (whose uninstall leaves the cluster as it found it); the tests of this
module run in order on one install. No device plugin runs meanwhile: its DaemonSet selects
gpushare.io/gpu-memory=device-plugin.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from contract.keys import DRA_DRIVER
from e2e import gpushare, install
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from node.inventory import fake_gpus
from tests.harness import alerts
from tests.harness.realtier import dra
from tests.harness.realtier import workloads as w
from tests.install.test_install import _ours, _ready, assert_nothing_of_ours_left

DRIVER = "app.kubernetes.io/name=gpushare-dra-plugin"
DRA_NODE_LABEL = "gpushare.io/gpu-memory=dra"  # the chart's default dra.nodeSelector


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[Cluster]:
    kubectl = cluster.kubectl()
    kubectl.ok(["label", "node", cluster.settings.node_name, DRA_NODE_LABEL, "--overwrite"])
    values = install.write_values(cluster, cluster.run / "install" / "dra.yaml", certificates="self-signed",
                                  extra={"dra": {"enabled": True, **install.fake_nvml_values(cluster)}})
    install.helm(cluster, "install", install.RELEASE, str(cluster.chart), "--namespace", install.RELEASE_NAMESPACE,
                 "-f", str(values))
    install.certs_install(cluster)
    install.wait_serving(cluster)
    yield cluster
    install.helm(cluster, "uninstall", install.RELEASE, "--namespace", install.RELEASE_NAMESPACE, "--ignore-not-found",
                 install.wait())
    kubectl.ok(["label", "node", cluster.settings.node_name, install.GPU_NODE_LABEL, "--overwrite"])


def _gpus(cluster: Cluster) -> int:
    s = cluster.settings
    return len(fake_gpus(s.fake_gpus, s.node_name, "GiB"))


def _driver_ready(kubectl: Kubectl) -> bool:
    return sum(map(_ready, _ours(kubectl, DRIVER))) == 1


def test_the_driver_pod_registers_and_publishes_its_slices(installed: Cluster, kubectl: Kubectl) -> None:
    w.wait("the DRA driver's pod Ready", lambda: _driver_ready(kubectl), 180, 2)
    assert _ours(kubectl, "app.kubernetes.io/name=gpushare-device-plugin") == [], "one path per node"
    [pod] = _ours(kubectl, DRIVER)
    assert pod["spec"]["serviceAccountName"] == "gpushare-dra-plugin"
    w.wait("one ResourceSlice per GPU", lambda: len(dra.our_slices(kubectl, installed.settings.node_name))
           == _gpus(installed), 120, 1)
    devices = [d for s in dra.our_slices(kubectl, installed.settings.node_name) for d in s["spec"]["devices"]]
    assert all(d.get("allowMultipleAllocations") is True for d in devices), devices
    assert {d["capacity"]["memory"]["value"] for d in devices} == {f"{w.fake_capacity(installed.settings)}Gi"}
    assert kubectl.json(["get", "deviceclass", DRA_DRIVER])["metadata"]["labels"]["app.kubernetes.io/part-of"] \
        == "gpushare"


def test_the_bug_report_with_claims_through_the_installed_driver(installed: Cluster, kubectl: Kubectl,
                                                                 namespace: str) -> None:
    """30 pods of 8 GiB on 4 x 64 GiB, a 10-second pull, 10 deleted while pulling and replaced."""
    out = dra.run_replicaset(installed, kubectl, namespace, replicas=30, gib=8, pull_ms=10000, delete=10)
    print(f"\nthe bug report with claims through the installed driver: {json.dumps(asdict(out))}", file=sys.stderr)
    assert out.wrong_gpu == [] and out.made_up == [] and out.stuck == [] and out.failed == [], out
    assert out.over_committed == {} and out.started == out.on_claimed_gpu == 30, out
    [pod] = _ours(kubectl, DRIVER)
    assert all(c["restartCount"] == 0 for c in pod["status"]["containerStatuses"]), pod["status"]


def test_the_drivers_pod_replaced_while_pods_pull_loses_nothing(installed: Cluster, kubectl: Kubectl,
                                                                namespace: str) -> None:
    """The DaemonSet's new pod finds the prepared claims in the node's checkpoint directory and its sockets where
    the kubelet looks."""
    img = w.image(installed, 8000)
    kubectl.ok(["apply", "-n", namespace, "-f", "-"], stdin=json.dumps(dra.claim_template("gpu", 16)))
    template = dra.with_claim(w.pod("x", [dra.claimed(w.container("main", img))]), "gpu")
    assert w.create(kubectl, namespace, w.replicaset("restart", 8, template))[0] == 0
    w.wait("8 pods bound", lambda: sum(bool(p["spec"].get("nodeName")) for p in w.pods(kubectl, namespace)) >= 8,
           120, 0.5)
    [old] = _ours(kubectl, DRIVER)
    kubectl.ok(["delete", "pod", "-n", gpushare.NAMESPACE, old["metadata"]["name"], "--wait=false"])
    w.wait("the DaemonSet's new driver pod Ready", lambda: _driver_ready(kubectl) and all(
        p["metadata"]["uid"] != old["metadata"]["uid"] for p in _ours(kubectl, DRIVER)), 180, 1)
    dra.settle(kubectl, namespace, 8)
    out = dra.outcome(installed, kubectl, namespace, ("main",))
    print(f"\n8 pods while the driver's pod was replaced: {json.dumps(asdict(out))}", file=sys.stderr)
    assert out.wrong_gpu == [] and out.made_up == [] and out.stuck == [] and out.failed == [], out
    assert out.over_committed == {} and out.started == out.on_claimed_gpu == 8, out


def test_each_alert_fires_on_the_series_the_installed_driver_exposes(installed: Cluster, kubectl: Kubectl,
                                                                     tmp_path: Path) -> None:
    """As tests/install/test_install.py's alert test, with the DRA driver in place of the device plugin: its
    registration and its slices drive their alerts by value."""
    w.wait("the DRA driver's pod Ready", lambda: _driver_ready(kubectl), 180, 2)
    series = alerts.scraped(kubectl, ("webhook", "dra-plugin"), gpushare.NAMESPACE)
    driver = {name for name, _ in series if name.startswith("gpushare_dra_")}
    assert {"gpushare_dra_registered", "gpushare_dra_slices_published"} <= driver, sorted(driver)
    assert {"GpuShareDevicePluginNotRegistered", "GpuShareDraSlicesMissing"} <= alerts.driven_alerts(series)
    failures = alerts.check(series, tmp_path)
    assert failures == {}, alerts.report(failures)


def test_uninstall_leaves_no_class_slice_or_object_of_ours(installed: Cluster, kubectl: Kubectl,
                                                            namespace: str) -> None:
    # The claims' pods go first: the kubelet unprepares their claims through the driver while it still runs.
    kubectl.ok(["delete", "replicasets,pods", "--all", "-n", namespace, "--wait=true"], timeout=180)
    install.helm(installed, "uninstall", install.RELEASE, "--namespace", install.RELEASE_NAMESPACE, install.wait())
    assert_nothing_of_ours_left(kubectl)
    assert kubectl.run(["get", "deviceclass", DRA_DRIVER])[0] != 0
    # The kubelet removes a driver's slices 30 s after the driver left
    # (pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go).
    w.wait("no ResourceSlice of our driver", lambda: dra.our_slices(kubectl, installed.settings.node_name) == [],
           120, 2)
