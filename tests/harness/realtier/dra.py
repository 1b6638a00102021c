"""GPU memory through DRA on the real node: the driver's cluster objects, claim templates, pods that use them, and
what every container received against what its claim's allocation names.

The node serves GPU memory through one path at a time: while the DRA driver runs, the device plugin is stopped
(both would count the same fake GPUs, neither knowing the other's shares).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from contract.dra import MEMORY, consumed_memory, driver_results, gpu_index
from contract.keys import DRA_DRIVER
from contract.quantity import quantity_bytes
from e2e import control, extender, gpushare
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.harness.judge import Counts, over_capacity
from tests.harness.manifests.render import render, render_with_component
from tests.harness.realtier import workloads as w

GIB = 1 << 30
SETTLE_S = 300


def component_objects(tmp: Any) -> list[dict[str, Any]]:
    """The objects manifests/dra adds to an overlay but its DaemonSet (this tier runs the driver on the host, and
    tests/install runs the DaemonSet): DeviceClass, ServiceAccount, RBAC, policies, NetworkPolicy."""
    base = {(o["kind"], o["metadata"]["name"]) for o in render("self-signed")}
    return [o for o in render_with_component("self-signed", "dra", tmp)
            if (o["kind"], o["metadata"]["name"]) not in base and o["kind"] not in gpushare.HOST_RUN_KINDS]


@contextlib.contextmanager
def driver_running(cluster: Cluster, tmp: Any) -> Iterator[None]:
    """The device plugin and the scheduler extender stopped (claims need neither), the component applied, the DRA
    driver started and its slices published; on leaving, the driver stopped, the extender and the device plugin
    started again."""
    kubectl = cluster.kubectl()
    kubectl.ok(["apply", "-f", "-"], stdin="\n".join(json.dumps(o) for o in component_objects(tmp)))
    cluster.procs.stop("device-plugin")
    extender.stop(cluster.procs)
    try:
        cluster.start_dra()
        yield
    finally:
        cluster.stop_dra()
        cluster.start_extender()
        cluster.start_plugin()


def restart_apiserver(cluster: Cluster, *gates: str) -> None:
    """kube-apiserver stopped and started again as e2e.cluster starts it, with `gates` (NAME=true|false) after the
    tier's own --feature-gates: the flag may be given more than once, and a later value of a gate wins
    (k8s.io/component-base featuregate, Set merges each occurrence into the known gates)."""
    s = cluster.settings
    audit = (control.audit_policy(cluster.conf / "audit-policy.yaml"), cluster.audit_log)
    argv = control.apiserver(s, cluster.toolchain.kube("kube-apiserver"), cluster.pki_dir, audit)
    if gates:
        argv.insert(len(argv) - 1, f"--feature-gates={','.join(gates)}")  # before --v, after the tier's gates
    cluster.procs.stop("kube-apiserver")
    cluster.procs.start("kube-apiserver", argv)
    kubectl = cluster.kubectl()
    cluster.procs.wait_ready("kube-apiserver", lambda: kubectl.run(["get", "--raw", "/readyz"], timeout=5)[0] == 0,
                             120, "answering /readyz")


@contextlib.contextmanager
def apiserver_gates(cluster: Cluster, *gates: str) -> Iterator[None]:
    """The API server with `gates` while inside; started again with the tier's own gates on leaving."""
    restart_apiserver(cluster, *gates)
    try:
        yield
    finally:
        restart_apiserver(cluster)


def our_slices(kubectl: Kubectl, node: str) -> list[dict[str, Any]]:
    """The ResourceSlices of our driver for `node`."""
    items: list[dict[str, Any]] = kubectl.json(["get", "resourceslices"])["items"]
    return [s for s in items if s["spec"].get("driver") == DRA_DRIVER and s["spec"].get("nodeName") == node]


def claim_template(name: str, gib: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{
                "name": "gpu", "exactly": {"deviceClassName": DRA_DRIVER,
                                           "capacity": {"requests": {MEMORY: f"{gib}Gi"}}}}]}}}}


def claimed(container: dict[str, Any], claim: str = "gpu") -> dict[str, Any]:
    return {**container, "resources": {"claims": [{"name": claim}]}}


def with_claim(pod: dict[str, Any], template: str, claim: str = "gpu") -> dict[str, Any]:
    pod["spec"]["resourceClaims"] = [{"name": claim, "resourceClaimTemplateName": template}]
    return pod


@dataclass
class DraOutcome(Counts):
    """The judge's counts for pods with claims (last_pod also says when its claim was made)."""

    on_claimed_gpu: int = 0
    failed: list[str] = field(default_factory=list)
    consumed_gib: dict[int, int] = field(default_factory=dict)


