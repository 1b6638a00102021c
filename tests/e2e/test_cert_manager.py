"""The cert-manager install on the real cluster, with upstream cert-manager issuing and injecting.

`kubectl apply -k manifests/cert-manager` as docs/deploy.md says (with the tier's swaps: the webhook and plugin run
on the host, the API server reaches the webhook on 127.0.0.1, and the signing-key Job's command runs on the host
with the Job's ServiceAccount), then pods created in a loop through the API server while cert-manager renews the
serving certificate, and while it replaces the issuing CA: not one admission may fail, and the webhook serves
the new certificate without a restart.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from contract import Contract
from e2e import gpushare
from e2e import settings as ports
from e2e.cluster import Cluster
from e2e.kube import Kubectl, KubeError, Rest
from e2e.pki import kubeconfig
from tests.harness.realtier import workloads

# GPU-share pods here are placed by the reference scheduler extender (skipped, with the reason, without it).
pytestmark = pytest.mark.usefixtures("needs_extender")

INTENT_KEY = Contract().intent_key

NS = gpushare.NAMESPACE
SERVING = "gpushare-webhook"  # the serving Certificate, its Secret is gpushare-webhook-tls
ISSUING_CA = "gpushare-ca"
CONFIGS = ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
LOAD_LABEL = "gpushare-e2e"
# What `gpushare-certs install` made for the self-signed install this cluster started with; a cluster that
# never had gpushare has none of them.
SELF_SIGNED_STATE = (("secret", "gpushare-webhook-tls"), ("secret", "gpushare-webhook-ca"),
                     ("secret", "gpushare-signing-key"), ("configmap", "gpushare-verify-key"))


def overlay(cluster: Cluster) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rendered overlay as the tier applies it, and the signing-key Job it runs on the host."""
    docs = gpushare.for_cluster(gpushare.render(cluster.kubectl(), "cert-manager", cluster.components),
                                cluster.settings.port(ports.WEBHOOK))
    job = next(d for d in docs if d["kind"] == "Job")
    applied = [d for d in docs if d["kind"] != "Job"]
    for doc in applied:
        if doc["kind"] == "Certificate" and doc["metadata"]["name"] == SERVING:
            doc["spec"]["ipAddresses"] = ["127.0.0.1"]  # the API server calls https://127.0.0.1:<port>
    return applied, job


def run_signing_key_job(cluster: Cluster, job: dict[str, Any]) -> None:
    """The Job's container command, with its ServiceAccount's token instead of the in-cluster one."""
    spec = job["spec"]["template"]["spec"]
    account = spec["serviceAccountName"]
    command = list(spec["containers"][0]["command"])
    assert command[0] == "gpushare-certs" and "--in-cluster" in command, command
    config = kubeconfig(cluster.conf / f"{account}.kubeconfig", cluster.server, cluster.pki_dir / "ca.crt",
                        token=gpushare.token(cluster.kubectl(), NS, account), user=account)
    argv = [str(Path(sys.executable).parent / command[0]),
            *[a for a in command[1:] if a != "--in-cluster"], "--kubeconfig", str(config)]
    proc = cluster.procs.start("signing-key-job", argv)
    workloads.wait("the signing-key Job's command to finish", lambda: not proc.alive(), 60)
    assert proc.process.returncode == 0, cluster.log("signing-key-job").read_text()[-2000:]


def secret(kubectl: Kubectl, name: str) -> dict[str, bytes]:
    obj = kubectl.json(["get", "secret", name, "-n", NS])
    return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


def ca_bundles(kubectl: Kubectl) -> set[bytes]:
    out = set()
    for kind in CONFIGS:
        for hook in kubectl.json(["get", kind, "gpushare-webhook"])["webhooks"]:
            out.add(base64.b64decode(hook["clientConfig"].get("caBundle", "")))
    return out


