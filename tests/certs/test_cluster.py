"""gpushare-certs against the simulated API server: install, rotation while the real webhook serves, errors."""

from __future__ import annotations

import base64
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from cryptography import x509

from certs.cli import main, write_files
from certs.plan import CA_SECRET, SIGNING_SECRET, TLS_SECRET, VERIFY_CONFIGMAP
from tests.harness.apiserver import auth as sim_auth
from tests.harness.apiserver import server as sim
from tests.harness.apiserver import status as sim_status
from tests.harness.manifests import rbac, render
from tests.harness.manifests.render import MANIFESTS
from tests.harness.webhook import server as webhook_support

pytestmark = pytest.mark.timeout(120)

NS = "gpushare-system"
MUTATING = "mutatingwebhookconfigurations.admissionregistration.k8s.io"
VALIDATING = "validatingwebhookconfigurations.admissionregistration.k8s.io"
GPU_POD = {"containers": [{"name": "cuda", "image": "cuda:12", "resources": {"limits": {"aliyun.com/gpu-mem": "2"}}}]}


def configurations() -> list[dict[str, Any]]:
    """The self-signed overlay's webhook configurations (read from the base: the overlay adds nothing to them)."""
    import yaml

    docs = yaml.safe_load_all((MANIFESTS / "base" / "admission.yaml").read_text())
    return [d for d in docs if d]


def secret(api: Any, name: str) -> dict[str, bytes]:
    data = api.object("secrets", NS, name).get("data") or {}
    return {k: base64.b64decode(v) for k, v in data.items()}


def ca_bundle(api: Any, key: str) -> list[x509.Certificate]:
    raw = api.object(key, "", "gpushare-webhook")["webhooks"][0]["clientConfig"].get("caBundle", "")
    return x509.load_pem_x509_certificates(base64.b64decode(raw)) if raw else []


