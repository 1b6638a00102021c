"""How many connections each webhook process holds, in memory shared by the processes of one server, so a process
that holds more than another lets that one accept the next connection (keep-alive connections stay where accepted).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
from typing import Any

# Processes of one server that can take part; more (an unusual GPUSHARE_WORKERS) accept without taking turns.
SLOTS = 64


class Shares:
    """(pid, connections) per process; made in the gunicorn arbiter, before the workers fork, so all see it."""

    def __init__(self, slots: int = SLOTS) -> None:
        context = multiprocessing.get_context("fork")
        self._pids: Any = context.RawArray(ctypes.c_long, slots)
        self._counts: Any = context.RawArray(ctypes.c_long, slots)
        self._lock = context.Lock()

    def claim(self, pid: int) -> int | None:
        """A slot for process `pid` (a free one, or one whose process is gone), or None when all are taken."""
        with self._lock:
            for slot, holder in enumerate(self._pids):
                if holder in (0, pid) or not _alive(holder):
                    self._pids[slot], self._counts[slot] = pid, 0
                    return slot
        return None

    def release(self, slot: int) -> None:
        with self._lock:
            self._pids[slot], self._counts[slot] = 0, 0

    def publish(self, slot: int, connections: int) -> None:
        self._counts[slot] = connections  # one aligned word: readers see the old or the new value, never a mix

    def holds_more(self, slot: int) -> bool:
        """True when some other live process holds fewer connections than this one: it should accept next."""
        mine = self._counts[slot]
        return any(
            pid and other != slot and self._counts[other] < mine and _alive(pid)
            for other, pid in enumerate(self._pids)
        )


def _alive(pid: int) -> bool:
    """Whether process `pid` exists: signal 0 checks without sending anything (EPERM: it exists, another user's)."""
    with contextlib.suppress(PermissionError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
    return True
