"""Start the real gunicorn webhook over TLS on 127.0.0.1 for a test, and always stop it.

Usage (stable; the simulated cluster relies on it)::

    from tests.harness.webhook.server import webhook_server

    with webhook_server(tmp_path, {"GPUSHARE_DELIVERY": "cdi"}) as hook:
        status, answer = hook.post_json("/mutate", review)   # answer: the parsed AdmissionReview
        hook.url            # https://127.0.0.1:<port>
        hook.ca_path        # ca.crt: give it to the API server as caBundle / to a client as cafile
        hook.ca_pem         # the same bytes
        hook.ssl_context()  # a client context that trusts only that CA and checks the host name
        hook.private_key, hook.public_key, hook.public_key_path  # the Ed25519 intent-signing pair
        hook.cert_dir       # tls.crt, tls.key, ca.crt, ca.key, signing.key, signing.pub
        hook.rotate()       # new serving certificate files (same CA), written atomically; returns the cert
        hook.peer_certificate()  # the certificate a new connection is served
        hook.log_text()     # what gunicorn and the app logged
        hook.scrape()       # the text of /metrics (plain HTTP on hook.metrics_port, served by the arbiter)

`webhook_server(directory, env)` generates certificates into `directory` (a fresh tmp dir), starts
`python -m gunicorn -c gunicorn.conf.py` with `GPUSHARE_*` pointing at them plus `env`, waits until
`/readyz` answers 200 over verified TLS, and terminates the server (and its workers) on exit, even when
the body raises. Start-up failures raise RuntimeError with the server's log.
"""

from __future__ import annotations

import datetime
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from certs.build import DEV_HOSTS, Issued, build_serving_cert, dev_bundle
from certs.cli import write_files
from contract import signing

REPO = Path(__file__).resolve().parents[3]
HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class RunningWebhook:
    url: str
    port: int
    cert_dir: Path
    ca_path: Path
    ca_pem: bytes
    private_key: Ed25519PrivateKey
    public_key: Ed25519PublicKey
    public_key_path: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    metrics_port: int = 0

    def scrape(self, timeout: float = 10.0) -> str:
        conn = http.client.HTTPConnection(HOST, self.metrics_port, timeout=timeout)
        try:
            conn.request("GET", "/metrics")
            res = conn.getresponse()
            body = res.read().decode()
            if res.status != 200:
                raise AssertionError(f"GET /metrics answered {res.status}: {body}")
            return body
        finally:
            conn.close()

    def ssl_context(self) -> ssl.SSLContext:
        """What the API server does with caBundle: trust only the generated CA and check the name."""
        return ssl.create_default_context(cafile=str(self.ca_path))

    def request(self, method: str, path: str, body: bytes | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection(HOST, self.port, context=self.ssl_context(), timeout=timeout)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            res = conn.getresponse()
            return res.status, res.read()
        finally:
            conn.close()

    def post_json(self, path: str, doc: Mapping[str, Any]) -> tuple[int, Any]:
        status, raw = self.request("POST", path, json.dumps(doc).encode())
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def peer_certificate(self) -> x509.Certificate:
        """The serving certificate a new, verified connection receives."""
        with (
            socket.create_connection((HOST, self.port), timeout=10) as raw,
            self.ssl_context().wrap_socket(raw, server_hostname=HOST) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der)

    def rotate(self) -> x509.Certificate:
        """Replace tls.crt and tls.key with a new certificate from the same CA, each file atomically."""
        ca_key = serialization.load_pem_private_key((self.cert_dir / "ca.key").read_bytes(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        ca = Issued(ca_key, x509.load_pem_x509_certificate(self.ca_pem))
        fresh = build_serving_cert(ca, datetime.datetime.now(datetime.UTC), extra_hosts=DEV_HOSTS)
        write_files(self.cert_dir, {"tls.key": fresh.key_pem, "tls.crt": fresh.cert_pem})
        return fresh.cert

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()  # gunicorn: graceful stop of the workers
        try:
            process.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            pass
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=15)


def _wait_ready(hook: RunningWebhook, deadline: float) -> None:
    last = "no answer yet"
    while time.monotonic() < deadline:
        if hook.process.poll() is not None:
            raise RuntimeError(f"the webhook exited with {hook.process.returncode} during start-up:\n{hook.log_text()}")
        try:
            status, body = hook.request("GET", "/readyz", timeout=2)
            if status == 200:
                return
            last = f"{status} {body.decode(errors='replace').strip()}"
        except (OSError, http.client.HTTPException) as exc:
            last = repr(exc)
        time.sleep(0.05)
    raise RuntimeError(f"the webhook did not become ready ({last}):\n{hook.log_text()}")


@contextmanager
def webhook_server(
    directory: Path, env: Mapping[str, str] | None = None, *, startup_timeout: float = 30.0,
    gunicorn_args: Sequence[str] = (),
) -> Iterator[RunningWebhook]:
    """Generate certificates into `directory`, run gunicorn over TLS there, yield it, always stop it.

    `gunicorn_args` go after the configuration file (a benchmark's baseline: `-k gthread`)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_files(directory, dev_bundle(datetime.datetime.now(datetime.UTC)))
    port, metrics_port = free_port(), free_port()
    child_env = {k: v for k, v in os.environ.items()
                 if not k.startswith("GPUSHARE_") and k != "PROMETHEUS_MULTIPROC_DIR"}
    child_env.update({
        "GPUSHARE_BIND": f"{HOST}:{port}",
        "GPUSHARE_METRICS_BIND": f"{HOST}:{metrics_port}",
        "GPUSHARE_TLS_CERT": str(directory / "tls.crt"),
        "GPUSHARE_TLS_KEY": str(directory / "tls.key"),
        "GPUSHARE_SIGNING_KEY": str(directory / "signing.key"),
        "GPUSHARE_WORKERS": "1",
        "GPUSHARE_THREADS": "0",  # the deployed default: the app on the event loop (test_serve runs threads)
        "PYTHONUNBUFFERED": "1",
    })
    child_env.update(env or {})
    log_path = directory / "webhook.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(REPO / "gunicorn.conf.py"), *gunicorn_args],
            cwd=REPO, env=child_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        private_key = signing.load_private_key((directory / "signing.key").read_bytes(), "signing.key")
        hook = RunningWebhook(
            url=f"https://{HOST}:{port}",
            port=port,
            cert_dir=directory,
            ca_path=directory / "ca.crt",
            ca_pem=(directory / "ca.crt").read_bytes(),
            private_key=private_key,
            public_key=private_key.public_key(),
            public_key_path=directory / "signing.pub",
            log_path=log_path,
            process=process,
            metrics_port=metrics_port,
        )
        _wait_ready(hook, time.monotonic() + startup_timeout)
        yield hook
    finally:
        _stop(process)
