"""GPU memory through DRA with consumable capacity, on the real node: the driver's slices, the bug report's scenario
with claims, containers sharing a claim, init containers, and driver and kubelet restarts while pods pull. No
scheduler extender runs meanwhile: the scheduler's own DRA plugin picks the GPU and records what each claim
consumes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.keys import DRA_DRIVER
from dra.servicer import CALL_HANDLERS
from e2e import fakenvml, gpushare, matrix
from e2e.cluster import Cluster
from e2e.kube import Kubectl, KubeError, Rest
from node.inventory import fake_gpus
from tests.harness.realtier import dra
from tests.harness.realtier import workloads as w
from tests.harness.realtier.stall import StallRelay


@pytest.fixture(scope="module")
def driver(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with dra.driver_running(cluster, tmp_path_factory.mktemp("dra")):
        yield cluster


def test_the_driver_publishes_one_slice_per_gpu_with_its_memory(driver: Cluster, kubectl: Kubectl) -> None:
    assert "extender" not in driver.procs.procs  # stopped for these tests: claims need no extender
    published = dra.our_slices(kubectl, driver.settings.node_name)
    gib = w.fake_capacity(driver.settings)
    devices = sorted((d for s in published for d in s["spec"]["devices"]), key=lambda d: int(d["name"][4:]))
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(len(published))] and devices
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in published} == {len(published)}
    for device in devices:
        # Kept by the API server only with DRAConsumableCapacity on: the proof the gate is on where it must be.
        assert device.get("allowMultipleAllocations") is True, device
        assert device["capacity"]["memory"]["value"] == f"{gib}Gi", device
        assert device["capacity"]["memory"]["requestPolicy"]["default"] == "1Gi", device


def test_the_bug_report_with_claims(driver: Cluster, kubectl: Kubectl, namespace: str) -> None:
    """30 pods of 8 GiB on 4 x 64 GiB, a 10-second pull, 10 deleted while pulling and replaced."""
    out = dra.run_replicaset(driver, kubectl, namespace, replicas=30, gib=8, pull_ms=10000, delete=10)
    matrix.record("the bug report", "dra", out.seconds)
    print(f"\nthe bug report with DRA claims: {json.dumps(out.__dict__)}", file=sys.stderr)
    assert out.wrong_gpu == [] and out.made_up == [] and out.stuck == [] and out.failed == [], out
    assert out.over_committed == {}, out
    assert out.started == out.on_claimed_gpu == 30, out
    # `kubectl gpushare` shows the DRA shares on the GPUs their claims name, as it shows annotation-based ones.
    shown = w.kubectl_gpushare("--kubeconfig", str(driver.admin_kubeconfig), "-n", namespace, "-o", "json")
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    gpus = {g["index"]: g for n in json.loads(shown.stdout)["nodes"] for g in n["gpus"]}
    live = {p["metadata"]["name"] for p in w.pods(kubectl, namespace) if not p["metadata"].get("deletionTimestamp")}
    listed = {p["name"]: p for g in gpus.values() for p in g["pods"] if p["name"] in live}
    assert len(listed) == 30 and {p["units"] for p in listed.values()} == {8}, shown.stdout
    assert all(p["gpu"] in out.consumed_gib for p in listed.values()), shown.stdout
    assert all(g["promised"] <= w.fake_capacity(driver.settings) for g in gpus.values()), shown.stdout


def test_containers_sharing_a_claim_and_an_init_container(driver: Cluster, kubectl: Kubectl, namespace: str) -> None:
    """An init container and two app containers name one claim: all three get the claim's one GPU."""
    img = w.image(driver)
    kubectl.ok(["apply", "-n", namespace, "-f", "-"], stdin=json.dumps(dra.claim_template("gpu", 12)))
    names = ("prep", "a", "b")
    for n in range(4):
        pod = w.pod(f"shared-{n}", [dra.claimed(w.container("a", img)), dra.claimed(w.container("b", img))],
                    init=[dra.claimed(w.container("prep", img, then="exit 0"))])
        code, text = w.create(kubectl, namespace, dra.with_claim(pod, "gpu"))
        assert code == 0, text
    dra.settle(kubectl, namespace, 4)
    out = dra.outcome(driver, kubectl, namespace, names)
    assert out.wrong_gpu == [] and out.made_up == [] and out.stuck == [] and out.failed == [], out
    assert out.started == out.on_claimed_gpu == 4, out
    assert sum(out.consumed_gib.values()) == 4 * 12, out


