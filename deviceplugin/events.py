"""The plugin's pod Events: every refusal and allocation, rate limited per pod and reason, and the same in the log.

A container the plugin refuses is retried by the kubelet at every start (crash-loop back-off: 10 s, doubling up
to 5 min), and `Allocate` is retried for every pod the kubelet admits again; without a limit each retry would be
one more Event object in the API server. So each (pod UID, reason) gets a token bucket: BURST Events at once, then
one per EVERY seconds; what is held back is counted and logged, and the next Event says how many there were.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from contract import pod_ref
from deviceplugin.eventqueue import Post
from deviceplugin.metrics import PluginMetrics

log = logging.getLogger(__name__)

BURST = 3
EVERY = 300.0
# A node runs at most a few hundred pods (kubelet --max-pods, 110 by default), each refused for a reason or two.
KEYS = 4096
# Refusals that tell of the normal course of things, not of a fault: a container of a pod being deleted is not
# started, and the pod goes away by itself. A Normal Event and an INFO log line; the kubelet's own Event for the
# failed container start stays a Warning.
NORMAL_REFUSALS = frozenset({"GpuSharePodDeleting"})


class TokenBuckets:
    """Per key, `burst` tokens that refill at one per `every` seconds; the least recently used keys beyond `size`
    are forgotten (a forgotten key starts full again, so memory stays bounded and no pod is starved)."""

    def __init__(self, burst: int = BURST, every: float = EVERY, size: int = KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.every = every
        self.size = size
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[tuple[str, str], list[float]] = OrderedDict()  # key -> [tokens, at, held back]

    def take(self, key: tuple[str, str]) -> tuple[bool, int]:
        """(whether a token was taken, how many were refused for this key since the last one taken)."""
        now = self.clock()
        with self._lock:
            bucket = self._buckets.pop(key, None) or [float(self.burst), now, 0.0]
            tokens, at, held = bucket
            tokens = min(float(self.burst), tokens + max(0.0, now - at) / self.every)
            if tokens >= 1:
                self._buckets[key] = [tokens - 1, now, 0.0]
                taken, count = True, int(held)
            else:
                self._buckets[key] = [tokens, now, held + 1]
                taken, count = False, int(held) + 1
            while len(self._buckets) > self.size:
                self._buckets.popitem(last=False)
            return taken, count

    def __len__(self) -> int:
        return len(self._buckets)


class EventRecorder:
    """Decides which of the plugin's Events are posted, logs every refusal, counts what it holds back."""

    def __init__(self, post: Post, metrics: PluginMetrics, buckets: TokenBuckets | None = None) -> None:
        self.post = post  # the Event queue's post (deviceplugin/eventqueue.py), which counts what it sends
        self.metrics = metrics
        self.buckets = buckets if buckets is not None else TokenBuckets()  # an empty one has len() 0

    def refused(self, call: str, pod: Mapping[str, Any], reason: str, message: str) -> None:
        normal = reason in NORMAL_REFUSALS
        log.log(logging.INFO if normal else logging.WARNING, "%s refused pod %s (%s): %s", call, pod_ref(pod), reason,
                message)
        self._post(pod, "Normal" if normal else "Warning", reason, message)

    def allocated(self, pod: Mapping[str, Any], message: str) -> None:
        self._post(pod, "Normal", "GpuShareAllocated", message)

    def unattributed(self, call: str, reason: str, message: str) -> None:
        """A refusal whose pod is not known: no Event can carry it, so the log and a counter do."""
        log.warning("%s refused devices (%s) without knowing their pod, so no Event was posted: %s", call, reason,
                    message)
        self.metrics.unattributed.labels(call).inc()

    def _post(self, pod: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        meta = pod.get("metadata") or {}
        key = (str(meta.get("uid") or pod_ref(pod)), reason)
        taken, held = self.buckets.take(key)
        if not taken:
            self.metrics.suppressed.labels(reason).inc()
            log.debug("Event %s on pod %s held back (%d since the last one posted): pods get at most %d such Events "
                     "at once, then one per %g s.", reason, pod_ref(pod), held, self.buckets.burst,
                     self.buckets.every)
            return
        if held:
            message = f"{message} ({held} more like this since the previous Event were only logged.)"
        self.post(pod, event_type, reason, message)
