"""Restarts and outages on the real node: the kubelet mid-pull, the device plugin, a webhook outage."""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.harness.realtier import workloads as w

# GPU-share pods here are placed by the reference scheduler extender (skipped, with the reason, without it).
pytestmark = pytest.mark.usefixtures("needs_extender")

KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"


def check_on_recorded_gpu(cluster: Cluster, kubectl: Kubectl, namespace: str, delivery: str) -> list[str]:
    """Assert every running pod's container is on its recorded GPU; return the others with their reasons."""
    s, others = cluster.settings, []
    for p in w.pods(kubectl, namespace):
        name = p["metadata"]["name"]
        if not w.running(p):
            others.append(f"{name}: {w.reason(p)}")
            continue
        rep = w.report(kubectl, namespace, name, "main")
        assert rep is not None, f"{name} printed no report"
        assert w.gpu_of(rep, delivery, s.node_name, s.fake_gpus) == w.assigned_index(p), f"{name}: {rep}"
    return others


def registration_delay(cluster: Cluster) -> float | None:
    """Seconds from the new kubelet.sock to the kubelet logging our registration (None: not registered yet)."""
    try:
        created = Path(KUBELET_SOCKET).stat().st_ctime
    except OSError:
        return None
    day = datetime.datetime.fromtimestamp(created, datetime.UTC)
    for line in reversed(cluster.log("kubelet").read_text(errors="replace").splitlines()):
        if "Got registration request from device plugin" in line and "aliyun.com/gpu-mem" in line:
            clock = line.split()[1]  # klog: I1130 19:34:44.409499 ...
            at = datetime.datetime.strptime(f"{day:%Y-%m-%d} {clock}", "%Y-%m-%d %H:%M:%S.%f")
            delay = at.replace(tzinfo=datetime.UTC).timestamp() - created
            return delay if delay >= 0 else None
    return None


def test_kubelet_restart_while_pods_pull(cluster: Cluster, delivery: str, kubectl: Kubectl, namespace: str) -> None:
    img = w.image(cluster, 15000)
    code, out = w.create(kubectl, namespace, w.replicaset("pulling", 8, w.pod("x", [w.container("main", img, 8)])))
    assert code == 0, out

    def admitted() -> bool:
        items = w.pods(kubectl, namespace)
        return len(items) == 8 and all(p["spec"].get("nodeName") for p in items) and not any(map(w.running, items))

    w.wait("8 pods bound and pulling", admitted, 60, 0.5)
    time.sleep(2)  # the kubelet has admitted them (Allocate) and started the pull
    cluster.procs.stop("kubelet")
    cluster.start_kubelet()
    w.wait("the plugin registered again", lambda: registration_delay(cluster) is not None, 60, 0.2)
    def live() -> list[dict[str, Any]]:
        return [p for p in w.pods(kubectl, namespace) if not p["metadata"].get("deletionTimestamp")]

    w.wait("every pod running or failed", lambda: len(live()) >= 8 and all(map(w.settled, live())), 240, 2)
    others = check_on_recorded_gpu(cluster, kubectl, namespace, delivery)
    print(f"\nkubelet restart mid-pull ({delivery}): {8 - len(others)} of 8 running; others: {others}; the plugin "
          f"registered {registration_delay(cluster):.3f} s after kubelet.sock appeared", file=sys.stderr)
    # The real kubelet re-admits every pod; one it rejects fails with UnexpectedAdmissionError and its
    # ReplicaSet replaces it. Either way: no container on another pod's GPU, and every refusal explained.
    assert all("UnexpectedAdmissionError" in reason or "Running" in reason for reason in others), others


def test_plugin_restart_keeps_pods_and_serves_new_ones(cluster: Cluster, delivery: str, kubectl: Kubectl,
                                                        namespace: str) -> None:
    img = w.image(cluster)
    assert w.create(kubectl, namespace, w.pod("before", [w.container("main", img, 4)]))[0] == 0
    w.wait_running(kubectl, namespace, 1, 120)
    cluster.procs.stop("device-plugin")
    cluster.start_plugin()
    assert w.create(kubectl, namespace, w.pod("after", [w.container("main", img, 4)]))[0] == 0
    w.wait_running(kubectl, namespace, 2, 120)
    assert check_on_recorded_gpu(cluster, kubectl, namespace, delivery) == []
    first = next(p for p in w.pods(kubectl, namespace) if p["metadata"]["name"] == "before")
    assert first["status"]["containerStatuses"][0]["restartCount"] == 0


