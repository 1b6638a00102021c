"""Clients that stop mid-request (mid-handshake, mid-headers, mid-body) or idle after one. Shared by tests and bench.

    socks = open_stalled(port, ssl_context, 64)   # a third of each kind, round robin
    ...
    close_all(socks)
    conn = open_idle(port, ssl_context, "127.0.0.2")  # one GET /healthz answered, then silence; None if refused
"""

from __future__ import annotations

import http.client
import socket
import ssl
from contextlib import suppress

HOST = "127.0.0.1"
KINDS = ("handshake", "headers", "body")
# The first 5 bytes of a TLS record (a handshake record of 512 bytes): the server waits for the rest.
PARTIAL_RECORD = b"\x16\x03\x01\x02\x00"
PARTIAL_HEADERS = b"POST /mutate HTTP/1.1\r\nHost: gpushare-webhook\r\nContent-Type: application/json\r\n"
PARTIAL_BODY = (b"POST /mutate HTTP/1.1\r\nHost: gpushare-webhook\r\nContent-Type: application/json\r\n"
                b"Content-Length: 4000\r\n\r\n" + b'{"apiVersion": "admission.k8s.io/v1", ' + b" " * 1000)

Stalled = socket.socket | ssl.SSLSocket


def open_one(
    port: int, context: ssl.SSLContext, kind: str, timeout: float = 10.0, source: str | None = None,
) -> Stalled:
    """A connection that sends part of `kind` (handshake, headers or body) and then nothing more; from the local
    address `source` when given (every 127.x.y.z address is local on Linux)."""
    raw = socket.create_connection((HOST, port), timeout=timeout, source_address=(source, 0) if source else None)
    if kind == "handshake":
        raw.sendall(PARTIAL_RECORD)
        return raw
    tls = context.wrap_socket(raw, server_hostname=HOST)
    tls.sendall(PARTIAL_HEADERS if kind == "headers" else PARTIAL_BODY)
    return tls


def open_idle(port: int, context: ssl.SSLContext, source: str = HOST,
              timeout: float = 10.0) -> http.client.HTTPSConnection | None:
    """A kept-alive connection from the local address `source` that got one GET /healthz answered and then says
    nothing; None when the server refused or closed it."""
    conn = http.client.HTTPSConnection(HOST, port, context=context, timeout=timeout, source_address=(source, 0))
    try:
        conn.request("GET", "/healthz")
        res = conn.getresponse()
        res.read()
    except (OSError, http.client.HTTPException):
        conn.close()
        return None
    if res.status != 200:
        conn.close()
        return None
    return conn


def open_stalled(port: int, context: ssl.SSLContext, count: int) -> list[Stalled]:
    return [open_one(port, context, KINDS[i % len(KINDS)]) for i in range(count)]


def still_open(sock: Stalled) -> bool:
    """True while the server has neither closed nor answered the connection (nothing to read, no EOF)."""
    sock.setblocking(False)
    try:
        sock.recv(1)  # TLS: a session ticket alone reads as "want read", not as data
    except (BlockingIOError, ssl.SSLWantReadError):
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)
    return False  # EOF, or an answer: either way no longer stalled


def closed_by_server(sock: Stalled, timeout: float) -> bool:
    """Wait up to `timeout` for the server to close the connection (EOF or reset) without answering it."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(65536)
    except TimeoutError:
        return False
    except OSError:
        return True  # reset, or a TLS connection cut without close_notify
    return data == b""


def close_all(socks: list[Stalled]) -> None:
    for sock in socks:
        with suppress(OSError):
            sock.close()
