"""The chart in its default certificate mode, on the real node with the tier's real cert-manager: `helm install`
with `certificates: cert-manager` and `cdi` delivery; cert-manager issues the serving certificate, its cainjector
fills every caBundle, the chart's signing-key Job runs as a pod with the image; then the bug report's scenario
through the installed pods, an upgrade and a rollback while pods are created without pause, and `helm uninstall`.

Runs after test_install.py (its uninstall leaves the cluster as it found it); the tests of this module run in
order on one install.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e import gpushare, install
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from e2e.projectimage import UPGRADE_SUFFIX
from tests.e2e.test_scenario import KUBELET_OWN
from tests.harness.realtier import scenarios
from tests.harness.realtier import workloads as w
from tests.harness.scenarios import BUG_REPORT
from tests.install.test_install import PART_OF, PODS, _ours, _ready, assert_nothing_of_ours_left

pytestmark = pytest.mark.usefixtures("needs_extender")
DELIVERY = "cdi"
# While the DaemonSet replaces the plugin's pod, one more refusal is the kubelet's own: the old plugin's
# ListAndWatch stream ends, the kubelet closes its connection to it (pkg/kubelet/cm/devicemanager/plugin/v1beta1/
# handler.go runClient -> disconnectClient -> client.go Disconnect, grpc.ClientConn.Close), and a call it had in
# flight for a pod it was admitting fails on its side with grpc-go's ErrClientConnClosing (clientconn.go: Canceled,
# "grpc: the client connection is closing"), a text our plugin never sends. The pod fails with UnexpectedAdmissionError,
# as the others of KUBELET_OWN; only the rollout may show it, never the scenarios.
WHILE_REPLACED = (*KUBELET_OWN, "rpc error: code = Canceled desc = grpc: the client connection is closing")


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[Cluster]:
    kubectl = cluster.kubectl()
    install.ensure_cert_manager(cluster)
    kubectl.ok(["label", "node", cluster.settings.node_name, install.GPU_NODE_LABEL, "--overwrite"])
    values = install.write_values(cluster, cluster.run / "install" / "cert-manager.yaml",
                                  certificates="cert-manager", delivery=DELIVERY)
    install.helm(cluster, "install", install.RELEASE, str(cluster.chart), "--namespace", install.RELEASE_NAMESPACE,
                 "-f", str(values), install.wait(), "--timeout", "5m", timeout=360)
    install.wait_serving(cluster)
    yield cluster
    install.helm(cluster, "uninstall", install.RELEASE, "--namespace", install.RELEASE_NAMESPACE, "--ignore-not-found",
                 install.wait())


def test_cert_manager_issues_and_injects_and_the_pods_are_ready(installed: Cluster, kubectl: Kubectl) -> None:
    """`helm install --wait` returned: the Deployment's pods are Ready, so the Certificate was issued; the Job ran."""
    assert sum(map(_ready, _ours(kubectl, "app.kubernetes.io/name=gpushare-webhook"))) == 2
    w.wait("the device plugin's pod Ready",
           lambda: sum(map(_ready, _ours(kubectl, "app.kubernetes.io/name=gpushare-device-plugin"))) == 1, 120, 2)
    # The Job made the key pair and went (ttlSecondsAfterFinished: 0, so that an upgrade may create it again).
    assert kubectl.run(["get", "secret", "gpushare-signing-key", "-n", gpushare.NAMESPACE])[0] == 0
    assert kubectl.run(["get", "configmap", "gpushare-verify-key", "-n", gpushare.NAMESPACE])[0] == 0
    w.wait("the finished signing-key Job deleted by its TTL", lambda: kubectl.run(
        ["get", "job", "gpushare-signing-key", "-n", gpushare.NAMESPACE])[0] != 0, 60, 1)
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        for config in kubectl.json(["get", kind, "-l", PART_OF])["items"]:
            assert all(hook["clientConfig"].get("caBundle") for hook in config["webhooks"]), config["metadata"]


def test_the_bug_report_through_the_installed_pods_in_cdi(installed: Cluster, kubectl: Kubectl,
                                                          namespace: str) -> None:
    scenario = BUG_REPORT
    out = scenarios.run(installed, kubectl, namespace, DELIVERY, scenario)
    print(f"\n{scenario.name} through the installed pods ({DELIVERY}): {out.as_json()}", file=sys.stderr)
    assert out.wrong_gpu == [] and out.made_up == [] and out.over_committed == {} and out.stuck == [], out.as_json()
    assert out.started == out.on_recorded_gpu == scenario.replicas, out.as_json()
    assert all(any(own in r for own in KUBELET_OWN) for r in out.rejected), out.rejected
    assert set(out.plugin_refusals) <= {"GpuSharePodDeleting"}, (out.plugin_refusals, out.plugin_messages)


