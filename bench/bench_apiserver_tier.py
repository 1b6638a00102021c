"""Admission as the real API server records it, on the real-cluster tier, with gpushare installed as users install it.

Run: .venv/bin/python -m bench.bench_apiserver_tier [--runs 3] [--size 300]

Builds the Go floor (bench/apiclient/build.sh: a static binary), starts the tier's cluster without gpushare's host
processes (e2e.cluster; it refuses to start beside another kubelet) with its registry serving an image of that
binary, and installs the chart with the built image (e2e.install: self-signed, env delivery, the webhook as its
Deployment's two pods behind their Service; on Kubernetes 1.36 and later the chart's in-process path, where the
MutatingAdmissionPolicy gpushare-neutralise handles ordinary pods instead of two fail-open webhook entries). Each run
then creates three bursts of --size pods, as kube-controller-manager creates a ReplicaSet's pods (slow-start
batches through its client's rate limit), each in a fresh namespace, first with our admission objects installed:
  ordinary   one ReplicaSet of pods without GPU (a web server's image, CPU and memory requests);
  GPU-share  one ReplicaSet of pods of 1 unit of aliyun.com/gpu-mem (the bug report's shape);
  mix        nine ordinary pods to one GPU-share pod, as a cluster where GPU workloads are a tenth of the pods rolls
             out: two ReplicaSets created together in one namespace, whose batches interleave through the one
             controller's rate limit.
Then the GPU-share burst once more against the floor (bench/tier_floor.py: `apiclient floor` as a pod behind the
webhook's Service, answering /mutate with the patch our webhook gives these pods and /validate with an allow), and
the three bursts again with every webhook configuration and admission policy of ours deleted (MutatingAdmissionPolicy
kinds too where served; restored after: `helm upgrade` and `gpushare-certs install`). The pods select no node, so
the scheduler and the kubelet stay out of the measurement. Before and after each burst it reads the API server's own
/metrics (apiserver_request_duration_seconds of POST pods; apiserver_admission_webhook_admission_duration_seconds of
every webhook entry whose name holds "gpushare", whichever the chart renders; every admission plugin's
apiserver_admission_controller_admission_duration_seconds and our entries' matchConditions, each as a share per pod
created) and the webhook pods' /metrics (reviews answered, TLS handshakes completed).

Targets (the issue's, each run): POST pods mean with our admission over without at most 1.2 for the ordinary burst,
with no review reaching the webhook pods; at most 2.5 for the GPU-share burst, with at most one call of our entries
per pod; at most 1.4 for the mix; and mutate.gpushare.io's mean at most 1.3 times the floor's. Prints every figure
with min-max over the runs; exits 1 when a target is missed, 3 when the tier cannot run here (the line says why).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
import uuid
from typing import Any

from bench import tier_floor
from bench.bench_apiserver_client import build, webhook_patch
from bench.tier_floor import wait_until
from contract.keys import DEFAULT_RESOURCE
from e2e import gpushare, install, toolchain
from e2e.apimetrics import Burst, Reading, apiserver_series, counter, delta, sums
from e2e.apireport import GPU_SHARE, MIX, ORDINARY, SHAPES, Run, lines, missed
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from e2e.procs import StartError
from e2e.settings import from_environ

ADMISSION_KINDS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations",
                   "validatingadmissionpolicybindings", "validatingadmissionpolicies")
MUTATING_POLICY_KINDS = ("mutatingadmissionpolicybindings", "mutatingadmissionpolicies")  # Kubernetes 1.36 and later
WEBHOOK_PODS = "app.kubernetes.io/name=gpushare-webhook"
# The in-process floor: the least a MutatingAdmissionPolicy can do to every pod, one constant JSON Patch adding the
# entry gpushare-neutralise adds to the ordinary burst's one container (no condition, no variable). What the API
# server spends on it (for a JSON Patch it encodes the pod, applies the patch and decodes it again:
# k8s.io/apiserver pkg/admission/plugin/policy/mutating/patch/json_patch.go) is a cost no policy of ours can avoid.
FLOOR_POLICY = "gpushare-bench-floor"
FLOOR_POLICY_DOCS: list[dict[str, Any]] = [
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
     "metadata": {"name": FLOOR_POLICY},
     "spec": {"failurePolicy": "Fail", "reinvocationPolicy": "Never",
              "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                      "operations": ["CREATE"], "resources": ["pods"]}]},
              "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": (
                  "[JSONPatch{op: 'add', path: '/spec/containers/0/env', "
                  "value: [{'name': 'NVIDIA_VISIBLE_DEVICES', 'value': 'void'}]}]")}}]}},
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
     "metadata": {"name": FLOOR_POLICY}, "spec": {"policyName": FLOOR_POLICY}},
]
GPU_SHARE_CONTAINER = {"name": "main", "image": "gpushare-bench/none:1",
                       "resources": {"limits": {DEFAULT_RESOURCE: "1"}}}
ORDINARY_CONTAINER = {"name": "web", "image": "shop/frontend:2024.11.3",
                      "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                      "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}}


def read(kubectl: Kubectl) -> Reading:
    text = kubectl.ok(["get", "--raw", "/metrics"], timeout=60)
    handshakes = reviews = 0.0
    for pod in kubectl.json(["get", "pods", "-n", gpushare.NAMESPACE, "-l", WEBHOOK_PODS])["items"]:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            continue
        with urllib.request.urlopen(f"http://{ip}:9102/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
        handshakes += counter(metrics, "gpushare_webhook_tls_handshakes_total", outcome="completed")
        reviews += counter(metrics, "gpushare_webhook_reviews_total")
    return Reading(sums(text, apiserver_series), handshakes, reviews)


def replicaset(name: str, replicas: int, container: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"nodeSelector": {"gpushare-bench": "no-such-node"},
                                           "containers": [container]}}}}


def workloads(shape: str, size: int) -> list[dict[str, Any]]:
    if shape == ORDINARY:
        return [replicaset("ordinary", size, ORDINARY_CONTAINER)]
    if shape == GPU_SHARE:
        return [replicaset("gpu-share", size, GPU_SHARE_CONTAINER)]
    share = max(size // 10, 1)
    return [replicaset("ordinary", size - share, ORDINARY_CONTAINER),
            replicaset("gpu-share", share, GPU_SHARE_CONTAINER)]


def described(size: int) -> dict[str, str]:
    share = max(size // 10, 1)
    return {ORDINARY: f"{size} pods without GPU, one ReplicaSet", GPU_SHARE: f"{size} pods of 1 unit, one ReplicaSet",
            MIX: f"{size - share} ordinary and {share} GPU-share pods, two ReplicaSets created together"}


def template_pod(rs: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A pod of the ReplicaSet as its controller creates it, for the patch the webhook gives it."""
    template = rs["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
            "metadata": {**template["metadata"], "generateName": rs["metadata"]["name"] + "-", "namespace": namespace}}


