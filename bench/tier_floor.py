"""The Go floor on the tier: `apiclient floor` as a pod behind the webhook's Service for one burst
(bench/bench_apiserver_tier.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from e2e import gpushare, install
from e2e import settings as ports
from e2e.cluster import Cluster
from e2e.kube import Kubectl

IMAGE = "gpushare-bench/apiclient:1"  # made by the tier's registry from the binary (Cluster.extra_binary_images)
NAME = "gpushare-bench-floor"
WEBHOOK = "gpushare-webhook"  # the Service, the Deployment and its pods' app.kubernetes.io/name
# Not app.kubernetes.io/name=gpushare-webhook: the Deployment's ReplicaSet would adopt the pod as one too many and
# delete one. No NetworkPolicy of the chart selects this label (manifests/base/network-policy.yaml selects the
# webhook's and the device plugin's pods), so the floor admits the API server without one.
LABELS = {"app.kubernetes.io/name": NAME}
MOUNT = "/etc/gpushare"


def manifests(image: str, patch: bytes) -> list[dict[str, Any]]:
    """A ConfigMap with the patch and the floor's pod: the webhook's serving Secret (its certificate names the
    Service, which the API server checks), the webhook's port name (the Service's targetPort is `https`) and one
    webhook pod's resources (charts/gpushare/values.yaml, webhook.resources)."""
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": NAME, "namespace": gpushare.NAMESPACE, "labels": LABELS},
                 "data": {"patch.json": patch.decode()}}
    container = {
        "name": "floor", "image": image, "imagePullPolicy": "IfNotPresent",
        "command": ["/usr/bin/apiclient", "floor", "-listen", "0.0.0.0:8443", "-cert", f"{MOUNT}/tls/tls.crt",
                    "-key", f"{MOUNT}/tls/tls.key", "-patch", f"{MOUNT}/floor/patch.json"],
        "ports": [{"name": "https", "containerPort": 8443, "protocol": "TCP"}],
        # floor.go serves only POST /mutate and /validate: a TCP probe, as it listens once its files are read.
        "readinessProbe": {"tcpSocket": {"port": "https"}, "periodSeconds": 1},
        "resources": {"limits": {"cpu": "1", "memory": "384Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "readOnlyRootFilesystem": True},
        "volumeMounts": [{"name": "tls", "mountPath": f"{MOUNT}/tls", "readOnly": True},
                         {"name": "floor", "mountPath": f"{MOUNT}/floor", "readOnly": True}],
    }
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": NAME, "namespace": gpushare.NAMESPACE, "labels": LABELS},
           "spec": {"automountServiceAccountToken": False, "containers": [container],
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                        "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                    "volumes": [{"name": "tls", "secret": {"secretName": "gpushare-webhook-tls", "defaultMode": 0o440}},
                                {"name": "floor", "configMap": {"name": NAME}}]}}
    return [configmap, pod]


def ready_endpoints(slices: dict[str, Any]) -> set[str]:
    """The pods a Service's EndpointSlices list as ready."""
    return {endpoint["targetRef"]["name"] for item in slices.get("items") or []
            for endpoint in item.get("endpoints") or []
            if (endpoint.get("conditions") or {}).get("ready") and endpoint.get("targetRef")}


def wait_until(what: str, check: Callable[[], bool], timeout: float = 180, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout:g} s")
        time.sleep(interval)


def _endpoints(kubectl: Kubectl) -> set[str]:
    return ready_endpoints(kubectl.json(["get", "endpointslices", "-n", gpushare.NAMESPACE,
                                         "-l", f"kubernetes.io/service-name={WEBHOOK}"]))


def _webhook_pods(kubectl: Kubectl) -> list[dict[str, Any]]:
    pods = kubectl.json(["get", "pods", "-n", gpushare.NAMESPACE, "-l", f"app.kubernetes.io/name={WEBHOOK}"])
    return list(pods["items"])


def _webhook_serves(kubectl: Kubectl, replicas: int) -> bool:
    endpoints = _endpoints(kubectl)
    return len(endpoints) == replicas and endpoints == {p["metadata"]["name"] for p in _webhook_pods(kubectl)}


def _select(kubectl: Kubectl, selector: dict[str, str]) -> None:
    kubectl.ok(["patch", "service", WEBHOOK, "-n", gpushare.NAMESPACE, "--type=json",
                "-p", json.dumps([{"op": "replace", "path": "/spec/selector", "value": selector}])])


def _scale(kubectl: Kubectl, replicas: int) -> None:
    kubectl.ok(["scale", "deployment", WEBHOOK, "-n", gpushare.NAMESPACE, f"--replicas={replicas}"])


@contextmanager
def serving(cluster: Cluster, patch: bytes) -> Iterator[None]:
    """The webhook's Service in front of the floor while the block runs, then in front of the webhook's pods again.

    The webhook's pods are scaled to none meanwhile: the API server keeps its idle connections to a Service's pods
    (the webhook keeps them 120 s: gunicorn.conf.py, keepalive), and a connection already made goes on to the pod it
    reached after the Service's selector changed (kube-proxy's rules pick a pod for a new connection only), so only
    closing them makes every call of the burst reach the floor. The floor's pod is deleted after, for the same
    reason, once the webhook's pods serve again."""
    kubectl = cluster.kubectl()
    image = f"127.0.0.1:{cluster.settings.port(ports.REGISTRY)}/{IMAGE}"
    kubectl.ok(["apply", "-f", "-"], stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                       "items": manifests(image, patch)}))
    kubectl.ok(["wait", "--for=condition=Ready", f"pod/{NAME}", "-n", gpushare.NAMESPACE, "--timeout=180s"],
               timeout=200)
    replicas = int(kubectl.json(["get", "deployment", WEBHOOK, "-n", gpushare.NAMESPACE])["spec"]["replicas"])
    selector = dict(kubectl.json(["get", "service", WEBHOOK, "-n", gpushare.NAMESPACE])["spec"]["selector"])
    try:
        _select(kubectl, LABELS)
        _scale(kubectl, 0)
        wait_until("the webhook's pods gone", lambda: not _webhook_pods(kubectl))
        wait_until("the floor as the Service's one endpoint", lambda: _endpoints(kubectl) == {NAME})
        install.wait_serving(cluster)  # kube-proxy's rules follow the endpoints a moment later
        yield
    finally:
        _select(kubectl, selector)
        _scale(kubectl, replicas)
        wait_until(f"{replicas} webhook pods as the Service's endpoints", lambda: _webhook_serves(kubectl, replicas))
        kubectl.ok(["delete", "pod,configmap", "-n", gpushare.NAMESPACE, "-l", f"app.kubernetes.io/name={NAME}",
                    "--wait=true"], timeout=120)
        install.wait_serving(cluster)
