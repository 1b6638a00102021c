"""The hanging relay the DRA tier test puts in front of the API server: it carries bytes, then holds them, then
closes what it held and carries again."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.harness.realtier.stall import StallRelay


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=lambda c=conn: [c.sendall(d) for d in iter(lambda: c.recv(1024), b"")],
                             daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


def _echoed(port: int, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(b"ping")
        try:
            return conn.recv(16)
        except TimeoutError:
            return b""


def test_it_carries_then_holds_then_carries_again(echo: int) -> None:
    with StallRelay(echo) as relay:
        assert _echoed(relay.port) == b"ping"
        relay.hang()
        with socket.create_connection(("127.0.0.1", relay.port), timeout=0.5) as held:
            held.sendall(b"ping")
            with pytest.raises(TimeoutError):
                held.recv(16)  # accepted, never answered
            relay.resume()
            held.settimeout(5)
            assert held.recv(16) == b""  # closed by resume(): the client reconnects
        assert _echoed(relay.port) == b"ping"
