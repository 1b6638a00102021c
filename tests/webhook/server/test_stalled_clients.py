"""Clients that stop mid-request cannot hold the real server: deadlines close them, and they never delay others."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
from collections.abc import Iterator

import pytest

from tests.harness.pods import container, pod, review
from tests.harness.webhook.server import HOST, RunningWebhook, webhook_server
from tests.harness.webhook.stalled_clients import close_all, closed_by_server, open_one, open_stalled, still_open

pytestmark = pytest.mark.timeout(180)

STALLED = 64
LEGITIMATE = 100
# The acceptance bound of each legitimate review while the stalled clients hold their connections: a request whose
# connect, handshake, send or answer takes longer than this fails with a timeout.
ANSWER_WITHIN = 1.0


def mutate_once(hook: RunningWebhook, uid: str) -> dict[str, object]:
    body = json.dumps(review("CREATE", pod(container("main", 2), container("cpu")), uid=uid)).encode()
    conn = http.client.HTTPSConnection(HOST, hook.port, context=hook.ssl_context(), timeout=ANSWER_WITHIN)
    try:
        conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
        res = conn.getresponse()
        assert res.status == 200
        answer: dict[str, object] = json.loads(res.read())
        return answer
    finally:
        conn.close()


@pytest.fixture(scope="module")
def patient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningWebhook]:
    """A server whose read deadline outlasts the test, so the stalled clients stay stalled throughout."""
    with webhook_server(tmp_path_factory.mktemp("stall"), {"GPUSHARE_READ_DEADLINE_SECONDS": "30"}) as running:
        yield running


def test_64_stalled_connections_do_not_delay_100_reviews(patient: RunningWebhook) -> None:
    stalled = open_stalled(patient.port, patient.ssl_context(), STALLED)
    try:
        answers = [mutate_once(patient, f"u-{i}") for i in range(LEGITIMATE)]
        assert all(still_open(sock) for sock in stalled), "the stalled clients must hold their connections throughout"
    finally:
        close_all(stalled)
    for i, answer in enumerate(answers):
        response = answer["response"]
        assert isinstance(response, dict)
        assert (response["uid"], response["allowed"], response["patchType"]) == (f"u-{i}", True, "JSONPatch")
        ops = json.loads(base64.b64decode(response["patch"]))
        assert any(op["path"] == "/metadata/annotations" for op in ops)


def test_kept_alive_connection_is_served_while_others_stall(patient: RunningWebhook) -> None:
    stalled = open_stalled(patient.port, patient.ssl_context(), STALLED)
    conn = http.client.HTTPSConnection(HOST, patient.port, context=patient.ssl_context(), timeout=ANSWER_WITHIN)
    try:
        for i in range(20):  # the API server keeps its connections open
            conn.request("POST", "/validate", body=json.dumps(review("CREATE", pod(container("cpu")), uid=f"k{i}")),
                         headers={"Content-Type": "application/json"})
            res = conn.getresponse()
            assert (res.status, json.loads(res.read())["response"]["uid"]) == (200, f"k{i}")
    finally:
        conn.close()
        close_all(stalled)


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningWebhook]:
    with webhook_server(tmp_path_factory.mktemp("deadline"), {"GPUSHARE_READ_DEADLINE_SECONDS": "1"}) as running:
        yield running


@pytest.mark.parametrize(("kind", "line"), [
    ("handshake", "its TLS handshake did not finish within 1 s"),
    ("headers", "the request headers did not arrive within 1 s"),
    ("body", "the request body did not arrive within 1 s"),
])
def test_read_deadline_closes_a_stalled_connection(strict: RunningWebhook, kind: str, line: str) -> None:
    sock = open_one(strict.port, strict.ssl_context(), kind)
    try:
        assert closed_by_server(sock, timeout=20), f"a client stalled mid-{kind} must be disconnected"
    finally:
        sock.close()
    deadline = time.monotonic() + 10
    while line not in strict.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert line in strict.log_text()


def test_a_connection_that_never_sends_is_closed(strict: RunningWebhook) -> None:
    with socket.create_connection((HOST, strict.port), timeout=10) as idle:
        assert closed_by_server(idle, timeout=20)


def test_a_new_connection_waits_for_its_first_request_like_a_kept_alive_one(strict: RunningWebhook) -> None:
    """The API server pools connections it dialled and did not use yet (Go's net/http): one that sends its first
    request after the read deadline is served, not reset (webhook/server/worker.py)."""
    with socket.create_connection((HOST, strict.port), timeout=10) as raw, \
            strict.ssl_context().wrap_socket(raw, server_hostname=HOST) as tls:
        time.sleep(2.5)  # past the 1 s read deadline, well within the keep-alive
        assert still_open(tls)
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := tls.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 ")
