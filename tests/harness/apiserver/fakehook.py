"""A scriptable admission webhook over HTTPS for the admission-chain tests, plus configuration builders."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.harness.tls import Authority, CertPair, server_context, service_names

Obj = dict[str, Any]
Responder = Callable[[str, Obj], Any]  # (path, request) -> the whole body to send back (usually a review)

POD_RULE: Obj = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"],
                 "scope": "Namespaced"}


def review(request: Obj, allowed: bool = True, *, patch: list[Obj] | None = None, status: Obj | None = None,
           warnings: list[str] | None = None) -> Obj:
    response: Obj = {"uid": request["uid"], "allowed": allowed}
    if patch is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if status is not None:
        response["status"] = status
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def allow_all(path: str, request: Obj) -> Obj:
    return review(request)


class FakeWebhook:
    """Serves POSTs with `responder`, records (path, request) pairs; its certificate names the Service."""

    def __init__(self, authority: Authority | CertPair, namespace: str = "gpushare-system",
                 name: str = "gpushare-webhook", responder: Responder = allow_all) -> None:
        """`authority` issues a certificate for the Service, or is the certificate pair to serve as it is."""
        self.responder = responder
        self.calls: list[tuple[str, Obj]] = []
        self.delay = 0.0
        if isinstance(authority, CertPair):
            self._pair = authority
        else:
            self._pair = authority.issue(service_names(namespace, name), ["127.0.0.1"])
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    def start(self) -> FakeWebhook:
        hook = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                path = self.path.split("?", 1)[0]
                with hook._lock:
                    hook.calls.append((path, body["request"]))
                if hook.delay:
                    time.sleep(hook.delay)
                answer = hook.responder(path, body["request"])
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.socket = server_context(self._pair).wrap_socket(server.socket, server_side=True)
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeWebhook:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"https://127.0.0.1:{self._server.server_address[1]}"

    def paths(self) -> list[str]:
        with self._lock:
            return [path for path, _ in self.calls]


def webhook(name: str, path: str, ca_pem: bytes, *, rules: list[Obj] | None = None, namespace: str = "gpushare-system",
            service: str = "gpushare-webhook", **extra: Any) -> Obj:
    """One webhook entry pointing at a Service, failurePolicy Fail unless `extra` says otherwise."""
    entry: Obj = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "timeoutSeconds": 5,
        "clientConfig": {"service": {"namespace": namespace, "name": service, "path": path, "port": 443},
                         "caBundle": base64.b64encode(ca_pem).decode()},
        "rules": rules if rules is not None else [POD_RULE],
    }
    entry.update(extra)
    return entry


def configuration(kind: str, name: str, *hooks: Obj) -> Obj:
    """A Mutating- or ValidatingWebhookConfiguration (`kind` is `Mutating` or `Validating`)."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": f"{kind}WebhookConfiguration",
            "metadata": {"name": name}, "webhooks": list(hooks)}