def burst(kubectl: Kubectl, sets: list[dict[str, Any]]) -> Burst:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    kubectl.ok(["create", "namespace", namespace])
    # Without its default ServiceAccount the API server refuses the pods (the ServiceAccount admission plugin).
    wait_until("the namespace's default ServiceAccount",
               lambda: kubectl.run(["get", "serviceaccount", "default", "-n", namespace], timeout=10)[0] == 0, 60, 0.2)
    try:
        before = read(kubectl)
        kubectl.ok(["create", "-n", namespace, "-f", "-"],
                   stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": sets}))

        def created() -> bool:
            items = kubectl.json(["get", "replicasets", "-n", namespace])["items"]
            return len(items) == len(sets) and all(
                ((rs.get("status") or {}).get("replicas") or 0) >= rs["spec"]["replicas"] for rs in items)

        wait_until(f"{sum(rs['spec']['replicas'] for rs in sets)} pods created", created, 300, 0.5)
        time.sleep(1)  # the last calls' observations
        return delta(before, read(kubectl))
    finally:
        # Gone before the next burst, so its deletions do not load the API server during it.
        kubectl.run(["delete", "namespace", namespace, "--wait=true"], timeout=300)


def admission_state(kubectl: Kubectl) -> tuple[bool, bool]:
    """(an ordinary pod gets NVIDIA_VISIBLE_DEVICES=void, a GPU-share pod gets our intent or is refused) in a
    server-side dry run: our objects reach the API server's admission a moment after they are written or deleted,
    and a policy still there while the webhook configuration is gone refuses the unstamped pod."""
    def dry_run(rs: dict[str, Any]) -> dict[str, Any] | None:
        pod = template_pod(rs, "default")
        pod["metadata"]["name"] = "admission-probe"
        code, out, _ = kubectl.run(["create", "--dry-run=server", "-o", "json", "-f", "-"], stdin=json.dumps(pod),
                                   timeout=30)
        return dict(json.loads(out)) if code == 0 else None

    ordinary, shared = dry_run(replicaset("ordinary", 1, ORDINARY_CONTAINER)), dry_run(workloads(GPU_SHARE, 1)[0])
    voided = ordinary is not None and {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in (
        ordinary["spec"]["containers"][0].get("env") or [])
    return voided, shared is None or "gpushare.io/intent" in (shared["metadata"].get("annotations") or {})


def ours(items: list[dict[str, Any]]) -> list[str]:
    """Our objects: the chart's label, or Helm's release annotation (objects an older chart rendered without the
    label)."""
    return [o["metadata"]["name"] for o in items
            if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/part-of") == "gpushare"
            or (o["metadata"].get("annotations") or {}).get("meta.helm.sh/release-name") == install.RELEASE]


def remove_admission(kubectl: Kubectl, kinds: tuple[str, ...]) -> None:
    for kind in kinds:
        names = ours(kubectl.json(["get", kind])["items"])
        if names:
            kubectl.ok(["delete", kind, *names, "--wait=true"])
    wait_until("our admission gone from the API server", lambda: admission_state(kubectl) == (False, False), 60)


def restore_admission(cluster: Cluster, values: str) -> None:
    install.helm(cluster, "upgrade", install.RELEASE, "charts/gpushare", "--namespace", install.RELEASE_NAMESPACE,
                 "-f", values, install.wait(), "--timeout", "5m", timeout=360)
    install.certs_install(cluster)  # the recreated configurations' caBundle
    install.wait_serving(cluster)
    wait_until("our admission back in the API server", lambda: admission_state(cluster.kubectl()) == (True, True), 60)


def install_chart(cluster: Cluster) -> str:
    kubectl = cluster.kubectl()
    kubectl.ok(["label", "node", cluster.settings.node_name, install.GPU_NODE_LABEL, "--overwrite"])
    values = install.write_values(cluster, cluster.run / "bench" / "values.yaml", certificates="self-signed")
    install.helm(cluster, "install", install.RELEASE, "charts/gpushare", "--namespace", install.RELEASE_NAMESPACE,
                 "-f", str(values))
    install.certs_install(cluster)

    def ready() -> bool:
        pods = kubectl.json(["get", "pods", "-n", gpushare.NAMESPACE, "-l", WEBHOOK_PODS])
        return sum(any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in (p.get("status") or {}).get("conditions") or []) for p in pods["items"]) == 2

    wait_until("2 webhook pods Ready", ready, 300, 2)
    install.wait_serving(cluster)
    wait_until("our admission in the API server", lambda: admission_state(kubectl) == (True, True), 60)
    return str(values)


def policy_floor(kubectl: Kubectl, size: int) -> Burst:
    """The ordinary burst with FLOOR_POLICY alone (our admission removed)."""
    gpushare.apply(kubectl, FLOOR_POLICY_DOCS)
    try:
        wait_until("the floor policy in the API server", lambda: admission_state(kubectl)[0], 60)
        return burst(kubectl, workloads(ORDINARY, size))
    finally:
        for kind in ("mutatingadmissionpolicybinding", "mutatingadmissionpolicy"):
            kubectl.ok(["delete", kind, FLOOR_POLICY, "--ignore-not-found", "--wait=true"])
        wait_until("the floor policy gone from the API server", lambda: not admission_state(kubectl)[0], 60)


def measure(cluster: Cluster, values: str, size: int, patch: bytes) -> Run:
    kubectl = cluster.kubectl()
    in_process = gpushare.serves_mutating_policies(kubectl)
    kinds = ADMISSION_KINDS + (MUTATING_POLICY_KINDS if in_process else ())
    with_ours = {shape: burst(kubectl, workloads(shape, size)) for shape in SHAPES}
    with tier_floor.serving(cluster, patch):
        floor = burst(kubectl, workloads(GPU_SHARE, size))
    remove_admission(kubectl, kinds)
    try:
        without = {shape: burst(kubectl, workloads(shape, size)) for shape in SHAPES}
        policy = policy_floor(kubectl, size) if in_process else None
    finally:
        restore_admission(cluster, values)
    return Run(with_ours, without, floor, policy)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_apiserver_tier", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=300, help="pods in each burst (default 300)")
    args = parser.parse_args(argv)
    missing = toolchain.check()
    if missing:
        print("bench_apiserver_tier skipped: " + "; ".join(missing), file=sys.stderr)
        return 3
    floor_binary = build()
    if floor_binary is None:
        print("bench_apiserver_tier skipped: the Go floor (bench/apiclient) cannot be built here", file=sys.stderr)
        return 3
    settings = from_environ()
    cluster = Cluster(settings, toolchain.ensure(settings), {tier_floor.IMAGE: floor_binary})
    try:
        cluster.up(host_gpushare=False)
    except StartError as exc:  # another kubelet on this machine, or a component that cannot start here
        print(f"bench_apiserver_tier skipped: {exc}", file=sys.stderr)
        return 3
    shapes = described(args.size)
    # The patch our webhook gives the burst's GPU-share pods, which the floor answers every /mutate with.
    patch = webhook_patch(template_pod(workloads(GPU_SHARE, 1)[0], "bench"))
    runs: list[Run] = []
    try:
        values = install_chart(cluster)
        in_process = gpushare.serves_mutating_policies(cluster.kubectl())
        path = ("the MutatingAdmissionPolicy gpushare-neutralise" if in_process
                else "the webhook entries neutralise.gpushare.io and validate-ordinary.gpushare.io")
        print(f"Kubernetes {settings.kubernetes_version}, ordinary pods handled by {path}; bursts of {args.size} pods",
              flush=True)
        for number in range(1, args.runs + 1):
            runs.append(measure(cluster, values, args.size, patch))
            print(f"run {number}:", *lines(runs[-1:], shapes)[1:], sep="\n  ", flush=True)
    finally:
        cluster.down()
    print("", *lines(runs, shapes), sep="\n")
    failed = missed(runs)
    print("targets missed:\n  " + "\n  ".join(failed) if failed else "every target met")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