@pytest.mark.parametrize("what", ["driver", "kubelet"])
def test_a_restart_while_pods_pull_loses_nothing(driver: Cluster, kubectl: Kubectl, namespace: str,
                                                 what: str) -> None:
    """The driver (its checkpoint answers the kubelet's repeated calls) or the kubelet (which deletes every slice of
    its node at start; the driver publishes it again) restarts while 8 pods pull."""
    img = w.image(driver, 8000)
    kubectl.ok(["apply", "-n", namespace, "-f", "-"], stdin=json.dumps(dra.claim_template("gpu", 16)))
    template = dra.with_claim(w.pod("x", [dra.claimed(w.container("main", img))]), "gpu")
    code, text = w.create(kubectl, namespace, w.replicaset("restart", 8, template))
    assert code == 0, text
    w.wait("8 pods bound", lambda: sum(bool(p["spec"].get("nodeName")) for p in w.pods(kubectl, namespace)) >= 8,
           120, 0.5)
    if what == "driver":
        driver.stop_dra()
        driver.start_dra()
    else:
        driver.procs.stop("kubelet")
        driver.start_kubelet()
        gpus = len(fake_gpus(driver.settings.fake_gpus, driver.settings.node_name, "GiB"))
        w.wait("the driver's slices published again after the kubelet removed them",
               lambda: len(dra.our_slices(kubectl, driver.settings.node_name)) == gpus, 120, 1)
    dra.settle(kubectl, namespace, 8)
    out = dra.outcome(driver, kubectl, namespace, ("main",))
    assert out.wrong_gpu == [] and out.made_up == [] and out.stuck == [] and out.failed == [], out
    assert out.over_committed == {} and out.started == out.on_claimed_gpu == 8, out


# What the driver answers for a claim it could not read in time (dra/driver.py, servicer.py).
OUR_ANSWERS = ("could not be read from the API server", "the gpushare DRA driver could not")


def test_a_hung_api_server_leaves_every_call_answered_within_the_kubelets_deadline(driver: Cluster, kubectl: Kubectl,
                                                                                   namespace: str) -> None:
    """The driver reads each claim from the API server before it prepares it. With that API server hung (a relay
    in front of it that stops carrying bytes) and more pods than the driver serves calls at once (CALL_HANDLERS),
    every NodePrepareResources call still gets the driver's own answer before the kubelet's 45 s run out: an error
    naming the claim and the API server, or RESOURCE_EXHAUSTED for the calls past the handlers; never the kubelet's
    DeadlineExceeded. Once the API server answers again, every pod starts on its claimed GPU."""
    pods = CALL_HANDLERS + 8
    port = int(driver.server.rsplit(":", 1)[1])
    with StallRelay(port) as relay:
        driver.stop_dra()
        try:
            driver.start_dra(server=f"https://127.0.0.1:{relay.port}")
            relay.hang()
            img = w.image(driver)
            kubectl.ok(["apply", "-n", namespace, "-f", "-"], stdin=json.dumps(dra.claim_template("gpu", 1)))
            template = dra.with_claim(w.pod("x", [dra.claimed(w.container("main", img))]), "gpu")
            code, text = w.create(kubectl, namespace, w.replicaset("hung", pods, template))
            assert code == 0, text

            def said() -> list[str]:
                items = kubectl.json(["get", "events", "-n", namespace])["items"]
                return [str(e.get("message")) for e in items if e.get("reason") == "FailedPrepareDynamicResources"]

            # The driver's budget for a call is GPUSHARE_DRA_TIMEOUT_SECONDS (20 s), within the kubelet's 45 s
            # (pkg/kubelet/cm/dra/plugin/dra_plugin.go); the kubelet retries a failed pod with its back-off.
            w.wait("the driver's answers for the hung claims",
                   lambda: sum(any(ours in m for ours in OUR_ANSWERS) for m in said()) >= 8,
                   150, 2)
            messages = said()
            assert not [m for m in messages if "DeadlineExceeded" in m or "context deadline exceeded" in m], messages
            print(f"\nwith the API server hung, {pods} pods: {len(messages)} FailedPrepareDynamicResources events, "
                  f"{sum('ResourceExhausted' in m for m in messages)} of them RESOURCE_EXHAUSTED; the first: "
                  f"{messages[0]}", file=sys.stderr)
            relay.resume()
            dra.settle(kubectl, namespace, pods)
            out = dra.outcome(driver, kubectl, namespace, ("main",))
            assert out.wrong_gpu == [] and out.made_up == [] and out.stuck == [] and out.failed == [], out
            assert out.over_committed == {} and out.started == out.on_claimed_gpu == pods, out
        finally:
            driver.stop_dra()
            driver.start_dra()


def test_the_driver_may_write_only_its_own_nodes_slice(driver: Cluster, tmp_path: Path) -> None:
    """RBAC lets the driver's identity write ResourceSlices; the component's policy keeps it to its own node's. The
    device plugin's identity may write none."""
    def slice_of(node: str) -> str:
        return json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                           "metadata": {"name": "not-mine"}, "spec": {"driver": DRA_DRIVER, "nodeName": node, "pool": {
                               "name": node, "generation": 1, "resourceSliceCount": 1}, "devices": []}})

    code, out, err = Kubectl(driver.dra_kubeconfig).run(["create", "-f", "-"], stdin=slice_of("another-node"))
    assert code != 0, out
    assert "may write only that node's ResourceSlice, not one of node another-node" in err, err
    plugin = Kubectl(driver.conf / "plugin.kubeconfig")
    code, out, err = plugin.run(["create", "-f", "-"], stdin=slice_of(driver.settings.node_name))
    assert code != 0 and "forbidden" in err, (out, err)


