"""One admission webhook call over HTTPS, verified against the configuration's caBundle like kube-apiserver."""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import socket
import ssl
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tests.harness.tls import client_context

Obj = dict[str, Any]
ServiceMap = Mapping[tuple[str, str, int], str]

REVIEW_VERSION = "admission.k8s.io/v1"


class CallError(Exception):
    """The webhook could not be called or answered something unusable; failurePolicy decides."""


@dataclass(frozen=True)
class Target:
    connect_host: str
    connect_port: int
    server_hostname: str
    path: str
    shown_url: str


class _Connection(http.client.HTTPSConnection):
    """Connects to one address while verifying the certificate for another name (SNI + hostname check)."""

    def __init__(self, target: Target, context: ssl.SSLContext, timeout: float) -> None:
        super().__init__(target.connect_host, target.connect_port, timeout=timeout, context=context)
        self._target = target
        self._context = context

    def connect(self) -> None:
        raw = socket.create_connection((self._target.connect_host, self._target.connect_port), self.timeout)
        self.sock = self._context.wrap_socket(raw, server_hostname=self._target.server_hostname)


def resolve(client_config: Mapping[str, Any], services: ServiceMap, timeout: int) -> Target:
    """Where to connect and which name to verify.

    A `service` reference is resolved through `services` ((namespace, name, port) -> https://host:port), which
    replaces cluster DNS and the Service's endpoints; the certificate must still be valid for `<name>.<ns>.svc`,
    the name kube-apiserver verifies. A `url` is used as written.
    """
    service = client_config.get("service")
    if service:
        namespace, name = str(service.get("namespace", "")), str(service.get("name", ""))
        port = int(service.get("port") or 443)
        path = str(service.get("path") or "/")
        host = f"{name}.{namespace}.svc"
        shown = f"https://{host}:{port}{path}?timeout={timeout}s"
        address = services.get((namespace, name, port))
        if address is None:
            raise CallError(
                f'failed to call webhook: Post "{shown}": dial tcp: lookup {host}: no such host '
                f"(service {namespace}/{name}:{port} is not in the simulated service map)"
            )
        parsed = urllib.parse.urlsplit(address)
        return Target(parsed.hostname or "127.0.0.1", parsed.port or 443, host, path, shown)
    url = client_config.get("url")
    if not url:
        raise CallError("the webhook clientConfig has neither service nor url")
    parsed = urllib.parse.urlsplit(str(url))
    if parsed.scheme != "https" or not parsed.hostname:
        raise CallError(f"the webhook clientConfig.url {url!r} is not an https URL")
    path = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
    return Target(parsed.hostname, parsed.port or 443, parsed.hostname, path,
                  f"{url}{'&' if parsed.query else '?'}timeout={timeout}s")


def _ca(client_config: Mapping[str, Any]) -> bytes | None:
    bundle = client_config.get("caBundle")
    if not bundle:
        return None
    try:
        return base64.b64decode(str(bundle), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CallError(f"the webhook caBundle is not valid base64: {exc}") from exc


def post_review(client_config: Mapping[str, Any], services: ServiceMap, review: Obj, timeout: int) -> Obj:
    """POST the AdmissionReview and return the parsed, checked response review.

    Simplification: `timeoutSeconds` bounds each socket operation rather than the whole exchange.
    """
    target = resolve(client_config, services, timeout)
    try:
        context = client_context(_ca(client_config))
    except ssl.SSLError as exc:
        raise CallError(f"the webhook caBundle holds no usable certificate: {exc}") from exc
    body = json.dumps(review).encode()
    connection = _Connection(target, context, float(timeout))
    try:
        path = target.path + ("&" if "?" in target.path else "?") + f"timeout={timeout}s"
        connection.request("POST", path, body, {"Content-Type": "application/json", "Accept": "application/json"})
        response = connection.getresponse()
        payload = response.read()
    except TimeoutError as exc:
        raise CallError(f'failed to call webhook: Post "{target.shown_url}": context deadline exceeded') from exc
    except ConnectionRefusedError as exc:
        raise CallError(f'failed to call webhook: Post "{target.shown_url}": dial tcp {target.connect_host}:'
                        f"{target.connect_port}: connect: connection refused") from exc
    except ssl.SSLCertVerificationError as exc:
        raise CallError(f'failed to call webhook: Post "{target.shown_url}": tls: failed to verify certificate: '
                        f"{exc.verify_message}") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise CallError(f'failed to call webhook: Post "{target.shown_url}": {exc}') from exc
    finally:
        connection.close()
    if response.status != 200:
        raise CallError(f"received invalid webhook response: the server responded with HTTP {response.status}: "
                        f"{payload[:300].decode(errors='replace')}")
    try:
        answer = json.loads(payload)
    except ValueError as exc:
        raise CallError(f"received invalid webhook response: the body is not JSON: {exc}") from exc
    if not isinstance(answer, dict):
        raise CallError(f"received invalid webhook response: a JSON {type(answer).__name__}, not an AdmissionReview")
    if answer.get("apiVersion") != REVIEW_VERSION or answer.get("kind") != "AdmissionReview":
        got = f"{answer.get('apiVersion')}, Kind={answer.get('kind')}"
        raise CallError(f"received invalid webhook response: expected webhook response of {REVIEW_VERSION}, "
                        f"Kind=AdmissionReview, got {got}")
    result = answer.get("response")
    if not isinstance(result, dict):
        raise CallError("received invalid webhook response: webhook response was absent")
    expected = review["request"]["uid"]
    if result.get("uid") != expected:
        raise CallError(f'received invalid webhook response: expected response.uid="{expected}", '
                        f'got "{result.get("uid")}"')
    return result