def served(port: int) -> x509.Certificate:
    """The certificate the webhook presents now (chain not verified: this only reads which one it is)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def leaf(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificates(pem)[0]


def condition(kubectl: Kubectl, name: str, kind: str) -> str:
    for c in (kubectl.json(["get", "certificate", name, "-n", NS]).get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return str(c["status"])
    return ""


def renew(kubectl: Kubectl, name: str) -> None:
    """What `cmctl renew` does: the Issuing condition with reason ManuallyTriggered on the Certificate."""
    issuing = {"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
               "message": "Certificate re-issuance manually triggered by the real-cluster tier"}
    patch = [{"op": "add", "path": "/status/conditions/-", "value": issuing}]
    kubectl.ok(["patch", "certificate", name, "-n", NS, "--subresource=status", "--type=json",
                "-p", json.dumps(patch)])


@dataclass
class Load:
    """GPU-share pods created one after another through the API server, as the ordinary user."""

    rest: Rest
    namespace: str
    stop: threading.Event = field(default_factory=threading.Event)
    created: int = 0
    failed: list[str] = field(default_factory=list)

    def body(self) -> dict[str, Any]:
        p = workloads.pod(f"load-{uuid.uuid4().hex[:8]}", [workloads.container("main", "busybox", 2)],
                          labels={LOAD_LABEL: "load"})
        # Admitted and stored, never scheduled: the test is about admission, and the node's GPUs stay free.
        p["spec"]["schedulingGates"] = [{"name": "gpushare.io/e2e-admission-only"}]
        return p

    def run(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        while not self.stop.is_set():
            try:
                made = self.rest.call("POST", path, self.body())
                if INTENT_KEY not in (made["metadata"].get("annotations") or {}):
                    self.failed.append(f"{made['metadata']['name']} was admitted without an intent")
                self.created += 1
            except (KubeError, OSError) as exc:
                self.failed.append(str(exc))

    def __enter__(self) -> Load:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def delete_load(cluster: Cluster, namespace: str) -> None:
    """One delete-collection call for every load pod (hundreds: a pod-by-pod delete would take minutes)."""
    admin = Rest(cluster.server, cluster.pki_dir / "ca.crt",
                 client=(cluster.pki_dir / "admin.crt", cluster.pki_dir / "admin.key"), timeout=120)
    admin.call("DELETE", f"/api/v1/namespaces/{namespace}/pods?labelSelector={LOAD_LABEL}%3Dload")


@pytest.fixture(scope="module")
def cert_managed(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster with upstream cert-manager running and gpushare installed from the cert-manager overlay."""
    kubectl = cluster.kubectl()
    cluster.cert_manager().start()
    for kind, name in SELF_SIGNED_STATE:
        kubectl.ok(["delete", kind, name, "-n", NS, "--ignore-not-found"])
    applied, job = overlay(cluster)
    gpushare.apply(kubectl, applied)
    run_signing_key_job(cluster, job)
    # docs/deploy.md's wait: the serving Certificate Ready (the webhook Deployment's pods start once its Secret exists).
    kubectl.ok(["wait", "--for=condition=Ready", f"certificate/{SERVING}", "-n", NS, "--timeout=120s"], timeout=130)
    # The Deployment's and DaemonSet's pods would now start with the new Secret and ConfigMap mounted.
    cluster.stop_webhook()
    cluster.procs.stop("device-plugin")
    cluster.start_webhook()
    cluster.start_plugin()
    root = secret(kubectl, "gpushare-webhook-tls")["ca.crt"]
    # cainjector merges into the caBundle it finds (CAInjectorMerging, GA in 1.21), so the self-signed install's
    # CA would stay trusted until it expires; the move drops it as docs/deploy.md says, and cainjector re-injects.
    workloads.wait("cainjector to add the root CA to both webhook configurations",
                   lambda: all(root in bundle for bundle in ca_bundles(kubectl)), 60)
    for kind in CONFIGS:
        count = len(kubectl.json(["get", kind, "gpushare-webhook"])["webhooks"])
        drop = [{"op": "remove", "path": f"/webhooks/{i}/clientConfig/caBundle"} for i in range(count)]
        kubectl.ok(["patch", kind, "gpushare-webhook", "--type=json", "-p", json.dumps(drop)])
    workloads.wait("cainjector to inject the root CA alone", lambda: ca_bundles(kubectl) == {root}, 60)
    yield cluster


@pytest.fixture
def tenant_rest(cluster: Cluster) -> Rest:
    return Rest(cluster.server, cluster.pki_dir / "ca.crt",
                client=(cluster.pki_dir / "tenant.crt", cluster.pki_dir / "tenant.key"))


