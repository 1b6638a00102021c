"""The plain-HTTP /metrics listener: idle and stalled connections hold no thread, the most it holds is bounded, and
scrapes are answered in prometheus_client's formats throughout."""

from __future__ import annotations

import gzip
import http.client
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from common.metricsserver import MetricsServer
from tests.harness.webhook.stalled_clients import close_all, closed_by_server, still_open

pytestmark = pytest.mark.timeout(120)

HOST = "127.0.0.1"
IDLE = 200
CAP = 32


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    registry = CollectorRegistry()
    Counter("gpushare_test_things", "Things.", registry=registry).inc(3)
    listener = MetricsServer((HOST, 0), registry, max_connections=CAP, read_deadline=0.5)
    try:
        yield listener
    finally:
        listener.stop()


def scrape(port: int, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers=headers or {})
        res = conn.getresponse()
        return res.status, {k.lower(): v for k, v in res.getheaders()}, res.read()
    finally:
        conn.close()


def idle_connections(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection((HOST, port), timeout=10) for _ in range(count)]


def test_idle_connections_hold_no_thread_and_scrapes_go_on(server: MetricsServer) -> None:
    assert scrape(server.port)[0] == 200  # the collector pool has started its first thread
    threads = threading.active_count()
    idle = idle_connections(server.port, IDLE)
    try:
        status, _, body = scrape(server.port)
        assert status == 200 and b"gpushare_test_things_total 3.0" in body
        assert threading.active_count() <= threads + 1  # at most the pool's second thread
        until = time.monotonic() + 10  # the listener closes them as it accepts newer ones
        while sum(not still_open(sock) for sock in idle) < IDLE - CAP and time.monotonic() < until:
            time.sleep(0.05)
        assert sum(not still_open(sock) for sock in idle) >= IDLE - CAP
        assert still_open(idle[-1]), "the newest connection is not the one closed"
    finally:
        close_all(idle)


def test_a_request_that_stalls_mid_headers_is_closed(server: MetricsServer) -> None:
    with socket.create_connection((HOST, server.port), timeout=10) as stalled:
        stalled.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        assert closed_by_server(stalled, timeout=10)


def test_prometheus_formats_are_kept(server: MetricsServer) -> None:
    status, headers, body = scrape(server.port, {"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert b"gpushare_test_things_total 3.0" in gzip.decompress(body)
    status, headers, body = scrape(server.port, {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert headers["content-type"].startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    assert scrape(server.port)[1]["content-type"].startswith("text/plain; version=0.0.4")


class Failing:
    def collect(self) -> Iterator[object]:
        raise RuntimeError("the collector's source is unreadable")


def test_a_failed_collection_is_answered_503_naming_it_and_the_next_scrape_is_served() -> None:
    registry = CollectorRegistry()
    failing = Failing()
    registry.register(failing)  # type: ignore[arg-type]
    listener = MetricsServer((HOST, 0), registry)
    try:
        status, _, body = scrape(listener.port)
        assert status == 503 and b"the collector's source is unreadable" in body
        registry.unregister(failing)  # type: ignore[arg-type]
        assert scrape(listener.port)[0] == 200
    finally:
        listener.stop()