class Loop:
    """Creates GPU-share and ordinary pods, one after the other, until stopped; every refusal is kept."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.kubectl, self.namespace = cluster.kubectl(as_tenant=True), namespace
        self.img = w.image(cluster)
        self.created = 0
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _spec(self, n: int) -> dict[str, Any]:
        gpu = n % 2 == 0
        spec = w.pod(f"loop-{n}", [w.container("main", self.img, 1 if gpu else None, then="exit 0")])
        spec["spec"]["restartPolicy"] = "Never"
        spec["metadata"]["labels"] = {"loop": "gpu" if gpu else "plain"}
        return spec

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            code, out = w.create(self.kubectl, self.namespace, self._spec(n))
            if code != 0:
                self.refused.append(out.strip())
            else:
                self.created += 1
            n += 1

    def __enter__(self) -> Loop:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def until(self, count: int, timeout: float) -> None:
        w.wait(f"{count} pods created by the loop", lambda: self.created + len(self.refused) >= count, timeout, 1)


def _check_loop_pods(installed: Cluster, kubectl: Kubectl, namespace: str,
                     delivery: str = DELIVERY) -> tuple[int, list[str], list[str]]:
    """Every GPU-share pod of the loop that ran: on its recorded GPU. Returns (checked, wrong, the kubelet's own
    rejections): while the plugin's pod is replaced, the kubelet rejects the pods it admits (WHILE_REPLACED)."""
    def finished() -> list[dict[str, Any]]:
        return [p for p in w.pods(kubectl, namespace, "loop=gpu") if w.phase(p) not in ("Pending", "Running")]

    everyone = len(w.pods(kubectl, namespace, "loop=gpu"))
    w.wait("every GPU-share pod of the loop finished", lambda: len(finished()) == everyone, 300, 3)
    wrong: list[str] = []
    rejected: list[str] = []
    checked = 0
    for p in finished():
        name = p["metadata"]["name"]
        if w.phase(p) != "Succeeded":
            reason = w.reason(p)
            if any(own in reason for own in WHILE_REPLACED):
                rejected.append(f"{name}: {reason}")
            else:
                said = "; ".join(f"{e.get('reason')}: {e.get('message', '')}"
                                 for e in w.events(kubectl, namespace, name))
                wrong.append(f"{name}: {reason} (events: {said})")
            continue
        rep = w.report(kubectl, namespace, name, "main")
        got = None if rep is None else w.gpu_of(rep, delivery, installed.settings.node_name,
                                                installed.settings.fake_gpus)
        checked += 1
        if got is None or got != w.assigned_index(p):
            wrong.append(f"{name}: got {got}, recorded {w.assigned_index(p)}; "
                         f"{w.why_no_gpu(kubectl, namespace, name, 'main', rep)}")
    return checked, wrong, rejected


@pytest.mark.parametrize("step", ["upgrade", "rollback"])
def test_upgrade_and_rollback_refuse_no_pod_and_misplace_none(installed: Cluster, kubectl: Kubectl, namespace: str,
                                                              step: str) -> None:
    """While 300 pods (every other one GPU-share) are created: `helm upgrade` to another image tag with a changed
    setting (the Deployment's and the DaemonSet's pods roll), or `helm rollback` to the install."""
    image = install.image_values(installed)
    started = time.monotonic()
    try:
        _upgrade_or_rollback(installed, kubectl, namespace, step, image, started)
    finally:  # one delete-collection call: the namespace's pod-by-pod cleanup of 300 pods takes minutes
        kubectl.run(["delete", "--raw", f"/api/v1/namespaces/{namespace}/pods?labelSelector=loop"], timeout=120)


def _upgrade_or_rollback(installed: Cluster, kubectl: Kubectl, namespace: str, step: str, image: dict[str, Any],
                         started: float) -> None:
    with Loop(installed, namespace) as loop:
        loop.until(20, 120)
        if step == "upgrade":
            install.helm(installed, "upgrade", install.RELEASE, str(installed.chart), "--namespace",
                         install.RELEASE_NAMESPACE, "--reuse-values", "--set-string",
                         f"image.tag={image['tag']}{UPGRADE_SUFFIX}", "--set",
                         "webhook.resources.limits.memory=400Mi", install.wait(), "--timeout", "5m", timeout=360)
        else:
            install.helm(installed, "rollback", install.RELEASE, "1", "--namespace", install.RELEASE_NAMESPACE,
                         install.wait(), "--timeout", "5m", timeout=360)
        rolled = time.monotonic() - started
        loop.until(300, 600)
    tag = image["tag"] + (UPGRADE_SUFFIX if step == "upgrade" else "")
    for p in _ours(kubectl, PODS):
        if w.phase(p) == "Running" and not p["metadata"].get("deletionTimestamp"):
            assert {c["image"].rsplit(":", 1)[1] for c in p["spec"]["containers"]} == {tag}, p["metadata"]["name"]
    checked, wrong, rejected = _check_loop_pods(installed, kubectl, namespace)
    print(f"\nhelm {step} while creating pods: {loop.created} created, {len(loop.refused)} refused at admission, "
          f"the {step} returned after {rolled:.0f} s; {checked} GPU-share pods ran and were checked, {len(wrong)} "
          f"failed or not on their GPU; {len(rejected)} rejected by the kubelet while the plugin re-registered: "
          f"{rejected}",
          file=sys.stderr)
    assert loop.refused == [], loop.refused[:5]
    assert wrong == [], (wrong[:10], _node_lines(installed, [x.split(":", 1)[0] for x in wrong[:3]]))


def _node_lines(cluster: Cluster, names: list[str]) -> str:
    """The kubelet's and containerd's log lines that name these pods (or their errors), for a failure message."""
    out = []
    for log in ("kubelet", "containerd"):
        path = cluster.log(log)
        text = path.read_text(errors="replace").splitlines() if path.exists() else []
        out += [f"{log}: {line}" for line in text if any(f'"{n}"' in line or f"/{n}" in line or f" {n} " in line
                                                            for n in names)][-40:]
    return "\n".join(out)


def test_uninstall_leaves_nothing_of_ours(installed: Cluster, kubectl: Kubectl, namespace: str) -> None:
    install.helm(installed, "uninstall", install.RELEASE, "--namespace", install.RELEASE_NAMESPACE, install.wait())
    assert_nothing_of_ours_left(kubectl)
    code, out = w.create(kubectl, namespace, w.pod("plain", [w.container("main", w.image(installed))]))
    assert code == 0, out
