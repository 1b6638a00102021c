"""The deadline of the kubelet call being answered, for the adapters' own requests to respect (pure)."""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_until: contextvars.ContextVar[float | None] = contextvars.ContextVar("gpushare_call_deadline", default=None)


def run_until(until: float, work: Callable[[], T]) -> T:
    """Run `work` with the deadline `until` (time.monotonic()) in force for every request it makes."""
    token = _until.set(until)
    try:
        return work()
    finally:
        _until.reset(token)


def left(ceiling: float) -> float:
    """Seconds a request may take: `ceiling`, or less when the call it serves must answer sooner (never below
    0: a request with nothing left fails at once instead of holding a worker)."""
    until = _until.get()
    if until is None:
        return ceiling
    return max(0.0, min(ceiling, until - time.monotonic()))
