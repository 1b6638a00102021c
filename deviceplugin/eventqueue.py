"""Kubernetes Events posted by one background thread from a bounded queue, off the kubelet's critical path."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

# A burst of refusals on a node with hundreds of pods queues at most this many Events; more are dropped with a log
# line (the kubelet's call has its answer either way, and the refusal is in the plugin's log).
QUEUE_SIZE = 256

Post = Callable[[Mapping[str, Any], str, str, str], None]
_Item = tuple[Mapping[str, Any], str, str, str]


class EventQueue:
    """`post` returns at once; the thread calls `send` (the API server's create_event) for each Event in order."""

    def __init__(self, send: Post, size: int = QUEUE_SIZE) -> None:
        self._send = send
        self._queue: queue.Queue[_Item | None] = queue.Queue(size)
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._thread.start()

    def post(self, pod: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        with self._idle:
            self._pending += 1
        try:
            self._queue.put_nowait((pod, event_type, reason, message))
        except queue.Full:
            self._done()
            meta = pod.get("metadata") or {}
            log.warning("the Event %s on pod %s/%s was dropped because %s Events are waiting to be posted: %s",
                        reason, meta.get("namespace"), meta.get("name"), self._queue.maxsize, message)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every Event posted so far has been sent (or failed); False when `timeout` ran out first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (within `timeout`), then end the thread."""
        self.flush(timeout)
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            return  # the thread is a daemon: it ends with the process
        self._thread.join(timeout)

    def _done(self) -> None:
        with self._idle:
            self._pending -= 1
            if self._pending == 0:
                self._idle.notify_all()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._send(*item)
            except Exception:  # a failed post must not end the thread: later Events still go out
                log.exception("posting the Event %s failed", item[2])
            finally:
                self._done()
