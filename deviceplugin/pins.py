"""The GPU each pod was first allocated on this node, by pod UID: a pod never moves to another GPU (pure)."""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Pin:
    index: int
    uuid: str


class Pins:
    """The first GPU recorded for each pod UID. A status update can rewrite a bound pod's IDX together with a
    matching allocation record; a restarted container must still see the GPU it started on, since its memory
    is booked there, so a later change is refused instead of followed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_uid: dict[str, Pin] = {}

    def get(self, uid: str) -> Pin | None:
        with self._lock:
            return self._by_uid.get(uid)

    def hold(self, uid: str, pin: Pin) -> Pin:
        """Pin `uid` to `pin` unless it is pinned already; the pin in force is returned."""
        with self._lock:
            return self._by_uid.setdefault(uid, pin)

    def keep_only(self, uids: Collection[str]) -> None:
        """Forget the pods that are gone (their UIDs never come back)."""
        with self._lock:
            for uid in [u for u in self._by_uid if u not in uids]:
                del self._by_uid[uid]

    def indices(self) -> Mapping[str, int]:
        with self._lock:
            return {uid: pin.index for uid, pin in self._by_uid.items()}
