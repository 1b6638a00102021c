"""gpushare installed as users install it, on the real node: the image built from the Dockerfile, `helm install` of
charts/gpushare (self-signed certificates through `gpushare-certs install`), the webhook as two Deployment pods
the API server reaches through their Service, the device plugin as a DaemonSet pod that registers with the kubelet
through its hostPath sockets and talks to the API server with in-cluster configuration; then `helm uninstall`,
after which nothing of ours is left to refuse or delay a pod.

The tests of this module run in order on one install (the first installs, the last uninstalls).
"""

from __future__ import annotations

import json
import ssl
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import gpushare, install
from e2e import settings as ports
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.e2e.test_scenario import KUBELET_OWN
from tests.harness import alerts
from tests.harness.realtier import scenarios
from tests.harness.realtier import workloads as w
from tests.harness.scenarios import BUG_REPORT, INIT, Scenario

pytestmark = pytest.mark.usefixtures("needs_extender")

# What the chart creates outside its namespace (labelled app.kubernetes.io/part-of=gpushare), by kind.
CLUSTER_KINDS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations",
                 "validatingadmissionpolicies", "validatingadmissionpolicybindings", "clusterroles",
                 "clusterrolebindings")
# The in-process path's kinds (manifests/in-process), served from Kubernetes 1.36 only.
MUTATING_POLICY_KINDS = ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings")
PART_OF = "app.kubernetes.io/part-of=gpushare"
# The pods of the webhook and the plugin, by the label their selectors use.
PODS = "app.kubernetes.io/name in (gpushare-webhook,gpushare-device-plugin)"
FIGURES: dict[str, float] = {}


