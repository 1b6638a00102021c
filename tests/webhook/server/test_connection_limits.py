"""A full webhook process makes room for a new client by closing a connection of the client that holds the most, so
clients that open many connections cannot lock the API server out (webhook/server/connlimits.py decides whose)."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.harness.pods import container, pod, review
from tests.harness.webhook.server import HOST, RunningWebhook, webhook_server
from tests.harness.webhook.stalled_clients import close_all, closed_by_server, open_idle, open_one, still_open
from tests.webhook.server.test_metrics import samples, value

pytestmark = pytest.mark.timeout(180)

PROCESS_LIMIT = 20  # gunicorn's worker_connections, small for the test
# Connect, handshake, send and answer each within this: a refused or closed connection fails at once, so this
# only keeps a broken server from hanging the test.
CLIENT_TIMEOUT = 10.0


def connection(hook: RunningWebhook, source: str) -> http.client.HTTPSConnection:
    """A kept-alive HTTPS connection from the local address `source` (every 127.x.y.z address is local on Linux)."""
    return http.client.HTTPSConnection(HOST, hook.port, context=hook.ssl_context(), timeout=CLIENT_TIMEOUT,
                                       source_address=(source, 0))


def healthz_then_idle(hook: RunningWebhook, source: str) -> http.client.HTTPSConnection | None:
    """What the flood does: one GET /healthz, then silence on a kept-alive connection; None when refused."""
    return open_idle(hook.port, hook.ssl_context(), source, timeout=CLIENT_TIMEOUT)


def review_on(conn: http.client.HTTPSConnection, uid: str) -> str:
    """POST one validating review on `conn`; the uid it was answered for."""
    body = json.dumps(review("CREATE", pod(container("main", 2)), uid=uid))
    conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
    res = conn.getresponse()
    answer = json.loads(res.read())
    assert res.status == 200
    uid_answered: str = answer["response"]["uid"]
    return uid_answered


def fresh_review(hook: RunningWebhook, source: str, uid: str) -> str:
    conn = connection(hook, source)
    try:
        return review_on(conn, uid)
    finally:
        conn.close()


def open_by_server(conn: http.client.HTTPSConnection) -> bool:
    assert conn.sock is not None
    return still_open(conn.sock)


@pytest.fixture
def held() -> Iterator[list[http.client.HTTPSConnection]]:
    conns: list[http.client.HTTPSConnection] = []
    yield conns
    for conn in conns:
        conn.close()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningWebhook]:
    with webhook_server(tmp_path_factory.mktemp("limits"), {"GPUSHARE_READ_DEADLINE_SECONDS": "30"},
                        gunicorn_args=["--worker-connections", str(PROCESS_LIMIT)]) as running:
        yield running


def test_one_flooding_source_cannot_lock_another_out(small: RunningWebhook,
                                                     held: list[http.client.HTTPSConnection]) -> None:
    before = samples(small.scrape())
    for _ in range(PROCESS_LIMIT + 10):
        conn = healthz_then_idle(small, "127.0.0.1")
        if conn is not None:
            held.append(conn)
    assert fresh_review(small, "127.0.0.2", "u-newcomer") == "u-newcomer"
    assert len(held) == PROCESS_LIMIT + 10, "the flood's own new connections take the place of its oldest idle ones"
    assert not any(open_by_server(conn) for conn in held[:10])
    assert all(open_by_server(conn) for conn in held[12:])
    after = samples(small.scrape())
    evicted = 'gpushare_webhook_connections_evicted_total'
    grew = value(after, evicted, limit="process", state="idle") - value(before, evicted, limit="process", state="idle")
    assert grew >= 11
    assert "Connection limits reached (worker_connections=20" in small.log_text()


def test_ten_flooding_sources_leave_the_api_server_its_connection_and_let_it_open_more(
    small: RunningWebhook, held: list[http.client.HTTPSConnection],
) -> None:
    api = connection(small, "127.0.0.1")
    held.append(api)
    assert review_on(api, "u-0") == "u-0"
    for source in range(2, 12):
        for _ in range(PROCESS_LIMIT // 4):  # twice the process's room over the ten sources
            conn = healthz_then_idle(small, f"127.0.0.{source}")
            if conn is not None:
                held.append(conn)
    assert open_by_server(api), "the API server's kept-alive connection is never the one closed"
    assert [review_on(api, f"u-{i}") for i in range(1, 4)] == ["u-1", "u-2", "u-3"]
    assert [fresh_review(small, "127.0.0.1", f"f-{i}") for i in range(3)] == ["f-0", "f-1", "f-2"]
    assert review_on(api, "u-4") == "u-4"


@pytest.fixture(scope="module")
def per_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningWebhook]:
    env = {"GPUSHARE_READ_DEADLINE_SECONDS": "30", "GPUSHARE_MAX_CONNECTIONS_PER_CLIENT": "4"}
    with webhook_server(tmp_path_factory.mktemp("per-client"), env) as running:
        yield running


def refused(hook: RunningWebhook, source: str) -> bool:
    """Whether a new connection from `source` is closed without an answer to its request."""
    conn = connection(hook, source)
    try:
        conn.request("GET", "/healthz")
        conn.getresponse().read()
    except (OSError, ssl.SSLError, http.client.HTTPException):
        return True
    finally:
        conn.close()
    return False


def test_a_source_at_its_limit_with_only_unfinished_connections_is_refused(per_client: RunningWebhook,
                                                                         tmp_path: Path) -> None:
    with ExitStack() as stack:
        stalled = [open_one(per_client.port, per_client.ssl_context(), "headers", source="127.0.0.2")
                   for _ in range(4)]
        stack.callback(close_all, stalled)
        assert refused(per_client, "127.0.0.2")
        assert all(still_open(sock) for sock in stalled), "unfinished connections are never closed for another"
        assert fresh_review(per_client, "127.0.0.3", "u-other") == "u-other"
        refusals = value(samples(per_client.scrape()), "gpushare_webhook_connections_refused_total", limit="client")
        assert refusals == 1


def test_a_source_at_its_limit_gives_up_its_oldest_idle_connection(per_client: RunningWebhook) -> None:
    with ExitStack() as stack:
        idle = healthz_then_idle(per_client, "127.0.0.4")
        assert idle is not None
        stack.callback(idle.close)
        stalled = [open_one(per_client.port, per_client.ssl_context(), "headers", source="127.0.0.4")
                   for _ in range(3)]
        stack.callback(close_all, stalled)
        assert fresh_review(per_client, "127.0.0.4", "u-same") == "u-same"
        assert idle.sock is not None and closed_by_server(idle.sock, timeout=CLIENT_TIMEOUT)
        assert all(still_open(sock) for sock in stalled)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def test_an_idle_tls_connection_costs_a_process_little_memory(tmp_path: Path) -> None:
    """A full process (1,000 connections) must fit the container's 384 Mi twice over with room to answer: asyncio's
    own 256 KiB read buffer per TLS connection did not (280 MiB a process)."""
    with webhook_server(tmp_path) as hook, ExitStack() as stack:
        [worker] = Path(f"/proc/{hook.process.pid}/task/{hook.process.pid}/children").read_text().split()
        before = rss_kib(int(worker))
        for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"):
            for _ in range(100):
                conn = healthz_then_idle(hook, source)
                assert conn is not None
                stack.callback(conn.close)
        assert (rss_kib(int(worker)) - before) / 400 < 128
