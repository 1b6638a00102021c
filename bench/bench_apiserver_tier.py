"""Admission as the real API server records it, on the real-cluster tier, with gpushare installed as users install it.

Run: .venv/bin/python -m bench.bench_apiserver_tier [--runs 3] [--bursts 30,300]

Starts the tier's cluster without gpushare's host processes (e2e.cluster; it refuses to start beside another
kubelet), installs the chart with the built image (e2e.install: self-signed, env delivery, the webhook as its
Deployment's two pods behind their Service), and then, in each run, creates each burst twice: a ReplicaSet of N
GPU-share pods (1 unit each, the bug report's shape) created as kube-controller-manager creates them (slow-start
batches), first with our admission objects installed, then with every webhook configuration and admission policy
of ours removed (restored after: `helm upgrade` and `gpushare-certs install`). The pods select no node, so the
scheduler and the kubelet stay out of the measurement. Before and after each burst it reads the API server's own
/metrics (apiserver_request_duration_seconds of POST pods; apiserver_admission_webhook_admission_duration_seconds per
webhook entry; apiserver_admission_controller_admission_duration_seconds of every admission plugin and
apiserver_admission_match_condition_evaluation_seconds of our entries' matchConditions, each as a share per pod
created, so the gap between the two bursts is placed plugin by plugin) and the webhook pods' /metrics (TLS
handshakes completed, reviews answered).

Targets (the issue's, each run): POST pods mean with our admission / without at most 1.25 for every burst; each of
our webhook entries' mean at most 3 ms; fewer than one TLS handshake per 20 calls. Prints every figure with
min-max over the runs; exits 1 when a target is missed, 3 when the tier cannot run here (the line says why).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from contract.keys import DEFAULT_RESOURCE
from e2e import gpushare, install, toolchain
from e2e.apimetrics import PLUGIN, Burst, Reading, apiserver_series, counter, delta, sums
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from e2e.settings import from_environ

RESOURCE = DEFAULT_RESOURCE
PART_OF = "app.kubernetes.io/part-of=gpushare"
ADMISSION_KINDS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations",
                   "validatingadmissionpolicybindings", "validatingadmissionpolicies")
TARGET_RATIO = 1.25
TARGET_MEAN_MS = 3.0
TARGET_CALLS_PER_HANDSHAKE = 20
ENTRIES = ("mutate.gpushare.io", "validate.gpushare.io")  # our fail-closed webhook entries, which GPU-share pods call


def _wait(what: str, check: Callable[[], bool], timeout: float, interval: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise TimeoutError(f"gave up waiting for {what} after {timeout:g} s")


def read(kubectl: Kubectl) -> Reading:
    text = kubectl.ok(["get", "--raw", "/metrics"], timeout=60)
    handshakes = reviews = 0.0
    pods = kubectl.json(["get", "pods", "-n", gpushare.NAMESPACE, "-l", "app.kubernetes.io/name=gpushare-webhook"])
    for pod in pods.get("items", []) if isinstance(pods, dict) else []:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            continue
        with urllib.request.urlopen(f"http://{ip}:9102/metrics", timeout=10) as answer:
            metrics = answer.read().decode()
        handshakes += counter(metrics, "gpushare_webhook_tls_handshakes_total", outcome="completed")
        reviews += counter(metrics, "gpushare_webhook_reviews_total")
    return Reading(sums(text, apiserver_series), handshakes, reviews)


def replicaset(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    container = {"name": "main", "image": "gpushare-bench/none:1", "resources": {"limits": {RESOURCE: "1"}}}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"nodeSelector": {"gpushare-bench": "no-such-node"},
                                           "containers": [container]}}}}


def burst(kubectl: Kubectl, size: int) -> Burst:
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    kubectl.ok(["create", "namespace", namespace])
    _wait("the namespace's default ServiceAccount",
          lambda: kubectl.run(["get", "serviceaccount", "default", "-n", namespace], timeout=10)[0] == 0, 60, 0.2)
    try:
        before = read(kubectl)
        kubectl.ok(["create", "-n", namespace, "-f", "-"], stdin=json.dumps(replicaset("burst", size)))

        def created() -> bool:
            rs = kubectl.json(["get", "replicaset", "burst", "-n", namespace])
            return bool(((rs.get("status") or {}).get("replicas") or 0) >= size)

        _wait(f"{size} pods created", created, 300, 0.5)
        time.sleep(1)  # the last calls' observations
        return delta(before, read(kubectl))
    finally:
        kubectl.run(["delete", "namespace", namespace, "--wait=false"])


def remove_admission(kubectl: Kubectl) -> None:
    for kind in ADMISSION_KINDS:
        kubectl.ok(["delete", kind, "-l", PART_OF, "--wait=true"])


def restore_admission(cluster: Cluster, values: str) -> None:
    install.helm(cluster, "upgrade", install.RELEASE, "charts/gpushare", "--namespace", install.RELEASE_NAMESPACE,
                 "-f", values, "--wait", "--timeout", "5m", timeout=360)
    install.certs_install(cluster)  # the recreated configurations' caBundle


def install_chart(cluster: Cluster) -> str:
    kubectl = cluster.kubectl()
    kubectl.ok(["label", "node", cluster.settings.node_name, install.GPU_NODE_LABEL, "--overwrite"])
    values = install.write_values(cluster, cluster.run / "bench" / "values.yaml", certificates="self-signed")
    install.helm(cluster, "install", install.RELEASE, "charts/gpushare", "--namespace", install.RELEASE_NAMESPACE,
                 "-f", str(values))
    install.certs_install(cluster)

    def ready() -> bool:
        pods = kubectl.json(["get", "pods", "-n", gpushare.NAMESPACE, "-l", "app.kubernetes.io/name=gpushare-webhook"])
        return sum(any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in (p.get("status") or {}).get("conditions") or []) for p in pods["items"]) == 2

    _wait("2 webhook pods Ready", ready, 300, 2)
    return str(values)


def _rounded(figures: dict[str, float]) -> str:
    return json.dumps({k: round(v, 2) for k, v in figures.items()})


def span(values: Iterable[float], unit: str = "", digits: int = 1) -> str:
    items = list(values)
    if not items:
        return "-"
    low, high = min(items), max(items)
    return f"{low:.{digits}f}{unit}" if low == high else f"{low:.{digits}f}-{high:.{digits}f}{unit}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_apiserver_tier", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bursts", default="30,300", help="comma-separated burst sizes")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.bursts.split(",")]
    missing = toolchain.check()
    if missing:
        print("bench_apiserver_tier skipped: " + "; ".join(missing), file=sys.stderr)
        return 3
    settings = from_environ()
    cluster = Cluster(settings, toolchain.ensure(settings))
    cluster.up(host_gpushare=False)
    results: list[dict[int, tuple[Burst, Burst]]] = []
    try:
        values = install_chart(cluster)
        kubectl = cluster.kubectl()
        for run in range(args.runs):
            figures: dict[int, tuple[Burst, Burst]] = {}
            with_ours = {size: burst(kubectl, size) for size in sizes}
            remove_admission(kubectl)
            without = {size: burst(kubectl, size) for size in sizes}
            restore_admission(cluster, values)
            for size in sizes:
                figures[size] = (with_ours[size], without[size])
                ours, bare = figures[size]
                print(f"run {run + 1}, burst {size}: POST pods {ours.mean_ms.get('POST pods', 0):.1f} ms with our "
                      f"admission, {bare.mean_ms.get('POST pods', 0):.1f} ms without; entries "
                      f"{_rounded({k: v for k, v in ours.mean_ms.items() if k in ENTRIES})}, "
                      f"calls {json.dumps({k: v for k, v in ours.calls.items() if k in ENTRIES})}; "
                      f"{ours.handshakes:.0f} TLS handshakes for {ours.reviews:.0f} reviews", flush=True)
                print(f"  admission plugins per pod, ms: with {_rounded(ours.per_pod_ms())}, "
                      f"without {_rounded(bare.per_pod_ms())}", flush=True)
            results.append(figures)
    finally:
        cluster.down()
    return report(results, sizes)


def report(results: list[dict[int, tuple[Burst, Burst]]], sizes: list[int]) -> int:
    missed: list[str] = []
    print(f"\n{len(results)} runs, min-max over the runs:")
    for size in sizes:
        pairs = [run[size] for run in results]
        ratios = [o.mean_ms["POST pods"] / b.mean_ms["POST pods"] for o, b in pairs
                  if o.mean_ms.get("POST pods") and b.mean_ms.get("POST pods")]
        with_ours = span([o.mean_ms.get("POST pods", 0) for o, _ in pairs], " ms")
        without = span([b.mean_ms.get("POST pods", 0) for _, b in pairs], " ms")
        print(f"  burst {size}: POST pods with our admission {with_ours}, without {without}, ratio "
              f"{span(ratios, '', 2)} (target ≤ {TARGET_RATIO})")
        if any(r > TARGET_RATIO for r in ratios):
            missed.append(f"POST pods ratio in the {size} burst")
        entries = sorted({k for o, _ in pairs for k in o.mean_ms
                          if k != "POST pods" and not k.startswith(PLUGIN)})
        for entry in entries:
            means = [o.mean_ms[entry] for o, _ in pairs if entry in o.mean_ms]
            print(f"    {entry}: mean {span(means, ' ms', 2)} (target ≤ {TARGET_MEAN_MS} ms)")
            if any(m > TARGET_MEAN_MS for m in means):
                missed.append(f"{entry} mean in the {size} burst")
        for label, side in (("with our admission", 0), ("without", 1)):
            shares = [pair[side].per_pod_ms() for pair in pairs]
            names = sorted({k for share in shares for k in share})
            parts = [f"{k} {span([share.get(k, 0.0) for share in shares], '', 2)}" for k in names]
            print(f"    admission plugins per pod {label}, ms: " + ("; ".join(parts) or "-"))
        per = [o.reviews / o.handshakes for o, _ in pairs if o.handshakes]
        print(f"    reviews per TLS handshake: {span(per, '', 1)} (target > {TARGET_CALLS_PER_HANDSHAKE}; "
              f"handshakes {span([o.handshakes for o, _ in pairs], '', 0)})")
        if any(p <= TARGET_CALLS_PER_HANDSHAKE for p in per):
            missed.append(f"handshakes in the {size} burst")
    print("targets missed: " + "; ".join(missed) if missed else "every target met")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
