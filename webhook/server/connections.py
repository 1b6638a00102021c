"""The webhook worker's connections: each one's reader, writer and task, and making room for a new one.

webhook/server/connlimits.py decides which connection gives way; this module does it (a reset), counts it
(gpushare_webhook_connections_evicted_total, _refused_total) and says so in at most one log line per _WARN_EVERY.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import socket
import struct
import termios
import time
from collections.abc import Iterable
from typing import SupportsIndex

from webhook.server.connlimits import Ledger, State, Verdict
from webhook.server.metrics import ConnectionMetrics

log = logging.getLogger(__name__)

# Between two "connection limits reached" lines of one process: a flood must not flood the log too.
_WARN_EVERY = 10.0


class Reader(asyncio.StreamReader):
    """A StreamReader that remembers whether request bytes came in since the connection went idle."""

    fed = False

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        self.fed = True
        super().feed_data(data)


class Conn:
    """One connection: its task, and what closing it to make room for another needs."""

    __slots__ = ("reader", "secured_at", "served", "task", "writer")

    def __init__(self, reader: Reader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.task: asyncio.Task[None] | None = None
        self.served = 0  # requests answered
        self.secured_at: float | None = None  # the loop's time when its TLS handshake finished

    def pending(self) -> bool:
        """Whether the next request has started to arrive: in the reader, or unread in the kernel (TLS records)."""
        if self.reader.fed:
            return True
        sock = self.writer.get_extra_info("socket")
        try:
            unread: int = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
        except (AttributeError, OSError):
            return False
        return unread > 0

    def evict(self) -> None:
        """Close with a reset (SO_LINGER 0), see Connections.admit."""
        sock = self.writer.get_extra_info("socket")
        with contextlib.suppress(AttributeError, OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()
        if self.task is not None:
            self.task.cancel()


class Connections:
    """The connections of one worker process under its limits (gunicorn's worker_connections, and
    GPUSHARE_MAX_CONNECTIONS_PER_CLIENT); made in the worker process, after the fork."""

    def __init__(self, total: int, per_client: int) -> None:
        self.ledger: Ledger[Conn] = Ledger(total, per_client)
        self.metrics = ConnectionMetrics()
        self._counts = {"idle": 0, "unfinished": 0, "refused": 0}  # since the last log line
        self._warned_at = 0.0

    @property
    def total(self) -> int:
        return self.ledger.total

    def admit(self, reader: Reader, writer: asyncio.StreamWriter, client: str) -> Conn | None:
        """The new connection, counted, after closing the one that gives way for it; None when it is refused.

        Closing an idle connection does not fail a call of the API server's HTTP client (Go's net/http Transport,
        transport.go). An idle connection that sees our reset is marked broken by its read loop
        (readLoopPeekFailLocked) and never taken from the pool again. A request the client writes after the reset
        arrived fails with nothing written (nothingWrittenError), which shouldRetryRequest retries on a new
        connection, as client-go's request body can be rewound (GetBody); hence a reset (SO_LINGER 0), not a FIN,
        after which a write would succeed. What remains is the reset still in flight while the client takes that
        connection and writes a whole POST: transportReadFromServerError with bytes written, not retried for a
        POST, so that one call fails and its failurePolicy applies. Every server has that race when it closes a
        kept-alive connection at its idle timeout; here it is narrower: the client reuses its most recently used
        idle connection first (queueForIdleConn) and the ledger gives up the least recently used one, a connection
        whose next request has started to arrive is not idle (Conn.pending), and only a client holding more
        connections than the newcomer's loses one to it, which the API server is not unless it is the flood.
        """
        verdict = self.ledger.admit(client, Conn.pending)
        if verdict.limit is not None:
            self._make_room(verdict, client)
        if verdict.refused:
            return None
        conn = Conn(reader, writer)
        self.ledger.add(conn, client)
        return conn

    def mark(self, conn: Conn, state: State) -> None:
        self.ledger.mark(conn, state)

    def quiet(self, secured_before: float) -> list[Conn]:
        """The connections a stopping process resets now: kept alive after an answer with nothing arriving, or never
        used since a handshake that finished before `secured_before` (a client that dialled for a request writes it
        at once, and a fresh connection closed under it fails unretried: Go's Transport retries only on a reused
        one, shouldRetryRequest). A reset, as in admit, makes the API server's client retry on a new connection."""
        return [conn for conn, state in self.ledger.states()
                if (state is State.IDLE or (state is State.UNFINISHED and conn.served == 0
                                             and conn.secured_at is not None and conn.secured_at < secured_before))
                and not conn.pending()]

    def remove(self, conn: Conn) -> None:
        self.ledger.remove(conn)

    def _make_room(self, verdict: Verdict[Conn], client: str) -> None:
        assert verdict.limit is not None
        if verdict.victim is not None and verdict.victim_state is not None:
            verdict.victim.evict()
            self.ledger.remove(verdict.victim)
            self.metrics.evicted.labels(verdict.limit.value, verdict.victim_state.value).inc()
            self._counts[verdict.victim_state.value] += 1
        if verdict.refused:
            self.metrics.refused.labels(verdict.limit.value).inc()
            self._counts["refused"] += 1
        now = time.monotonic()
        if now - self._warned_at > _WARN_EVERY:
            self._warned_at = now
            busiest, held = self.ledger.busiest()
            counts, self._counts = self._counts, dict.fromkeys(self._counts, 0)
            log.warning("Connection limits reached (worker_connections=%s, GPUSHARE_MAX_CONNECTIONS_PER_CLIENT=%s): "
                        "this process closed %s idle and %s unfinished connections to make room and refused %s new "
                        "ones since its last such line; the latest came from %s, and %s holds the most (%s). "
                        "Restrict who may reach the webhook's port with the NetworkPolicy (docs/deploy.md).",
                        self.ledger.max_total, self.ledger.max_per_client, counts["idle"], counts["unfinished"],
                        counts["refused"], client, busiest, held)