OTHER = "gpushare-e2e-other-node"  # a Node object without a kubelet (as tests/e2e/test_plugin_identity.py's)
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _slice(node: str, driver: str, *, name: str = "", generate_name: str = "") -> dict[str, object]:
    metadata = {"name": name} if name else {"generateName": generate_name}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": metadata,
            "spec": {"driver": driver, "nodeName": node, "devices": [],
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}


def test_another_nodes_driver_cannot_keep_this_nodes_pool_unpublished(driver: Cluster, kubectl: Kubectl) -> None:
    """With two nodes' identities: node B's driver token (a Node object without a kubelet) may not create a slice of
    another driver, nor of ours, named as this node's slices were named (`<node>-gpushare.io-gpu-0`); it may create
    its own keeper's slices. A slice of that name created anyway (here by the admin, whom the policy does not judge)
    keeps none of this node's GPUs unpublished: the keeper creates by generateName."""
    node = driver.settings.node_name
    if kubectl.run(["get", "node", OTHER])[0] != 0:
        kubectl.ok(["create", "-f", "-"], stdin=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                            "metadata": {"name": OTHER}}))
    other = Rest(driver.server, driver.pki_dir / "ca.crt",
                 token=gpushare.token(kubectl, *gpushare.DRA_SA, node=OTHER))
    squat = f"{node}-{DRA_DRIVER}-gpu-0"
    refusals = {"squatter.example.com": f"may write only ResourceSlices of driver gpushare.io, not ResourceSlice "
                                        f"{squat} of driver squatter.example.com",
                DRA_DRIVER: f"may name a ResourceSlice only as its keeper does (generateName "
                            f"{OTHER}-gpushare.io-gpu-<index>-), not {squat}"}
    for driver_name, refusal in refusals.items():
        with pytest.raises(KubeError) as caught:
            other.call("POST", SLICES, _slice(OTHER, driver_name, name=squat))
        assert caught.value.status == 403 and refusal in caught.value.message, caught.value
    own = other.call("POST", SLICES, _slice(OTHER, DRA_DRIVER, generate_name=f"{OTHER}-{DRA_DRIVER}-gpu-0-"))
    assert own["metadata"]["name"].startswith(f"{OTHER}-{DRA_DRIVER}-gpu-0-"), own
    other.call("DELETE", f"{SLICES}/{own['metadata']['name']}")
    kubectl.ok(["create", "-f", "-"], stdin=json.dumps(_slice(OTHER, "squatter.example.com", name=squat)))
    try:
        # What the kubelet does at its start: the keeper must publish every GPU again beside the squatter.
        kubectl.ok(["delete", "resourceslices", f"--field-selector=spec.nodeName={node},spec.driver={DRA_DRIVER}"])
        gpus = len(fake_gpus(driver.settings.fake_gpus, node, "GiB"))
        w.wait("every GPU's slice published again beside a slice holding the name its first slice once had",
               lambda: len(dra.our_slices(kubectl, node)) == gpus, 120, 1)
        assert all(s["metadata"]["name"] != squat for s in dra.our_slices(kubectl, node))
    finally:
        kubectl.run(["delete", "resourceslice", squat])


def test_a_request_for_two_shares_is_refused_at_admission(driver: Cluster, namespace: str) -> None:
    """One request of the class is one GPU share; the Kubernetes 1.34 scheduler would check a second device of one
    request against the wrong device (manifests/dra/claim-policy.yaml)."""
    template = dra.claim_template("two", 8)
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    code, out = w.create(driver.kubectl(), namespace, template)
    assert code != 0, out
    assert (f"ResourceClaimTemplate {namespace}/two asks for more than one device of class gpushare.io in one "
            "request") in out, out


def test_a_critical_xid_takes_the_gpu_out_of_the_pool(driver: Cluster, kubectl: Kubectl) -> None:
    """NVML reports XID 79 (fallen off the bus) for one GPU: its slice leaves the pool at once, so no new claim is
    allocated there; health comes back with a driver restart, as with the device plugin."""
    s = driver.settings
    gpus = fake_gpus(s.fake_gpus, s.node_name, "GiB")
    lost = gpus[-1]

    def devices() -> list[str]:
        return sorted(d["name"] for sl in dra.our_slices(kubectl, s.node_name) for d in sl["spec"]["devices"])

    try:
        fakenvml.inject_xid(driver.nvml_events, lost.uuid, 79)
        w.wait("the GPU with the XID out of the pool", lambda: devices() == [f"gpu-{g.index}" for g in gpus[:-1]],
               60, 1)
        assert f"GPU {lost.index} ({lost.uuid}) reported critical XID 79" in driver.log("dra-plugin").read_text(
            errors="replace")
    finally:
        driver.stop_dra()
        driver.start_dra()
    w.wait("every GPU back in the pool after the restart", lambda: len(devices()) == len(gpus), 60, 1)
