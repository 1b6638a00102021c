"""The DRA path installed as users install it: `helm install` with `dra.enabled`, the node labelled
gpushare.io/gpu-memory=dra,
the driver as the chart's DaemonSet pod (its own ServiceAccount, the kubelet's plugin directories as hostPaths, the
fake NVML library through dra.extra* values as the device plugin gets it); its probes through its gRPC health
service; the bug report's scenario with claims through it, its pod replaced while pods pull, a rolling restart
(two driver pods side by side) while pods with prepared claims run, its slices garbage-collected with a deleted
Node and published again for the Node its kubelet registers anew, one Warning Event and no rewrite loop when the API
server's DRAConsumableCapacity gate is off, and `helm uninstall` leaving no class, slice or object of ours.

Runs after test_install_cert_manager.py (whose uninstall leaves the cluster as it found it); the tests of this
module run in order on one install. No device plugin runs meanwhile: its DaemonSet selects
gpushare.io/gpu-memory=device-plugin.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from contract.keys import DRA_DRIVER
from dra.checkpoint import Checkpoint
from dra.events import CAPACITY_OFF
from e2e import gpushare, install, node
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from node.inventory import fake_gpus
from tests.harness import alerts
from tests.harness.realtier import dra
from tests.harness.realtier import workloads as w
from tests.install.test_install import _ours, _ready, assert_nothing_of_ours_left

DRIVER = "app.kubernetes.io/name=gpushare-dra-plugin"
DAEMONSET = "daemonset/gpushare-dra-plugin"
PLUGIN_DIR = node.KUBELET_DIR / "plugins" / DRA_DRIVER  # the chart's GPUSHARE_DRA_PLUGIN_DIR, a hostPath
REGISTRY_DIR = node.KUBELET_DIR / "plugins_registry"
RESYNC_S = 10  # the driver's GPUSHARE_DRA_RESYNC_SECONDS (its default: the chart sets none)
DRA_NODE_LABEL = "gpushare.io/gpu-memory=dra"  # the chart's default dra.nodeSelector
NODE_AUTHORIZER_RACE = "no relationship found between node"  # the node authorizer refusing (the rolling test)


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


def test_the_drivers_probes_ask_its_health_service_and_its_pod_becomes_ready(installed: Cluster,
                                                                             kubectl: Kubectl) -> None:
    """The DaemonSet's readiness and liveness probes run gpushare-dra-probe, which asks the driver's gRPC health
    service on health-<pod uid>.sock; Ready means registered, serving and published."""
    w.wait("the DRA driver's pod Ready", lambda: _driver_ready(kubectl), 180, 2)
    [pod] = _ours(kubectl, DRIVER)
    [ctr] = [c for c in pod["spec"]["containers"] if c["name"] == "dra-plugin"]
    assert ctr["readinessProbe"]["exec"]["command"] == ["gpushare-dra-probe", "ready"]
    assert ctr["livenessProbe"]["exec"]["command"] == ["gpushare-dra-probe", "alive"]
    uid = pod["metadata"]["uid"]
    for path in (PLUGIN_DIR / f"dra-{uid}.sock", PLUGIN_DIR / f"health-{uid}.sock",
                 REGISTRY_DIR / f"{DRA_DRIVER}-{uid}-reg.sock"):
        assert path.is_socket(), f"{path} is missing: the sockets carry the pod's UID"
    for check, sentence in (("ready", "is ready (SERVING)."), ("alive", "is alive (SERVING).")):
        code, out, err = kubectl.run(["exec", "-n", gpushare.NAMESPACE, pod["metadata"]["name"], "-c", "dra-plugin",
                                      "--", "gpushare-dra-probe", check])
        assert code == 0 and out.strip().endswith(sentence), (code, out, err)
    assert all(c["restartCount"] == 0 for c in pod["status"]["containerStatuses"]), "liveness never failed"


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


def _reserved_claim_uids(kubectl: Kubectl, namespace: str) -> set[str]:
    """The UIDs of the claims that live pods of `namespace` hold (status.reservedFor): prepared on the node."""
    live = {p["metadata"]["uid"] for p in w.pods(kubectl, namespace) if not p["metadata"].get("deletionTimestamp")}
    claims = kubectl.json(["get", "resourceclaims", "-n", namespace])["items"]
    return {c["metadata"]["uid"] for c in claims
            if {r.get("uid") for r in (c.get("status") or {}).get("reservedFor") or []} & live}


def test_a_rolling_restart_while_pods_hold_prepared_claims_loses_none_and_rejects_no_pod(
        installed: Cluster, kubectl: Kubectl, namespace: str) -> None:
    """`kubectl rollout restart`: with maxSurge 1 and maxUnavailable 0 the new driver pod starts beside the old one
    (sockets named by pod UID, checkpoint writes under its lock file), and the old one leaves once the new one is
    Ready, removing only its own sockets. Pods deleted meanwhile are replaced, their claims prepared and unprepared
    by whichever pod the kubelet calls."""
    w.wait("the DRA driver's pod Ready", lambda: _driver_ready(kubectl), 180, 2)
    img = w.image(installed, 2000)
    kubectl.ok(["apply", "-n", namespace, "-f", "-"], stdin=json.dumps(dra.claim_template("gpu", 16)))
    template = dra.with_claim(w.pod("x", [dra.claimed(w.container("main", img))]), "gpu")
    assert w.create(kubectl, namespace, w.replicaset("rolling", 8, template))[0] == 0
    w.wait_running(kubectl, namespace, 8, 180)
    prepared = _reserved_claim_uids(kubectl, namespace)
    assert len(prepared) == 8 and prepared <= set(Checkpoint(str(node.DRA_STATE_DIR)).load()), prepared
    [old] = _ours(kubectl, DRIVER)
    kubectl.ok(["rollout", "restart", DAEMONSET, "-n", gpushare.NAMESPACE])
    w.wait("a second driver pod beside the first", lambda: len(_ours(kubectl, DRIVER)) == 2, 120, 0.5)
    replaced = [p["metadata"]["name"] for p in w.pods(kubectl, namespace)][:4]
    kubectl.ok(["delete", "pods", "-n", namespace, "--wait=false", *replaced])
    kubectl.ok(["rollout", "status", DAEMONSET, "-n", gpushare.NAMESPACE, "--timeout=240s"], timeout=260)
    w.wait("the old driver pod gone", lambda: len(_ours(kubectl, DRIVER)) == 1, 120, 1)
    [new] = _ours(kubectl, DRIVER)
    assert new["metadata"]["uid"] != old["metadata"]["uid"] and _ready(new)
    dra.settle(kubectl, namespace, 8)
    out = dra.outcome(installed, kubectl, namespace, ("main",))
    print(f"\n8 pods through a rolling restart of the driver: {json.dumps(asdict(out))}", file=sys.stderr)
    assert out.wrong_gpu == [] and out.made_up == [] and out.stuck == [] and out.failed == [], out
    assert out.over_committed == {} and out.started == out.on_claimed_gpu == 8, out
    # The kubelet's own fetch of a new pod's claim may be refused once by the node authorizer, whose graph adds the
    # claim-to-node edge only when its informer has seen the pod bound (plugin/pkg/auth/authorizer/node/graph.go,
    # AddPod; docs/dra.md): Kubernetes' race, retried by the kubelet, never reaching the driver. Any other refusal is.
    refused = [e["message"] for e in kubectl.json(["get", "events", "-n", namespace])["items"]
               if e.get("reason") in ("FailedPrepareDynamicResources", "UnexpectedAdmissionError")
               and NODE_AUTHORIZER_RACE not in e.get("message", "")]
    assert refused == [], refused
    held = _reserved_claim_uids(kubectl, namespace)
    assert len(held) == 8 and held <= set(Checkpoint(str(node.DRA_STATE_DIR)).load()), "a prepared claim was lost"
    uid, old_uid = new["metadata"]["uid"], old["metadata"]["uid"]
    sockets = {p.name for d in (PLUGIN_DIR, REGISTRY_DIR) for p in d.iterdir()}
    assert {f"dra-{uid}.sock", f"health-{uid}.sock", f"{DRA_DRIVER}-{uid}-reg.sock"} <= sockets, sockets
    assert not [n for n in sockets if old_uid in n], "the old pod removes its own sockets when it stops"


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


def _node_uid(kubectl: Kubectl, name: str) -> str | None:
    code, out, _ = kubectl.run(["get", "node", name, "-o", "jsonpath={.metadata.uid}"])
    return (out.strip() or None) if code == 0 else None


def _owned_by(slices: list[dict[str, Any]], name: str, uid: str) -> bool:
    """Every slice owned by Node `name` of `uid` alone, as dra.slice.node_owner makes it."""
    owner = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid, "controller": True}]
    return bool(slices) and all(
        [{k: o.get(k) for k in owner[0]} for o in s["metadata"].get("ownerReferences") or []] == owner
        for s in slices)


def test_a_deleted_node_takes_its_slices_and_the_driver_publishes_for_the_node_registered_anew(
        installed: Cluster, kubectl: Kubectl) -> None:
    """The slices are owned by the Node: the garbage collector deletes them with it, the driver publishes none
    while the Node is missing, and once the kubelet registers the node again (a new UID) the driver publishes them
    owned by the new Node."""
    name = installed.settings.node_name
    w.wait("the DRA driver's pod Ready", lambda: _driver_ready(kubectl), 180, 2)
    uid = _node_uid(kubectl, name)
    assert uid is not None
    w.wait("slices owned by the Node", lambda: _owned_by(dra.our_slices(kubectl, name), name, uid), 60, 1)
    kubectl.ok(["delete", "node", name, "--wait=true"], timeout=120)
    w.wait("the Node's slices garbage-collected", lambda: dra.our_slices(kubectl, name) == [], 120, 1)
    deadline = time.monotonic() + 2 * RESYNC_S
    while time.monotonic() < deadline:  # the driver (if its pod still runs) publishes nothing for a missing Node
        assert dra.our_slices(kubectl, name) == []
        time.sleep(1)
    # The kubelet registers its Node only when it starts (with the tier's own label): start it again, then label
    # the node for the driver once more.
    installed.procs.stop("kubelet")
    installed.start_kubelet()
    w.wait("the Node registered again", lambda: _node_uid(kubectl, name) not in (None, uid), 120, 1)
    installed.kube_proxy_after_node_deleted()
    kubectl.ok(["label", "node", name, DRA_NODE_LABEL, "--overwrite"])
    new_uid = _node_uid(kubectl, name)
    assert new_uid is not None and new_uid != uid
    w.wait("the driver's pod Ready on the new Node", lambda: _driver_ready(kubectl), 240, 2)
    w.wait("one slice per GPU owned by the new Node", lambda: len(dra.our_slices(kubectl, name)) == _gpus(installed)
           and _owned_by(dra.our_slices(kubectl, name), name, new_uid), 120, 1)
    install.wait_serving(installed, timeout=240)


def test_the_consumable_capacity_gate_off_is_one_warning_event_and_no_rewrite_loop(
        installed: Cluster, kubectl: Kubectl) -> None:
    """The API server restarted with DRAConsumableCapacity=false stores new slices without allowMultipleAllocations
    and requestPolicy: the driver says so in one Warning Event on its Node and leaves the pool as stored (no write at
    each resync). The gate back on, the pool is published whole again."""
    name = installed.settings.node_name

    def warnings() -> list[dict[str, Any]]:
        return [e for e in w.events(kubectl, "default", name) if e.get("reason") == CAPACITY_OFF]

    def versions() -> dict[str, tuple[int, str]]:
        return {s["metadata"]["name"]: (s["spec"]["pool"]["generation"], s["metadata"]["resourceVersion"])
                for s in dra.our_slices(kubectl, name)}

    def whole() -> bool:
        devices = [d for s in dra.our_slices(kubectl, name) for d in s["spec"]["devices"]]
        return len(devices) == _gpus(installed) and all(d.get("allowMultipleAllocations") is True for d in devices)

    w.wait("the DRA driver's pod Ready", lambda: _driver_ready(kubectl), 180, 2)
    assert warnings() == []
    with dra.apiserver_gates(installed, "DRAConsumableCapacity=false"):
        # Stored slices keep the fields on update (strategy.go keeps what the old object uses): new ones are needed.
        kubectl.ok(["delete", "resourceslices", *versions()])
        w.wait(f"one {CAPACITY_OFF} Warning Event on the Node", lambda: len(warnings()) == 1, 4 * RESYNC_S, 1)
        [event] = warnings()
        assert event["type"] == "Warning" and event["involvedObject"] == {
            "apiVersion": "v1", "kind": "Node", "name": name, "uid": _node_uid(kubectl, name)}
        assert "DRAConsumableCapacity" in str(event["message"]), event
        w.wait("one slice per GPU, as stored", lambda: len(versions()) == _gpus(installed), 60, 1)
        devices = [d for s in dra.our_slices(kubectl, name) for d in s["spec"]["devices"]]
        assert not any("allowMultipleAllocations" in d for d in devices), devices
        stored = versions()
        time.sleep(4 * RESYNC_S + 2)  # several resyncs, far fewer than dra.keeper.CAPACITY_RETRY_STEPS
        assert versions() == stored, "the driver rewrote slices the API server stores without the fields"
        assert len(warnings()) == 1, "one Event, not one per resync"
    # The tier's own gates again: new slices keep the fields.
    kubectl.ok(["delete", "resourceslices", *versions()])
    w.wait("the pool published whole again", whole, 4 * RESYNC_S, 1)
    install.wait_serving(installed, timeout=240)


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