def _ready(p: dict[str, Any]) -> bool:
    conditions = (p.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def assert_nothing_of_ours_left(kubectl: Kubectl) -> None:
    """The namespace gone, and no cluster-wide object of ours that could refuse or delay a pod."""
    w.wait("the namespace gpushare-system gone",
           lambda: kubectl.run(["get", "namespace", gpushare.NAMESPACE], timeout=10)[0] != 0, 180, 2)
    kinds = CLUSTER_KINDS + (MUTATING_POLICY_KINDS if gpushare.serves_mutating_policies(kubectl) else ())
    left = {kind: [o["metadata"]["name"] for o in kubectl.json(["get", kind, "-l", PART_OF])["items"]]
            for kind in kinds}
    assert all(not names for names in left.values()), left
    # Nothing of ours by name either (gpushare-certs labels nothing it patches; its objects were in the namespace).
    for kind in CLUSTER_KINDS[:4]:
        names = kubectl.ok(["get", kind, "-o", "name"])
        assert "gpushare" not in names, (kind, names)


def _ours(kubectl: Kubectl, selector: str) -> list[dict[str, Any]]:
    pods = list(kubectl.json(["get", "pods", "-n", gpushare.NAMESPACE, "-l", selector])["items"])
    assert selector != PODS or pods, f"no pod of ours matches {selector}"
    return pods


def _kubelet_stats(cluster: Cluster) -> dict[str, Any]:
    """The kubelet's /stats/summary, read as the API server reads it (its kubelet client certificate): the API
    server does not proxy to a loopback node address."""
    context = ssl.create_default_context(cafile=str(cluster.pki_dir / "ca.crt"))
    client = cluster.pki_dir / "apiserver-kubelet-client"
    context.load_cert_chain(client.with_suffix(".crt"), client.with_suffix(".key"))
    url = f"https://127.0.0.1:{cluster.settings.port(ports.KUBELET)}/stats/summary"
    with urllib.request.urlopen(url, context=context, timeout=10) as answer:
        stats: dict[str, Any] = json.loads(answer.read())
    return stats


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[Cluster]:
    kubectl = cluster.kubectl()
    kubectl.ok(["label", "node", cluster.settings.node_name, install.GPU_NODE_LABEL, "--overwrite"])
    values = install.write_values(cluster, cluster.run / "install" / "values.yaml", certificates="self-signed")
    started = time.monotonic()
    install.helm(cluster, "install", install.RELEASE, str(cluster.chart), "--namespace", install.RELEASE_NAMESPACE,
                 "-f", str(values))
    install.certs_install(cluster)  # the chart's NOTES: once, after the first install in self-signed mode
    FIGURES["install_started"] = started
    yield cluster
    install.helm(cluster, "uninstall", install.RELEASE, "--namespace", install.RELEASE_NAMESPACE, "--ignore-not-found")


def test_the_installed_pods_are_ready_and_the_plugin_is_registered(installed: Cluster, kubectl: Kubectl) -> None:
    image = install.image_values(installed)
    ref = f"{image['repository']}:{image['tag']}"
    w.wait("2 webhook pods Ready (their exec probes over loopback TLS)",
           lambda: sum(map(_ready, _ours(kubectl, "app.kubernetes.io/name=gpushare-webhook"))) == 2, 240, 2)
    w.wait("the device plugin's pod Ready",
           lambda: sum(map(_ready, _ours(kubectl, "app.kubernetes.io/name=gpushare-device-plugin"))) == 1, 120, 2)
    for p in _ours(kubectl, PODS):
        assert {c["image"] for c in p["spec"]["containers"]} == {ref}, p["metadata"]["name"]
    webhook = _ours(kubectl, "app.kubernetes.io/name=gpushare-webhook")[0]["spec"]
    assert webhook.get("automountServiceAccountToken") is False, "the webhook's pod must hold no API token"
    log = installed.log("kubelet")
    w.wait("the kubelet's record of the plugin's registration", lambda: scenarios.REGISTERED in log.read_bytes(), 60)
    w.wait("the node advertising aliyun.com/gpu-mem", lambda: kubectl.ok(
        ["get", "node", installed.settings.node_name, "-o",
         "jsonpath={.status.allocatable.aliyun\\.com/gpu-mem}"]).strip() not in ("", "0"), 60)
    install.wait_serving(installed)
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        for config in kubectl.json(["get", kind, "-l", PART_OF])["items"]:
            for hook in config["webhooks"]:
                assert "service" in hook["clientConfig"] and "url" not in hook["clientConfig"], hook["name"]


def test_the_webhook_runs_as_its_user_on_a_read_only_root(installed: Cluster, kubectl: Kubectl) -> None:
    """What the Deployment claims, as runc enforces it: user 65532, a read-only root file system, /tmp writable."""
    probe = ("import os, tempfile\nprint(os.getuid(), os.getgid())\n"
             "try:\n    open('/probe', 'w')\nexcept OSError as exc:\n    print('root', exc.errno)\n"
             "with tempfile.NamedTemporaryFile(dir='/tmp') as f:\n    print('tmp', f.name.startswith('/tmp/'))\n")
    out = kubectl.ok(["exec", "-n", gpushare.NAMESPACE, "deployment/gpushare-webhook", "-c", "webhook", "--",
                      "python", "-c", probe], timeout=60).split("\n")
    assert out[0] == "65532 65532" and out[1] == "root 30" and out[2] == "tmp True", out  # 30: EROFS


def test_the_webhooks_pod_passes_the_restricted_pod_security_level(installed: Cluster, kubectl: Kubectl) -> None:
    """gpushare-system is labelled privileged for the plugin's hostPaths; the webhook's pod itself must pass
    `restricted`, as the real API server's Pod Security admission judges it (server-side dry run)."""
    name = "e2e-restricted"
    kubectl.ok(["create", "namespace", name])
    try:
        kubectl.ok(["label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted"])
        template = kubectl.json(["get", "deployment", "gpushare-webhook", "-n", gpushare.NAMESPACE])["spec"]["template"]
        # Its ServiceAccount lives in gpushare-system; the namespace's default one stands in (no token either way).
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "webhook-as-restricted", "namespace": name},
               "spec": {**template["spec"], "serviceAccountName": "default"}}
        code, out, err = kubectl.run(["create", "--dry-run=server", "-f", "-"], stdin=json.dumps(pod), timeout=30)
        assert code == 0 and "violate" not in err, err or out
        plugin = kubectl.json(["get", "daemonset", "gpushare-device-plugin", "-n", gpushare.NAMESPACE])
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plugin-as-restricted", "namespace": name},
               "spec": {**plugin["spec"]["template"]["spec"], "serviceAccountName": "default"}}
        code, out, err = kubectl.run(["create", "--dry-run=server", "-f", "-"], stdin=json.dumps(pod), timeout=30)
        assert code != 0 and "hostPath" in err, "the plugin needs the privileged level (its hostPath volumes)"
    finally:
        kubectl.run(["delete", "namespace", name, "--wait=false"])


