"""gpushare beside NVIDIA's own device plugin: its Helm chart, unmodified (../shared/peers/nvidia-device-plugin),
installed as its README says (`--namespace nvidia-device-plugin --create-namespace`), before and after ours, with
its namespace declared trusted GPU infrastructure (`trustedNamespaces`, docs/deploy.md).

Its pods cannot run here (its image is not on this machine), and need not: what is proven is admission. Its
DaemonSet's pods are created with `NVIDIA_VISIBLE_DEVICES=all` intact and nothing of ours injected, while a tenant's
pod setting the same variable in an ordinary namespace is still refused, with the webhook up and with it down (the
ValidatingAdmissionPolicy holds inside the API server). A whole-GPU pod (`nvidia.com/gpu`) beside a GPU-share pod
in one namespace keeps its env and waits for NVIDIA's plugin, and the GPU-share pod runs on its recorded GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from e2e import gpushare, install
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.harness.realtier import workloads as w

pytestmark = pytest.mark.usefixtures("needs_extender")

NVIDIA_CHART = "nvidia-device-plugin/deployments/helm/nvidia-device-plugin"
NVIDIA_RELEASE, NVIDIA_NAMESPACE = "nvdp", "nvidia-device-plugin"
# The label NVIDIA's chart's default affinity accepts to force a GPU node (its values.yaml, affinity).
NVIDIA_NODE_LABEL = "nvidia.com/gpu.present"
NVIDIA_PODS = "app.kubernetes.io/name=nvidia-device-plugin"
TRUSTED = ["kube-system", NVIDIA_NAMESPACE]


def _install_nvidia(cluster: Cluster) -> None:
    source = cluster.settings.peers_src
    if source is None:
        pytest.skip("NVIDIA's chart is not available: set GPUSHARE_E2E_PEERS_SRC to ../shared/peers")
    install.helm(cluster, "install", NVIDIA_RELEASE, str(source / NVIDIA_CHART), "--namespace", NVIDIA_NAMESPACE,
                 "--create-namespace")


def _install_ours(cluster: Cluster) -> None:
    values = install.write_values(cluster, cluster.run / "install" / "beside-nvidia.yaml", certificates="self-signed",
                                  extra={"trustedNamespaces": TRUSTED})
    install.helm(cluster, "install", install.RELEASE, str(cluster.chart), "--namespace", install.RELEASE_NAMESPACE,
                 "-f", str(values))
    install.certs_install(cluster)
    install.wait_serving(cluster)


@pytest.fixture(scope="module", params=["ours first", "nvidia first"])
def both(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[Cluster]:
    kubectl = cluster.kubectl()
    node = cluster.settings.node_name
    kubectl.ok(["label", "node", node, install.GPU_NODE_LABEL, f"{NVIDIA_NODE_LABEL}=true", "--overwrite"])
    first, second = (_install_ours, _install_nvidia) if request.param == "ours first" else (
        _install_nvidia, _install_ours)
    try:
        first(cluster)
        second(cluster)
        # Pods made before ours was installed were never judged by it: the DaemonSet makes them again now.
        kubectl.ok(["delete", "pods", "-n", NVIDIA_NAMESPACE, "-l", NVIDIA_PODS, "--wait=false"])
        yield cluster
    finally:
        install.helm(cluster, "uninstall", NVIDIA_RELEASE, "--namespace", NVIDIA_NAMESPACE, "--ignore-not-found")
        install.helm(cluster, "uninstall", install.RELEASE, "--namespace", install.RELEASE_NAMESPACE,
                     "--ignore-not-found", install.wait())
        kubectl.run(["delete", "namespace", NVIDIA_NAMESPACE, "--wait=true"], timeout=180)
        kubectl.ok(["label", "node", node, f"{NVIDIA_NODE_LABEL}-", f"{install.GPU_NODE_LABEL_KEY}-"])


def _env(container: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for entry in container.get("env") or []:
        out.setdefault(entry["name"], []).append(str(entry.get("value", "<valueFrom>")))
    return out


def _created_pods(kubectl: Kubectl) -> list[dict[str, Any]]:
    pods = [p for p in w.pods(kubectl, NVIDIA_NAMESPACE, NVIDIA_PODS) if not p["metadata"].get("deletionTimestamp")]
    if not pods:
        refusals = [e.get("message", "") for e in kubectl.json(["get", "events", "-n", NVIDIA_NAMESPACE])["items"]
                    if e.get("reason") == "FailedCreate"]
        assert not refusals, f"NVIDIA's DaemonSet could not create its pod: {refusals[-1]}"
    return pods


def _assert_nvidia_pods_untouched(kubectl: Kubectl) -> None:
    w.wait("NVIDIA's DaemonSet pod created again", lambda: len(_created_pods(kubectl)) == 1, 120)
    pod = _created_pods(kubectl)[0]
    main = next(c for c in pod["spec"]["containers"] if _env(c).get("NVIDIA_VISIBLE_DEVICES"))
    assert _env(main)["NVIDIA_VISIBLE_DEVICES"] == ["all"], (pod["metadata"]["name"], _env(main))
    for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
        assert "void" not in _env(c).get("NVIDIA_VISIBLE_DEVICES", []), (c["name"], _env(c))
    assert not any(k.startswith(("gpushare.io/", "ALIYUN_COM_GPU_MEM_"))
                   for k in (pod["metadata"].get("annotations") or {})), pod["metadata"].get("annotations")


def _tenant_pod(name: str, img: str) -> dict[str, Any]:
    ctr = w.container("main", img)
    ctr["env"].append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    return w.pod(name, [ctr])


def test_nvidias_pods_are_admitted_with_their_env_and_a_tenants_copy_is_refused(
        both: Cluster, kubectl: Kubectl, namespace: str) -> None:
    _assert_nvidia_pods_untouched(kubectl)
    code, text = w.create(both.kubectl(as_tenant=True), namespace, _tenant_pod("sees-all", w.image(both)))
    assert code != 0 and "gpushare denied pod" in text and "NVIDIA_VISIBLE_DEVICES" in text, text


def test_with_the_webhook_down_nvidias_pods_still_pass_and_the_tenants_copy_is_still_refused(
        both: Cluster, kubectl: Kubectl, namespace: str) -> None:
    deployment = ["deployment/gpushare-webhook", "-n", gpushare.NAMESPACE]
    kubectl.ok(["scale", *deployment, "--replicas=0"])
    try:
        w.wait("no webhook pod left", lambda: not w.pods(kubectl, gpushare.NAMESPACE,
                                                          "app.kubernetes.io/name=gpushare-webhook"), 120)
        kubectl.ok(["delete", "pods", "-n", NVIDIA_NAMESPACE, "-l", NVIDIA_PODS, "--wait=false"])
        _assert_nvidia_pods_untouched(kubectl)
        code, text = w.create(both.kubectl(as_tenant=True), namespace, _tenant_pod("sees-all", w.image(both)))
        assert code != 0 and "gpushare denied pod" in text and "NVIDIA_VISIBLE_DEVICES" in text, text
        # An ordinary pod of a CUDA image (its image env selects every GPU): where the API server serves
        # MutatingAdmissionPolicy v1 it is neutralised in-process even now; on the webhook path it is created as
        # written while the webhook is down (the fail-open entry), which docs/deploy.md states.
        cuda = w.pod("cuda", [w.container("main", w.image(both, repository="cuda-like"))])
        code, text = w.create(both.kubectl(as_tenant=True), namespace, cuda)
        assert code == 0, text
        created = next(p for p in w.pods(kubectl, namespace) if p["metadata"]["name"] == "cuda")
        voided = _env(created["spec"]["containers"][0]).get("NVIDIA_VISIBLE_DEVICES", [])
        assert voided == (["void"] if gpushare.serves_mutating_policies(kubectl) else []), voided
    finally:
        kubectl.ok(["scale", *deployment, "--replicas=2"])
        install.wait_serving(both, timeout=240)


def test_a_whole_gpu_pod_and_a_gpu_share_pod_in_one_namespace(
        both: Cluster, kubectl: Kubectl, namespace: str) -> None:
    img = w.image(both)
    whole = w.container("whole", img)
    whole["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    whole["env"].append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    code, text = w.create(both.kubectl(as_tenant=True), namespace, w.pod("whole-gpu", [whole]),
                          w.pod("shared", [w.container("main", img, 2)]))
    assert code == 0, text
    w.wait("the GPU-share pod running", lambda: any(
        p["metadata"]["name"] == "shared" and w.running(p) for p in w.pods(kubectl, namespace)), 180)
    pods = {p["metadata"]["name"]: p for p in w.pods(kubectl, namespace)}
    rep = w.report(kubectl, namespace, "shared", "main")
    assert rep is not None, w.why_no_gpu(kubectl, namespace, "shared", "main", rep)
    gpu = w.gpu_of(rep, "env", both.settings.node_name, both.settings.fake_gpus)
    assert gpu is not None and gpu == w.assigned_index(pods["shared"]), (rep, w.annotations_of(pods["shared"]))
    # The whole-GPU pod: admitted as written (its env is NVIDIA's plugin's business), and left to the scheduler,
    # which finds no nvidia.com/gpu on this node: NVIDIA's plugin is not running here.
    spec = pods["whole-gpu"]["spec"]["containers"][0]
    assert _env(spec)["NVIDIA_VISIBLE_DEVICES"] == ["all"], _env(spec)
    assert not spec.get("resources", {}).get("limits", {}).get(w.RESOURCE)
    w.wait("the scheduler's verdict on the whole-GPU pod", lambda: any(
        "nvidia.com/gpu" in e.get("message", "") for e in w.events(kubectl, namespace, "whole-gpu")
        if e.get("reason") == "FailedScheduling"), 60)