def test_a_new_plugin_beside_the_connected_one_while_pods_are_admitted(cluster: Cluster, delivery: str,
                                                                      kubectl: Kubectl, namespace: str) -> None:
    """A second plugin instance starts while the kubelet still holds the first one's connection, and the first
    stops, while a ReplicaSet's pods are admitted (a DaemonSet rollout with overlap, or a slow stop). Kubelet 1.37
    keeps one endpoint per (resource, socket) and refuses a registration of a socket that is still connected ("device
    plugin already connected", pkg/kubelet/cm/devicemanager/manager.go PluginConnected, v1.37.2); each serve of our
    plugin has a socket of its own, so the new instance is taken beside the old one, and the old one's disconnect is
    not the resource's last. Kubelets before 1.37 mark the whole resource unhealthy at any disconnect
    (PluginDisconnected, v1.36.3): there a pod admitted in that moment may be rejected by the kubelet itself."""
    img = w.image(cluster, 3000)
    kubelet_log = cluster.log("kubelet")
    offset = kubelet_log.stat().st_size
    spec = w.replicaset("rollout", 24, w.pod("x", [w.container("main", img, 2)]))
    assert w.create(kubectl, namespace, spec)[0] == 0, spec

    def bound() -> int:
        return sum(1 for p in w.pods(kubectl, namespace) if p["spec"].get("nodeName"))

    w.wait("the first pods bound", lambda: bound() >= 3, 60, 0.1)
    try:
        cluster.start_plugin("device-plugin-next")  # the old instance still serves, connected
        admitted_during = bound()
        cluster.procs.stop("device-plugin")
        w.wait("every pod running or failed", lambda: len(w.pods(kubectl, namespace)) >= 24
               and all(map(w.settled, w.pods(kubectl, namespace))), 240, 2)
        others = check_on_recorded_gpu(cluster, kubectl, namespace, delivery)
        refused = [line for line in kubelet_log.read_text(errors="replace")[offset:].splitlines()
                   if "device plugin already connected" in line]
        print(f"\nnew plugin beside the connected one ({delivery}, Kubernetes {cluster.settings.kubernetes_version}):"
              f" {24 - len(others)} of 24 running, {admitted_during} bound when the new one registered; others: "
              f"{others}", file=sys.stderr)
        assert refused == [], refused
        if cluster.settings.release.minor >= 37:
            assert others == [], others
        else:
            assert all("UnexpectedAdmissionError" in r and "rpc error" not in r for r in others), others
    finally:
        cluster.procs.stop("device-plugin-next")
        cluster.procs.stop("device-plugin")  # where the new instance failed to start, the old one still runs
        cluster.start_plugin()


def test_webhook_outage_refuses_gpu_pods_only(cluster: Cluster, kubectl: Kubectl, namespace: str) -> None:
    img = w.image(cluster)
    cluster.stop_webhook()
    try:
        code, out = w.create(kubectl, namespace, w.pod("gpu", [w.container("main", img, 4)]))
        assert code != 0 and "gpushare.io" in out and "webhook" in out, out
        code, out = w.create(kubectl, namespace, w.pod("plain", [w.container("main", img)]))
        assert code == 0, f"an ordinary pod must be created while the webhook is down: {out}"
    finally:
        cluster.start_webhook()
    code, out = w.create(kubectl, namespace, w.pod("gpu", [w.container("main", img, 4)]))
    assert code == 0, out
    w.wait_running(kubectl, namespace, 2, 120)


def test_kubelet_restart_keeps_a_running_pod_whose_init_container_had_gpu_memory(
        cluster: Cluster, delivery: str, kubectl: Kubectl, namespace: str) -> None:
    img = w.image(cluster)
    spec = w.pod("inited", [w.container("main", img, 8)], [w.container("prep", img, 4, then="exit 0")])
    assert w.create(kubectl, namespace, spec)[0] == 0
    w.wait_running(kubectl, namespace, 1, 120)
    cluster.procs.stop("kubelet")
    cluster.start_kubelet()
    w.wait("the plugin registered again", lambda: registration_delay(cluster) is not None, 60, 0.2)
    time.sleep(10)  # the re-admission and a sync or two of the pod
    pod = w.wait_running(kubectl, namespace, 1, 60)[0]
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert check_on_recorded_gpu(cluster, kubectl, namespace, delivery) == []
