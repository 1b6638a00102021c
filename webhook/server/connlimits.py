"""Which connection a full webhook process gives up for a new one: per-client and per-process limits, pure bookkeeping.

Every connection is in one of three states. UNFINISHED: its TLS handshake or a request is not whole yet (bounded by
GPUSHARE_READ_DEADLINE_SECONDS), or its first request has not begun (bounded by gunicorn's keepalive: the API server
pools connections it has not used yet, webhook/server/worker.py). BUSY: a whole request is being answered. IDLE: kept
alive after an answer, waiting for the next request (bounded by gunicorn's keepalive). A new connection from a client
that already holds `per_client` closes that client's oldest idle connection, or is refused when it has none. A new
connection to a process that holds `total` closes a connection of the client holding the most, as long as that client
holds more than the newcomer's: its oldest idle one, else its oldest unfinished one; failing that, the newcomer's own
oldest idle one; failing that, it is refused. A busy connection is never closed. So a client with few connections (the
API server) keeps its own and gets in, whatever a client with many does, and a client that holds only unfinished
connections waits for their deadline instead of taking other clients' places.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)


class State(enum.Enum):
    UNFINISHED = "unfinished"
    BUSY = "busy"
    IDLE = "idle"


class Limit(enum.Enum):
    CLIENT = "client"  # GPUSHARE_MAX_CONNECTIONS_PER_CLIENT
    PROCESS = "process"  # gunicorn's worker_connections


@dataclass(frozen=True)
class Verdict(Generic[C]):
    """What to do with a new connection: close `victim` first (when given), then take it, unless `refused`."""

    limit: Limit | None = None  # the limit the new connection reached; None: under both
    victim: C | None = None
    victim_state: State | None = None
    refused: bool = False


@dataclass
class _Client(Generic[C]):
    count: int = 0
    # Insertion-ordered: the first is the one that entered the state earliest (the nearest to its bound).
    idle: dict[C, None] = field(default_factory=dict)
    unfinished: dict[C, None] = field(default_factory=dict)


class Ledger(Generic[C]):
    """The connections of one process, by client address and state."""

    def __init__(self, total: int, per_client: int) -> None:
        self.max_total = total
        self.max_per_client = per_client
        self._conns: dict[C, tuple[str, State]] = {}
        self._clients: dict[str, _Client[C]] = {}
        self._by_count: dict[int, dict[str, None]] = {}  # clients by how many connections they hold
        self._top = 0  # the most any client holds

    @property
    def total(self) -> int:
        return len(self._conns)

    def states(self) -> list[tuple[C, State]]:
        """Every connection with its state."""
        return [(conn, state) for conn, (_, state) in self._conns.items()]

    def count(self, client: str) -> int:
        held = self._clients.get(client)
        return held.count if held else 0

    def busiest(self) -> tuple[str, int]:
        """The client holding the most connections, and how many ("", 0 when none)."""
        for client in self._by_count.get(self._top, {}):
            return client, self._top
        return "", 0

    def admit(self, client: str, pending: Callable[[C], bool] = lambda conn: False) -> Verdict[C]:
        """The verdict on a new connection from `client`. `pending(conn)` is True for an idle connection whose next
        request has arrived but is not read yet: it is no longer idle, and is never chosen."""
        held = self.count(client)
        if held >= self.max_per_client:
            return self._own_idle(client, Limit.CLIENT, pending)
        if self.total < self.max_total:
            return Verdict()
        for count in range(self._top, held, -1):
            for other in self._by_count.get(count, {}):
                victim, state = self._oldest(other, pending)
                if victim is not None:
                    return Verdict(Limit.PROCESS, victim, state)
        return self._own_idle(client, Limit.PROCESS, pending)

    def add(self, conn: C, client: str) -> None:
        """A connection just taken: UNFINISHED until its first request is whole."""
        held = self._clients.setdefault(client, _Client[C]())
        self._conns[conn] = (client, State.UNFINISHED)
        held.unfinished[conn] = None
        self._move(client, held.count, held.count + 1)
        held.count += 1

    def mark(self, conn: C, state: State) -> None:
        if conn not in self._conns:
            return  # already closed to make room
        client = self._conns[conn][0]
        held = self._clients[client]
        self._conns[conn] = (client, state)
        held.idle.pop(conn, None)
        held.unfinished.pop(conn, None)
        if state is State.IDLE:
            held.idle[conn] = None
        elif state is State.UNFINISHED:
            held.unfinished[conn] = None

    def remove(self, conn: C) -> None:
        if conn not in self._conns:
            return
        client, _ = self._conns.pop(conn)
        held = self._clients[client]
        held.idle.pop(conn, None)
        held.unfinished.pop(conn, None)
        self._move(client, held.count, held.count - 1)
        held.count -= 1
        if not held.count:
            del self._clients[client]

    def _own_idle(self, client: str, limit: Limit, pending: Callable[[C], bool]) -> Verdict[C]:
        victim = self._first(self._clients[client].idle, pending) if client in self._clients else None
        if victim is None:
            return Verdict(limit, refused=True)
        return Verdict(limit, victim, State.IDLE)

    def _oldest(self, client: str, pending: Callable[[C], bool]) -> tuple[C | None, State | None]:
        held = self._clients[client]
        idle = self._first(held.idle, pending)
        if idle is not None:
            return idle, State.IDLE
        for conn in held.unfinished:
            return conn, State.UNFINISHED
        return None, None

    @staticmethod
    def _first(idle: dict[C, None], pending: Callable[[C], bool]) -> C | None:
        for conn in idle:
            if not pending(conn):
                return conn
        return None

    def _move(self, client: str, was: int, now: int) -> None:
        if was:
            bucket = self._by_count[was]
            del bucket[client]
            if not bucket:
                del self._by_count[was]
        if now:
            self._by_count.setdefault(now, {})[client] = None
        if now > self._top:
            self._top = now
        elif was == self._top and was not in self._by_count:
            self._top = now  # counts move by one: the next most is `now`, held by this client