def test_overlay_installed_by_cert_manager_stamps_and_runs_gpu_pods(cert_managed: Cluster, namespace: str) -> None:
    kubectl = cert_managed.kubectl()
    tls = secret(kubectl, "gpushare-webhook-tls")
    chain = x509.load_pem_x509_certificates(tls["tls.crt"])
    root = x509.load_pem_x509_certificate(tls["ca.crt"])
    issuing = x509.load_pem_x509_certificate(secret(kubectl, "gpushare-webhook-ca")["tls.crt"])
    # The serving Secret carries the issuing CA in its chain, and the root (what cainjector injects) as ca.crt.
    assert [c.issuer for c in chain] == [issuing.subject, root.subject]
    assert served(cert_managed.settings.port(ports.WEBHOOK)).serial_number == chain[0].serial_number
    assert secret(kubectl, "gpushare-signing-key") and kubectl.json(["get", "configmap", "gpushare-verify-key",
                                                                     "-n", NS])["data"]

    tenant = cert_managed.kubectl(as_tenant=True)
    img = workloads.image(cert_managed)
    code, out = workloads.create(tenant, namespace, workloads.pod("cm-gpu", [workloads.container("main", img, 4)]))
    assert code == 0, out
    (running,) = workloads.wait_running(kubectl, namespace, 1, 180)
    annotations = workloads.annotations_of(running)
    assert INTENT_KEY in annotations
    assert workloads.assigned_index(running) is not None


def test_the_signing_key_jobs_identity_creates_nothing_but_the_key_pair(cert_managed: Cluster) -> None:
    """Its Role may create any Secret or ConfigMap of the namespace and outlives the Job; the overlay's policy refuses
    every create but the key pair's, a ServiceAccount token Secret for another identity above all (the Job itself
    made the pair through the same policy, in the fixture)."""
    account = "gpushare-certs"
    job = Rest(cert_managed.server, cert_managed.pki_dir / "ca.crt",
               token=gpushare.token(cert_managed.kubectl(), NS, account))
    token_secret = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
                    "metadata": {"name": "gpushare-e2e-minted",
                                 "annotations": {"kubernetes.io/service-account.name": gpushare.PLUGIN_SA[1]}}}
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpushare-e2e-other"}, "data": {}}
    for plural, body, what in (("secrets", token_secret,
                                "Secret gpushare-e2e-minted of type kubernetes.io/service-account-token"),
                               ("configmaps", other, "ConfigMap gpushare-e2e-other")):
        with pytest.raises(KubeError) as caught:
            job.call("POST", f"/api/v1/namespaces/{NS}/{plural}", body)
        assert caught.value.status == 403, caught.value
        refusal = ("may create only Secret gpushare-signing-key (type Opaque) and ConfigMap gpushare-verify-key, "
                   f"not {what}.")
        assert refusal in caught.value.message, caught.value
    assert cert_managed.kubectl().run(["get", "secret", "gpushare-e2e-minted", "-n", NS])[0] != 0


@pytest.mark.parametrize("rotated", [SERVING, ISSUING_CA])
def test_rotation_under_load_fails_no_admission(cert_managed: Cluster, namespace: str, tenant_rest: Rest,
                                                rotated: str) -> None:
    kubectl, port = cert_managed.kubectl(), cert_managed.settings.port(ports.WEBHOOK)
    webhook_pid = cert_managed.procs.procs["webhook"].pid
    before = served(port)
    bundles = ca_bundles(kubectl)
    issuing_before = secret(kubectl, "gpushare-webhook-ca")["tls.crt"]
    try:
        with Load(tenant_rest, namespace) as load:
            workloads.wait("pods to be created", lambda: load.created >= 5, 60, 0.2)
            renew(kubectl, rotated)
            if rotated == ISSUING_CA:
                workloads.wait("the new issuing CA", lambda: secret(kubectl, "gpushare-webhook-ca")["tls.crt"]
                               != issuing_before, 120)
                # Serving certificates are not re-issued when their issuer changes; the next renewal uses the new CA.
                renew(kubectl, SERVING)
            workloads.wait("the webhook to serve the renewed certificate",
                           lambda: served(port).serial_number != before.serial_number, 180)
            created_at_switch = load.created
            workloads.wait("more pods after the switch", lambda: load.created >= created_at_switch + 30, 120, 0.2)
    finally:
        delete_load(cert_managed, namespace)
    after = served(port)
    tls = secret(kubectl, "gpushare-webhook-tls")
    print(f"\nrotation of {rotated}: {load.created} pods created, {len(load.failed)} failed admissions; "
          f"served serial {before.serial_number:x} -> {after.serial_number:x}")
    assert load.failed == []
    assert after.serial_number == leaf(tls["tls.crt"]).serial_number
    assert cert_managed.procs.procs["webhook"].pid == webhook_pid  # picked up without a restart
    assert ca_bundles(kubectl) == bundles  # the trust anchor did not change
    if rotated == ISSUING_CA:
        new_issuing = x509.load_pem_x509_certificate(secret(kubectl, "gpushare-webhook-ca")["tls.crt"])
        after.verify_directly_issued_by(new_issuing)
        assert new_issuing.public_key() != x509.load_pem_x509_certificate(issuing_before).public_key()
