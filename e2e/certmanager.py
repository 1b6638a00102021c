"""Upstream cert-manager on the real cluster, installed from its own release files.

The namespace, CRDs, ServiceAccounts, RBAC and webhook configurations are the release's chart rendered as its
static install manifest (cert-manager.yaml) is made. The controller, cainjector and webhook run as host
processes, each with a bound token of its own ServiceAccount, so every write they make is authorised by the
release's RBAC. Two swaps, as for gpushare itself: Deployments and Services are not applied (nothing routes
Service addresses here), and the webhook configurations point at 127.0.0.1 with the tier's CA, the webhook
serving a certificate from the tier's CA through the release's `tlsConfig.filesystem` mode instead of its
self-managed CA Secret.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from e2e import gpushare, procs
from e2e import settings as ports
from e2e.kube import Kubectl
from e2e.pki import Pair, kubeconfig

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "cert-manager"
RELEASE = "cert-manager"
# component -> the release's ServiceAccount it runs as (deploy/charts/cert-manager/templates/*serviceaccount.yaml)
COMPONENTS = {"controller": "cert-manager", "cainjector": "cert-manager-cainjector",
              "webhook": "cert-manager-webhook"}
HOST_RUN_KINDS = {"Deployment", "Service", "Job", "PodDisruptionBudget", "Pod"}
INJECT_FROM_SECRET = "cert-manager.io/inject-ca-from-secret"


def helm_binary() -> Path:
    """The helm client the repository builds once from its Go module (charts/build-helm.sh), or GPUSHARE_HELM."""
    given = os.environ.get("GPUSHARE_HELM")
    if given and Path(given).is_file():
        return Path(given)
    done = subprocess.run([str(REPO / "charts" / "build-helm.sh")], capture_output=True, text=True, timeout=1800,
                          check=False)
    if done.returncode != 0:
        raise procs.StartError(f"charts/build-helm.sh failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def render(helm: Path, release_dir: Path) -> list[dict[str, Any]]:
    """The release's install objects, made as its static cert-manager.yaml is (make/manifests.mk: `helm template`
    of its chart with crds.enabled, creator=static and no startupapicheck), plus its namespace."""
    deploy = release_dir / "deploy"
    argv = [str(helm), "template", RELEASE, str(deploy / "charts" / "cert-manager"), "--namespace", NAMESPACE,
            "--set", "crds.enabled=true", "--set", "creator=static", "--set", "startupapicheck.enabled=false"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise procs.StartError(f"helm template of the cert-manager chart failed: {done.stderr.strip()}")
    namespace = yaml.safe_load((deploy / "manifests" / "namespace.yaml").read_text())
    return [namespace, *(doc for doc in yaml.safe_load_all(done.stdout) if doc)]


def for_cluster(docs: list[dict[str, Any]], webhook_port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """What the tier applies: everything but the workloads, with the webhook reached on 127.0.0.1."""
    out = []
    for doc in docs:
        if doc.get("kind") in HOST_RUN_KINDS:
            continue
        if doc.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            (doc["metadata"].get("annotations") or {}).pop(INJECT_FROM_SECRET, None)
            for hook in doc.get("webhooks") or []:
                service = hook["clientConfig"].pop("service")
                hook["clientConfig"]["url"] = f"https://127.0.0.1:{webhook_port}{service.get('path', '/')}"
                hook["clientConfig"]["caBundle"] = base64.b64encode(ca_pem).decode()
        out.append(doc)
    return out


class CertManager:
    """cert-manager's three components against the tier's API server; `start()` returns once its API answers."""

    def __init__(self, *, kubectl: Kubectl, processes: procs.Processes, settings: ports.E2eSettings,
                 release_dir: Path, server: str, ca: Path, serving: Pair, conf: Path) -> None:
        self.kubectl = kubectl
        self.procs = processes
        self.settings = settings
        self.release_dir = release_dir
        self.server = server
        self.ca = ca
        self.serving = serving
        self.conf = conf

    def start(self) -> None:
        docs = render(helm_binary(), self.release_dir)
        port = self.settings.port(ports.CERT_MANAGER_WEBHOOK)
        gpushare.apply(self.kubectl, for_cluster(docs, port, self.ca.read_bytes()))
        crds = [d["metadata"]["name"] for d in docs if d.get("kind") == "CustomResourceDefinition"]
        self.kubectl.ok(["wait", "--for=condition=Established", "--timeout=60s",
                         *[f"crd/{name}" for name in crds]])
        binary = str(self.release_dir / "cert-manager")
        for component, account in COMPONENTS.items():
            config = kubeconfig(self.conf / f"cert-manager-{component}.kubeconfig", self.server, self.ca,
                                token=gpushare.token(self.kubectl, NAMESPACE, account), user=account)
            argv = [binary, component, "--kubeconfig", str(config), "--v", "2"]
            if component == "webhook":
                argv += ["--secure-port", str(port),
                         "--healthz-port", str(self.settings.port(ports.CERT_MANAGER_WEBHOOK_HEALTHZ)),
                         "--tls-cert-file", str(self.serving.cert), "--tls-private-key-file", str(self.serving.key)]
            self.procs.start(f"cert-manager-{component}", argv)
        # What the release's startupapicheck Job does (cmctl check api): a server-side dry-run create of a
        # Certificate, which passes only once cert-manager's webhook answers the API server.
        self.procs.wait_ready("cert-manager-webhook", self._api_answers, 90,
                              "admitting a dry-run Certificate through the API server")

    def _api_answers(self) -> bool:
        probe = {"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
                 "metadata": {"name": "startup-api-check", "namespace": NAMESPACE},
                 "spec": {"secretName": "startup-api-check", "dnsNames": ["startup-api-check.example"],
                          "issuerRef": {"name": "startup-api-check"}}}
        code, _, _ = self.kubectl.run(["create", "--dry-run=server", "-f", "-"], stdin=yaml.safe_dump(probe),
                                      timeout=15)
        return code == 0


if __name__ == "__main__":  # pragma: no cover - a helper for reading the rendered install by hand
    print(yaml.safe_dump_all(render(helm_binary(), Path(sys.argv[1]))))