def wait_for(condition: Any, what: str, timeout: float = 30.0) -> None:
    """Poll until `condition()` holds; a deadline that passes means the system never got there (not a timing check)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


def served_certificate(port: int) -> x509.Certificate:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


class Background(threading.Thread):
    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.stopped = threading.Event()


B = TypeVar("B", bound=Background)


class Kubelet(Background):
    """Copies Secret gpushare-webhook-tls into the webhook's certificate files whenever it changes (the kubelet's
    Secret volume refresh, without its minute of delay)."""

    def __init__(self, api: Any, directory: Path) -> None:
        super().__init__("secret-volume-sync")
        self.api, self.directory = api, directory
        self.paused = threading.Event()

    def run(self) -> None:
        last: dict[str, bytes] = {}
        while not self.stopped.wait(0.02):
            if self.paused.is_set():
                continue
            data = secret(self.api, TLS_SECRET)
            if data != last:
                write_files(self.directory, {"tls.key": data["tls.key"], "tls.crt": data["tls.crt"]})
                last = data


class Load(Background):
    """Creates GPU-share pods one after another through the API server, recording every refusal."""

    def __init__(self, api: Any) -> None:
        super().__init__("pod-load")
        self.client = api.client()
        self.admitted = 0
        self.failures: list[str] = []

    def run(self) -> None:
        index = 0
        while not self.stopped.is_set():
            index += 1
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"load-{index}"}, "spec": GPU_POD}
            try:
                created = self.client.create_pod("default", pod)
            except sim_status.ApiError as exc:
                self.failures.append(str(exc))
                continue
            if "gpushare.io/intent" not in (created["metadata"].get("annotations") or {}):
                self.failures.append(f"pod {created['metadata']['name']} was admitted without its intent")
                continue
            self.admitted += 1

    def admit_more(self, count: int) -> None:
        target = self.admitted + count
        wait_for(lambda: self.admitted >= target or bool(self.failures), f"{count} more admitted pods")


@contextmanager
def running(thread: B) -> Iterator[B]:
    thread.start()
    try:
        yield thread
    finally:
        thread.stopped.set()
        thread.join(timeout=30)


def test_install_then_rotate_while_the_webhook_serves(tmp_path: Path) -> None:
    with sim.ApiServer() as api:
        api.load_webhook_configurations(configurations())
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        assert main(["install", "--kubeconfig", kubeconfig]) == 0
        ca = x509.load_pem_x509_certificate(secret(api, CA_SECRET)["ca.crt"])
        assert ca_bundle(api, MUTATING) == ca_bundle(api, VALIDATING) == [ca]
        assert set(secret(api, SIGNING_SECRET)) == {"signing.key"}
        assert "signing.pub" in api.object("configmaps", NS, VERIFY_CONFIGMAP)["data"]

        with webhook_support.webhook_server(tmp_path / "hook") as hook:
            api.add_service(NS, "gpushare-webhook", 443, hook.url)
            # The webhook still serves its own development certificate: the API server must refuse to trust it.
            with pytest.raises(sim_status.ApiError, match="certificate"):
                api.client().create_pod("default", {"metadata": {"name": "untrusted"}, "spec": GPU_POD})
            with running(Kubelet(api, hook.cert_dir)) as kubelet:
                wait_for(lambda: issued(served_certificate(hook.port), ca), "the webhook to serve the installed cert")
                load = rotate_under_load(api, hook, kubelet, kubeconfig, ca)
            assert load.failures == [], "an admission request failed during the rotation"
            assert load.admitted >= 15


def rotate_under_load(api: Any, hook: Any, kubelet: Kubelet, kubeconfig: str, ca: x509.Certificate) -> Load:
    with running(Load(api)) as load:
        load.admit_more(3)

        # Same CA: the caBundle does not change; the replica switches when its files change.
        before = served_certificate(hook.port).serial_number
        assert main(["rotate", "--kubeconfig", kubeconfig]) == 0
        wait_for(lambda: served_certificate(hook.port).serial_number != before, "the rotated certificate")
        load.admit_more(3)

        # New CA with an overlap: the volume update is held back until the CLI waits for it, as a slow kubelet
        # would, so the old certificate is still served while both CAs are trusted.
        kubelet.paused.set()

        def settle(what: str, seconds: float) -> None:
            del seconds
            if "every webhook replica" in what:
                assert len(ca_bundle(api, VALIDATING)) == 2
                load.admit_more(3)  # old certificate, bundle of two
                kubelet.paused.clear()
                pending = x509.load_pem_x509_certificate(secret(api, CA_SECRET)["next-ca.crt"])
                wait_for(lambda: issued(served_certificate(hook.port), pending), "the new CA's certificate")
                load.admit_more(3)  # new certificate, bundle of two

        assert run_with_settle(["rotate", "--new-ca", "--kubeconfig", kubeconfig], settle) == 0
        new_ca = x509.load_pem_x509_certificate(secret(api, CA_SECRET)["ca.crt"])
        assert new_ca != ca and "next-ca.crt" not in secret(api, CA_SECRET)
        assert ca_bundle(api, MUTATING) == ca_bundle(api, VALIDATING) == [new_ca]
        load.admit_more(3)  # new certificate, bundle of one
    return load


def issued(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except Exception:
        return False
    return True


def run_with_settle(argv: list[str], settle: Any) -> int:
    """gpushare-certs with the overlap waits replaced by `settle` (the CLI would sleep instead)."""
    from certs.cli import build_parser

    args = build_parser().parse_args(argv)
    args.settle = settle
    return int(args.command(args))


def deny_secret_writes(who: Any, verb: str, res: Any, *where: str) -> str | None:
    del where
    if res.plural == "secrets" and verb == "create" and who.username == "alice":
        return 'secrets is forbidden: User "alice" cannot create resource "secrets" in namespace "gpushare-system"'
    return None


def install_exit_code(tmp_path: Path, case: str) -> int:
    if case == "no kubeconfig":
        return main(["install", "--kubeconfig", str(tmp_path / "missing")])
    with sim.ApiServer(authorize=deny_secret_writes) as api:
        api.load_webhook_configurations(configurations())
        token = {"unauthorized": "no-such-token", "forbidden": api.add_user(sim_auth.user("alice"))}.get(case)
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig", token))
        if case != "unreachable":
            return main(["install", "--kubeconfig", kubeconfig])
    return main(["install", "--kubeconfig", kubeconfig])  # the server is gone now


@pytest.mark.parametrize(
    ("case", "expected", "code"),
    [
        ("unauthorized", "rejected the credentials (401 Unauthorized)", 1),
        ("forbidden", "permission denied (403 Forbidden", 1),
        ("unreachable", "did not answer", 1),
        ("no kubeconfig", "Could not load cluster credentials", 2),  # no credentials: a start-up failure
    ],
)
def test_clear_messages_when_the_cluster_or_a_permission_is_missing(
    tmp_path: Path, case: str, expected: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert install_exit_code(tmp_path, case) == code
    err = capsys.readouterr().err
    assert expected in err
    assert err.strip().endswith(".") and "Traceback" not in err


def test_the_signing_key_job_works_with_exactly_its_role(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rendered = render.render("cert-manager")
    job = next(o for o in rendered if o["kind"] == "Job")
    argv = job["spec"]["template"]["spec"]["containers"][0]["command"][1:]
    from certs.cli import build_parser

    args = build_parser().parse_args(argv)
    assert args.subcommand == "signing-key" and args.in_cluster and args.namespace == NS
    with sim.ApiServer(authorize=rbac.authorizer(rendered)) as api:
        token = api.add_user(sim_auth.service_account(NS, "gpushare-certs"))
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig", token))
        as_job = ["signing-key", "--namespace", NS, "--kubeconfig", kubeconfig]
        assert main(as_job) == 0
        assert main(as_job) == 0  # a second run only reads
        assert set(secret(api, SIGNING_SECRET)) == {"signing.key"}
        capsys.readouterr()
        # Its Role is for the signing key alone: a full install is refused, and says why.
        assert main(["install", "--kubeconfig", kubeconfig]) == 1
        assert "403 Forbidden" in capsys.readouterr().err
