"""A webhook process that stops (SIGTERM; gunicorn's reload on SIGHUP replaces every worker so) fails no call of the
API server: a request already arriving is answered, with `Connection: close`, and a kept-alive connection with none
is reset, which Go's Transport retries on a new connection (webhook/server/worker.py, WebhookWorker._drain)."""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import socket
import ssl
from pathlib import Path

import pytest

from tests.harness.pods import container, pod, review
from tests.harness.webhook.server import HOST, webhook_server
from tests.harness.webhook.stalled_clients import open_idle

pytestmark = pytest.mark.timeout(120)

# Bounds every read of the test, so that a broken server fails it instead of hanging it; the worker's own
# graceful_timeout (gunicorn.conf.py, 10 s) is shorter.
CLIENT_TIMEOUT = 30.0


def _read_answer(sock: ssl.SSLSocket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_reload_answers_the_request_arriving_and_resets_the_idle_connection(tmp_path: Path) -> None:
    with webhook_server(tmp_path / "hook") as hook:
        context = hook.ssl_context()
        idle = open_idle(hook.port, context, timeout=CLIENT_TIMEOUT)
        assert idle is not None and idle.sock is not None

        body = json.dumps(review("CREATE", pod(container("main", 2)), uid="arriving-during-the-reload")).encode()
        half = len(body) // 2
        raw = socket.create_connection((HOST, hook.port), timeout=CLIENT_TIMEOUT)
        arriving = context.wrap_socket(raw, server_hostname=HOST)
        arriving.sendall(b"POST /validate HTTP/1.1\r\nHost: gpushare-webhook\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body[:half])

        os.kill(hook.process.pid, signal.SIGHUP)  # the arbiter starts a new worker, then stops the old one

        # A reset, not a FIN: after a FIN a POST the client writes meanwhile reads EOF and fails unretried. Python's
        # TLS reads both as an end of file; the socket's pending error tells them apart.
        readable, _, _ = select.select([idle.sock], [], [], CLIENT_TIMEOUT)
        assert readable, "the idle connection was neither closed nor reset"
        assert idle.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET
        idle.close()

        arriving.sendall(body[half:])
        answer = _read_answer(arriving)
        arriving.close()
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), answer[:300]
        assert b"\r\nconnection: close" in head.lower(), head
        assert json.loads(payload)["response"]["uid"] == "arriving-during-the-reload"

        status, doc = hook.post_json("/validate", review("CREATE", pod(container("main", 2)), uid="after"))
        assert status == 200 and doc["response"]["uid"] == "after"  # the new worker serves