def _claims(kubectl: Kubectl, namespace: str, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's ResourceClaims, as the controller manager made them from its templates."""
    return [kubectl.json(["get", "resourceclaim", "-n", namespace, status["resourceClaimName"]])
            for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []
            if status.get("resourceClaimName")]


def claim_gpus(kubectl: Kubectl, namespace: str, pod: dict[str, Any]) -> dict[int, int]:
    """GPU index -> bytes the pod's claims consumed there, from the claims' allocation results (our driver's)."""
    out: dict[int, int] = {}
    for claim in _claims(kubectl, namespace, pod):
        for result in driver_results(claim):
            index = gpu_index(str(result.get("device", "")))
            if index is not None:
                out[index] = out.get(index, 0) + int(quantity_bytes(str(consumed_memory(result) or "0")))
    return out


def outcome(cluster: Cluster, kubectl: Kubectl, namespace: str, containers: tuple[str, ...]) -> DraOutcome:
    s = cluster.settings
    capacity_gib = w.fake_capacity(s)
    live = [p for p in w.pods(kubectl, namespace) if not p["metadata"].get("deletionTimestamp")]
    out = DraOutcome(pods=len(live))
    consumed: dict[int, int] = {}
    running = w.sort_live(live, out.failed, out.stuck)
    out.started = len(running)
    for p in running:
        name = p["metadata"]["name"]
        claimed_gpus = claim_gpus(kubectl, namespace, p)
        for gpu, size in claimed_gpus.items():
            consumed[gpu] = consumed.get(gpu, 0) + size
        got_all = set()
        for container_name in containers:
            rep = w.report(kubectl, namespace, name, container_name)
            got = None if rep is None else w.gpu_of(rep, "cdi", s.node_name, s.fake_gpus)
            if got is None or rep is None or rep.idx != str(got):
                out.made_up.append(f"{name}/{container_name}: {rep}")
            elif got not in claimed_gpus:
                out.wrong_gpu.append(f"{name}/{container_name}: got GPU {got}, its claim names {sorted(claimed_gpus)}")
            else:
                got_all.add(got)
        if got_all and got_all == set(claimed_gpus):
            out.on_claimed_gpu += 1
    out.consumed_gib = {g: b // GIB for g, b in sorted(consumed.items())}
    out.over_committed = over_capacity(out.consumed_gib, lambda _: capacity_gib)
    created = [w.stamp(t) for t in kubectl.ok(
        ["get", "replicasets,pods", "-n", namespace, "-o",
         "jsonpath={.items[*].metadata.creationTimestamp}"]).split()]
    w.time_to_start(out, running, live, created)
    if out.last_pod:
        last = next((p for p in live if p["metadata"]["name"] == out.last_pod.get("pod")), None)
        made = [w.stamp(c["metadata"]["creationTimestamp"]) for c in _claims(kubectl, namespace, last or {})]
        if made:
            out.last_pod["claim_created"] = (max(made) - min(created)).total_seconds()
    return out


def run_replicaset(cluster: Cluster, kubectl: Kubectl, namespace: str, replicas: int, gib: int, pull_ms: int,
                   delete: int) -> DraOutcome:
    """The bug report's scenario with claims: a ReplicaSet of pods that each claim `gib` GiB from a template,
    `delete` of them deleted while their image is pulled and replaced by the ReplicaSet controller."""
    img = w.image(cluster, pull_ms)
    kubectl.ok(["apply", "-n", namespace, "-f", "-"], stdin=json.dumps(claim_template("gpu", gib)))
    template = with_claim(w.pod("x", [claimed(w.container("main", img))]), "gpu")
    code, text = w.create(kubectl, namespace, w.replicaset("dra", replicas, template))
    assert code == 0, text

    def pulling() -> list[str]:
        return [p["metadata"]["name"] for p in w.pods(kubectl, namespace)
                if p["spec"].get("nodeName") and not w.running(p) and w.phase(p) == "Pending"]

    if delete:
        w.wait(f"{delete} pods bound and still pulling", lambda: len(pulling()) >= delete, 120, 0.5)
        kubectl.ok(["delete", "pods", "-n", namespace, "--wait=false", *pulling()[:delete]])
    settle(kubectl, namespace, replicas)
    return outcome(cluster, kubectl, namespace, ("main",))


def settle(kubectl: Kubectl, namespace: str, replicas: int) -> None:
    def live() -> list[dict[str, Any]]:
        return [p for p in w.pods(kubectl, namespace) if not p["metadata"].get("deletionTimestamp")]

    def settled() -> bool:
        items = live()
        return len([p for p in items if w.phase(p) != "Failed"]) >= replicas and all(map(w.settled, items))

    with contextlib.suppress(AssertionError):  # a pod that never settles is counted as stuck, with its reason
        w.wait(f"{replicas} live pods, all running or failed", settled, SETTLE_S, 2)
    time.sleep(1)