def test_a_gpu_share_pod_runs_through_the_installed_pods(installed: Cluster, kubectl: Kubectl,
                                                         namespace: str) -> None:
    spec = w.pod("first", [w.container("main", w.image(installed), 4)])
    assert w.create(kubectl, namespace, spec)[0] == 0
    pod = w.wait_running(kubectl, namespace, 1, 180)[0]
    seconds = time.monotonic() - FIGURES["install_started"]
    annotations = w.annotations_of(pod)
    assert "gpushare.io/intent" in annotations, "the installed webhook stamps the pod"
    assert "gpushare.io/allocation" in annotations, "the installed plugin records its allocation"
    rep = w.report(kubectl, namespace, "first", "main")
    assert rep is not None
    got = w.gpu_of(rep, "env", installed.settings.node_name, installed.settings.fake_gpus)
    assert got == w.assigned_index(pod), (rep, annotations)
    print(f"\nhelm install to the first GPU-share pod running: {seconds:.1f} s", file=sys.stderr)


@pytest.mark.parametrize("scenario", [BUG_REPORT, INIT], ids=["bug-report", "init"])
def test_scenarios_through_the_installed_pods(installed: Cluster, kubectl: Kubectl, namespace: str,
                                              scenario: Scenario) -> None:
    out = scenarios.run(installed, kubectl, namespace, "env", scenario)
    print(f"\n{scenario.name} through the installed pods (env): {out.as_json()}", file=sys.stderr)
    assert out.wrong_gpu == [] and out.made_up == [] and out.over_committed == {} and out.stuck == [], out.as_json()
    assert out.started == out.on_recorded_gpu == scenario.replicas, out.as_json()
    assert all(any(own in r for own in KUBELET_OWN) for r in out.rejected), out.rejected
    assert set(out.plugin_refusals) <= {"GpuSharePodDeleting"}, (out.plugin_refusals, out.plugin_messages)
    # The webhook's and the plugin's containers held under their limits: not one restart (an OOM kill restarts).
    for p in _ours(kubectl, PODS):
        assert all(c["restartCount"] == 0 for c in p["status"]["containerStatuses"]), p["metadata"]["name"]
    summary = _kubelet_stats(installed)
    used = {f"{pod['podRef']['name']}/{c['name']}": c.get("memory", {}).get("workingSetBytes", 0) // 2**20
            for pod in summary["pods"] if pod["podRef"]["namespace"] == gpushare.NAMESPACE
            for c in pod.get("containers") or []}
    print(f"memory in use after it (MiB, limits: webhook 384, plugin 256): {used}", file=sys.stderr)


def test_each_alert_fires_on_the_series_the_installed_pods_expose(installed: Cluster, kubectl: Kubectl,
                                                                   tmp_path: Path) -> None:
    """The webhook's and the plugin's /metrics as Prometheus reads them (the pod network), labelled as their
    PodMonitors label them: promtool finds every alert quiet on them as they are, and each alert that has a drive
    on these programs firing once only the values of its series are changed (tests/harness/alerts.py)."""
    series = alerts.scraped(kubectl, ("webhook", "device-plugin"), gpushare.NAMESPACE)
    assert alerts.driven_alerts(series) == set(alerts.alert_names()) - {"GpuShareDraSlicesMissing"}
    failures = alerts.check(series, tmp_path)
    assert failures == {}, alerts.report(failures)


def test_uninstall_leaves_nothing_that_refuses_or_delays_a_pod(installed: Cluster, kubectl: Kubectl,
                                                                namespace: str) -> None:
    install.helm(installed, "uninstall", install.RELEASE, "--namespace", install.RELEASE_NAMESPACE, install.wait())
    assert_nothing_of_ours_left(kubectl)
    started = time.monotonic()
    code, out = w.create(kubectl, namespace, w.pod("plain", [w.container("main", w.image(installed))]))
    assert code == 0, out
    print(f"\nan ordinary pod created {time.monotonic() - started:.2f} s after asking, with gpushare uninstalled",
          file=sys.stderr)
    w.wait_running(kubectl, namespace, 1, 120)
    # A GPU-share pod now has nothing to admit, place or serve it: it waits, and the scheduler says what is missing.
    assert w.create(kubectl, namespace, w.pod("gpu", [w.container("main", w.image(installed), 4)]))[0] == 0

    def unschedulable() -> list[str]:
        return [str(e.get("message")) for e in w.events(kubectl, namespace, "gpu")
                if e.get("reason") == "FailedScheduling" and "aliyun.com/gpu-mem" in str(e.get("message"))]

    w.wait("a FailedScheduling Event naming aliyun.com/gpu-mem", lambda: bool(unschedulable()), 120, 2)
    print(f"a GPU-share pod after the uninstall: {unschedulable()[0]}", file=sys.stderr)
