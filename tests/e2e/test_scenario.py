"""The bug report's scenario and its relatives on a real node, behind the reference scheduler extender: every GPU
container on its own pod's GPU, no GPU over-committed, no made-up device, nothing stuck, and no refusal by our
plugin caused by the extender giving away the memory of a pod that is being deleted (it frees it at once)."""

from __future__ import annotations

import sys

import pytest

from e2e import matrix
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.harness.realtier import scenarios
from tests.harness.scenarios import BUG_REPORT, SCENARIOS, Scenario

# The kubelet's own refusals when it admits a batch at its start (pkg/kubelet/cm/devicemanager/manager.go,
# devicesToAllocate): before the device plugin has registered again its devices are unhealthy, and until its pod
# sources are ready its checkpoint still counts the devices of pods deleted meanwhile. The pod fails with
# UnexpectedAdmissionError and its ReplicaSet replaces it; never at our plugin's word (which the kubelet would quote
# as "rpc error").
KUBELET_OWN = ("requested number of devices unavailable for aliyun.com/gpu-mem",
               "no healthy devices present; cannot allocate unhealthy devices aliyun.com/gpu-mem",
               "cannot allocate unregistered device aliyun.com/gpu-mem")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name.replace(" ", "-"))
def test_every_container_on_its_pods_gpu(cluster: Cluster, needs_extender: None, delivery: str, kubectl: Kubectl,
                                         namespace: str, scenario: Scenario) -> None:
    out = scenarios.run(cluster, kubectl, namespace, delivery, scenario)
    if scenario is BUG_REPORT:
        matrix.record(scenario.name, delivery, out.seconds)
    print(f"\n{scenario.name} on the real node, delivery {delivery}: {out.as_json()}", file=sys.stderr)
    assert out.wrong_gpu == [] and out.made_up == [], out.as_json()
    assert out.over_committed == {}, out.over_committed
    assert all(units <= 64 for units in out.promised_per_gpu.values()), out.promised_per_gpu
    assert out.stuck == [], out.stuck
    assert out.started == out.on_recorded_gpu == scenario.replicas, out.as_json()
    # Only the kubelet itself may reject a pod (re-admitting a batch after its restart), never at our plugin's word.
    assert all(any(own in r for own in KUBELET_OWN) and "rpc error" not in r for r in out.rejected), out.rejected
    assert not out.rejected or scenario.kubelet_down, out.rejected
    # The only refusal the plugin may make here is the container start of a pod being deleted (its memory has gone
    # to another pod), whose message asks for nothing.
    assert set(out.plugin_refusals) <= {"GpuSharePodDeleting"}, (out.plugin_refusals, out.plugin_messages)
