"""The plugin's real NVML path on the real node: its inventory read through nvidia-ml-py from the fake
libnvidia-ml.so.1 becomes the node's capacity, and an XID critical error takes that GPU's devices out of the
kubelet's allocatable."""

from __future__ import annotations

import json
import time
from typing import Any

from e2e import fakenvml
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from node.inventory import fake_gpus

RESOURCE = "aliyun.com/gpu-mem"
COUNT = "aliyun.com/gpu-count"


def node_status(kubectl: Kubectl, name: str) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(kubectl.ok(["get", "node", name, "-o", "json"]))["status"]
    return status


def wait_allocatable(kubectl: Kubectl, name: str, units: int, timeout: float = 90) -> dict[str, Any]:
    """The node's status once its allocatable GPU memory is `units` (the kubelet reports it every 10 s)."""
    deadline = time.monotonic() + timeout
    status = node_status(kubectl, name)
    while status["allocatable"].get(RESOURCE) != str(units) and time.monotonic() < deadline:
        time.sleep(1)
        status = node_status(kubectl, name)
    return status


def test_capacity_is_what_nvml_reports(cluster: Cluster, kubectl: Kubectl) -> None:
    s = cluster.settings
    gpus = fake_gpus(s.fake_gpus, s.node_name, "GiB")
    status = wait_allocatable(kubectl, s.node_name, sum(g.memory_units for g in gpus))
    assert status["capacity"][RESOURCE] == status["allocatable"][RESOURCE] == str(sum(g.memory_units for g in gpus))
    assert status["capacity"][COUNT] == str(len(gpus))
    # The plugin read them through NVML (the fake library's versions and GPU name), not a fake inventory.
    log = cluster.log("device-plugin").read_text(errors="replace")
    assert "NVML 12.550.127.05, driver 550.127.05" in log
    for gpu in gpus:
        assert f"GPU {gpu.index}: {gpu.uuid} (gpushare fake GPU), {gpu.memory_units * 1024} MiB" in log


def test_a_critical_xid_takes_the_gpu_out_of_allocatable(cluster: Cluster, kubectl: Kubectl) -> None:
    s = cluster.settings
    gpus = fake_gpus(s.fake_gpus, s.node_name, "GiB")
    total, lost = sum(g.memory_units for g in gpus), gpus[-1]
    assert wait_allocatable(kubectl, s.node_name, total)["allocatable"][RESOURCE] == str(total)
    try:
        fakenvml.inject_xid(cluster.nvml_events, gpus[0].index, 13)  # an application's fault: no change
        fakenvml.inject_xid(cluster.nvml_events, lost.uuid, 79)  # fallen off the bus
        status = wait_allocatable(kubectl, s.node_name, total - lost.memory_units)
        assert status["allocatable"][RESOURCE] == str(total - lost.memory_units), status["allocatable"]
        assert status["capacity"][RESOURCE] == str(total)  # the kubelet still counts the unhealthy devices
        log = cluster.log("device-plugin").read_text(errors="replace")
        assert f"GPU {lost.index} ({lost.uuid}) reported critical XID 79" in log
        assert "critical XID 13" not in log
    finally:
        # Health comes back only with a restart (as with the NVIDIA plugin); the new event set starts after the XID.
        cluster.procs.stop("device-plugin")
        cluster.start_plugin()
    assert wait_allocatable(kubectl, s.node_name, total)["allocatable"][RESOURCE] == str(total)
