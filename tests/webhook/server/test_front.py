"""The webhook's HTTP/1.1 front on the real server: framing, keep-alive, limits, and what it refuses."""

from __future__ import annotations

import ast
import json
import socket
import ssl
from collections.abc import Iterator

import pytest

from tests.harness.pods import container, pod, review
from tests.harness.webhook.server import HOST, REPO, RunningWebhook, webhook_server

pytestmark = pytest.mark.timeout(90)
LIMIT = 100000


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningWebhook]:
    with webhook_server(tmp_path_factory.mktemp("front"), {"GPUSHARE_MAX_BODY_BYTES": str(LIMIT)}) as running:
        yield running


def exchange(hook: RunningWebhook, raw: bytes) -> bytes:
    """Send raw bytes over one TLS connection and read until the server closes it."""
    with (
        socket.create_connection((HOST, hook.port), timeout=10) as plain,
        hook.ssl_context().wrap_socket(plain, server_hostname=HOST) as tls,
    ):
        tls.sendall(raw)
        out = b""
        try:
            while chunk := tls.recv(65536):
                out += chunk
        except (ssl.SSLError, ConnectionResetError):
            pass
        return out


def body_of(answer: bytes) -> bytes:
    return answer.split(b"\r\n\r\n", 1)[1]


REVIEW = json.dumps(review("CREATE", pod(container("cpu")), uid="u-front")).encode()



def test_two_requests_on_one_connection_then_connection_close(hook: RunningWebhook) -> None:
    head = b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    raw = (head % len(REVIEW)) + b"\r\n" + REVIEW + (head % len(REVIEW)) + b"Connection: close\r\n\r\n" + REVIEW
    answer = exchange(hook, raw)
    assert answer.count(b"HTTP/1.1 200 OK") == 2
    assert answer.count(b'"uid":"u-front"') == 2
    assert b"Connection: close" in answer.rsplit(b"HTTP/1.1", 1)[1]


def test_chunked_body_and_expect_continue(hook: RunningWebhook) -> None:
    half = len(REVIEW) // 2
    chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, REVIEW[:half], len(REVIEW) - half, REVIEW[half:])
    raw = (b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
           b"Expect: 100-continue\r\nConnection: close\r\n\r\n" + chunks)
    answer = exchange(hook, raw)
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    assert json.loads(body_of(answer.split(b"\r\n\r\n", 1)[1]))["response"]["uid"] == "u-front"


@pytest.mark.parametrize(("raw", "status", "fragment"), [
    (b"BREW /coffee HTCPCP/1.0\r\n\r\n", b"400", b"not an HTTP/1.1 request line"),
    (b"POST /mutate HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", b"400", b"Transfer-Encoding"),
    (b"POST /mutate HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", b"400", b"conflicting"),
    (b"POST /mutate HTTP/1.1\r\nContent-Length: -1\r\n\r\n", b"400", b"whole number"),
    (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", b"431", b"over 16384 bytes"),
    (b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", b"400", b"chunk size"),
])
def test_unframeable_requests_get_one_line_and_a_close(hook: RunningWebhook, raw: bytes, status: bytes,
                                                       fragment: bytes) -> None:
    answer = exchange(hook, raw)
    assert answer.startswith(b"HTTP/1.1 " + status)
    assert b"Connection: close" in answer
    assert fragment in body_of(answer)
    assert body_of(answer).count(b"\n") == 1


def test_declared_body_over_the_limit_is_refused_unread(hook: RunningWebhook) -> None:
    raw = b"POST /mutate HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (LIMIT + 1)
    answer = exchange(hook, raw)  # the body is never sent: the answer must not wait for it
    assert answer.startswith(b"HTTP/1.1 400")
    assert b"over the 100000-byte limit (GPUSHARE_MAX_BODY_BYTES)" in body_of(answer)


def test_chunked_body_over_the_limit_is_refused(hook: RunningWebhook) -> None:
    raw = b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % (LIMIT + 1)
    answer = exchange(hook, raw)
    assert answer.startswith(b"HTTP/1.1 400")
    assert b"GPUSHARE_MAX_BODY_BYTES" in body_of(answer)


def test_head_and_http_1_0(hook: RunningWebhook) -> None:
    head = exchange(hook, b"HEAD /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and body_of(head) == b""
    old = exchange(hook, b"GET /readyz HTTP/1.0\r\n\r\n")
    assert old.startswith(b"HTTP/1.1 200") and body_of(old) == b"ok\n"


# The API server's webhook client closes its idle connections after 90 s: client-go's transport takes
# IdleConnTimeout from net/http's DefaultTransport (k8s.io/apimachinery pkg/util/net/http.go SetTransportDefaults).
API_SERVER_IDLE_SECONDS = 90


def test_idle_connections_outlive_the_api_servers_own_idle_timeout() -> None:
    """The API server, not the webhook, ends its idle connections: a call after a quiet minute needs no handshake,
    and no POST is written on a connection the webhook is closing (gunicorn.conf.py, keepalive)."""
    conf = ast.parse((REPO / "gunicorn.conf.py").read_text())
    [keepalive] = [node.value for node in conf.body if isinstance(node, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "keepalive" for t in node.targets)]
    assert isinstance(keepalive, ast.Constant) and isinstance(keepalive.value, int)
    assert keepalive.value > API_SERVER_IDLE_SECONDS
