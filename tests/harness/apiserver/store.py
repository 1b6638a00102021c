"""The one versioned store of every API-server double: objects per resource under one monotonic resourceVersion,
409 Conflict on a stale one, and watch streams with replay (the test API server, MemoryStore, the device plugin's
and the DRA driver's fakes all keep their objects here)."""

from __future__ import annotations

import collections
import copy
import queue
import threading
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from tests.harness.apiserver.status import already_exists, gone, not_found, stale

Obj = dict[str, Any]
Predicate = Callable[[Obj], bool]

# How many changes the store remembers for watches that resume from a resourceVersion; older ones get
# 410 Expired, like etcd compaction (the real default keeps about five minutes of history).
HISTORY = 100_000


@dataclass(frozen=True)
class Change:
    type: str  # ADDED | MODIFIED | DELETED
    rv: int
    key: str
    namespace: str
    obj: Obj
    old: Obj | None


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK | ERROR
    obj: Obj


@dataclass
class Watcher:
    """One watch stream: the events it should see, in resourceVersion order, and `None` when it ends."""

    key: str
    namespace: str | None
    predicate: Predicate
    events: queue.Queue[WatchEvent | None] = field(default_factory=queue.Queue)
    closed: bool = False

    def offer(self, change: Change) -> None:
        if change.key != self.key or (self.namespace and change.namespace != self.namespace):
            return
        event = translate(change, self.predicate)
        if event is not None:
            self.events.put(event)

    def close(self) -> None:
        self.closed = True
        self.events.put(None)

    def __iter__(self) -> Iterator[WatchEvent]:
        while True:
            event = self.events.get()
            if event is None:
                return
            yield event


def translate(change: Change, predicate: Predicate) -> WatchEvent | None:
    """What a filtered watch sees: objects that start matching arrive as ADDED, stop matching as DELETED."""
    now = predicate(change.obj)
    before = change.old is not None and predicate(change.old)
    if change.type == "ADDED":
        return WatchEvent("ADDED", copy.deepcopy(change.obj)) if now else None
    if change.type == "DELETED":
        return WatchEvent("DELETED", copy.deepcopy(change.obj)) if now or before else None
    if now and before:
        return WatchEvent("MODIFIED", copy.deepcopy(change.obj))
    if now:
        return WatchEvent("ADDED", copy.deepcopy(change.obj))
    if before:
        return WatchEvent("DELETED", copy.deepcopy(change.obj))
    return None


def _meta(obj: Obj) -> Obj:
    meta = obj.setdefault("metadata", {})
    assert isinstance(meta, dict)
    return meta


class Named(MutableMapping[str, Obj]):
    """One resource's cluster-scoped objects by name, as they are stored: a test plants or drops one directly, as an
    edit of etcd would (no new resourceVersion, no watch event)."""

    def __init__(self, objects: dict[tuple[str, str], Obj], lock: threading.RLock) -> None:
        self._objects = objects
        self._lock = lock

    def __getitem__(self, name: str) -> Obj:
        return self._objects[("", name)]

    def __setitem__(self, name: str, obj: Obj) -> None:
        with self._lock:
            self._objects[("", name)] = obj

    def __delitem__(self, name: str) -> None:
        with self._lock:
            del self._objects[("", name)]

    def __iter__(self) -> Iterator[str]:
        return iter([name for _, name in list(self._objects)])

    def __len__(self) -> int:
        return len(self._objects)


class Store:
    """Objects keyed by (resource key, namespace, name); every write bumps one global resourceVersion."""

    def __init__(self, history: int = HISTORY) -> None:
        # Held by every call; a double holds it too around a read-modify-write (a patch), which then never conflicts.
        self.lock = threading.RLock()
        self._rv = 0
        self._objects: dict[str, dict[tuple[str, str], Obj]] = collections.defaultdict(dict)
        self._log: collections.deque[Change] = collections.deque(maxlen=history)
        self._watchers: list[Watcher] = []

    def named(self, key: str) -> Named:
        """The cluster-scoped objects of `key` by name, to plant or drop as they are."""
        return Named(self._objects[key], self.lock)

    @property
    def resource_version(self) -> int:
        with self.lock:
            return self._rv

    def get(self, key: str, namespace: str, name: str) -> Obj | None:
        with self.lock:
            obj = self._objects[key].get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, key: str, namespace: str | None = None, predicate: Predicate | None = None) -> tuple[list[Obj], int]:
        """Matching objects sorted by namespace and name, and the resourceVersion they were read at."""
        with self.lock:
            items = [
                copy.deepcopy(obj)
                for (ns, _), obj in sorted(self._objects[key].items())
                if (not namespace or ns == namespace) and (predicate is None or predicate(obj))
            ]
            return items, self._rv

    def _record(self, type_: str, key: str, namespace: str, obj: Obj, old: Obj | None) -> None:
        change = Change(type_, self._rv, key, namespace, copy.deepcopy(obj), old)
        self._log.append(change)
        for watcher in list(self._watchers):
            watcher.offer(change)

    def create(self, key: str, obj: Obj, resource: str, group: str = "") -> Obj:
        meta = _meta(obj)
        namespace, name = str(meta.get("namespace") or ""), str(meta["name"])
        with self.lock:
            if (namespace, name) in self._objects[key]:
                raise already_exists(resource, name, group)
            return self._write("ADDED", key, (namespace, name), obj, None)

    def replace(self, key: str, obj: Obj, expect_rv: str, resource: str, group: str = "") -> Obj:
        """Compare-and-swap: `expect_rv` must be the stored resourceVersion, else 409 Conflict."""
        meta = _meta(obj)
        namespace, name = str(meta.get("namespace") or ""), str(meta["name"])
        with self.lock:
            current = self._objects[key].get((namespace, name))
            if current is None:
                raise not_found(resource, name, group)
            if current["metadata"]["resourceVersion"] != expect_rv:
                raise stale(resource, name, group)
            return self._write("MODIFIED", key, (namespace, name), obj, current)

    def _write(self, type_: str, key: str, where: tuple[str, str], obj: Obj, old: Obj | None) -> Obj:
        """Store `obj` under the next resourceVersion (written into it too) and tell the watchers."""
        self._rv += 1
        _meta(obj)["resourceVersion"] = str(self._rv)
        stored = copy.deepcopy(obj)
        self._objects[key][where] = stored
        self._record(type_, key, where[0], stored, old)
        return copy.deepcopy(stored)

    def remove(self, key: str, namespace: str, name: str, expect_rv: str | None, *args: str) -> Obj:
        """`args` is (resource plural[, group]) for the error messages."""
        resource, group = args[0], (args[1] if len(args) > 1 else "")
        with self.lock:
            current = self._objects[key].get((namespace, name))
            if current is None:
                raise not_found(resource, name, group)
            if expect_rv is not None and current["metadata"]["resourceVersion"] != expect_rv:
                raise stale(resource, name, group)
            del self._objects[key][(namespace, name)]
            self._rv += 1
            final = copy.deepcopy(current)
            final["metadata"]["resourceVersion"] = str(self._rv)
            self._record("DELETED", key, namespace, final, current)
            return copy.deepcopy(final)

    def watch(self, key: str, namespace: str | None, since: int | None, predicate: Predicate) -> Watcher:
        """A watcher that first gets the state (since=None) or the changes after `since`, then live changes."""
        watcher = Watcher(key, namespace, predicate)
        with self.lock:
            if since is None:
                for (ns, _), obj in sorted(self._objects[key].items()):
                    if (not namespace or ns == namespace) and predicate(obj):
                        watcher.events.put(WatchEvent("ADDED", copy.deepcopy(obj)))
            else:
                oldest = self._log[0].rv if self._log else self._rv + 1
                if since < oldest - 1 and since < self._rv:
                    raise gone(f"too old resource version: {since} ({oldest - 1})")
                for change in self._log:
                    if change.rv > since:
                        watcher.offer(change)
            self._watchers.append(watcher)
        return watcher

    @property
    def watch_count(self) -> int:
        """Open watch streams (tests use it to check streams are released)."""
        with self.lock:
            return len(self._watchers)

    def unwatch(self, watcher: Watcher) -> None:
        with self.lock:
            if watcher in self._watchers:
                self._watchers.remove(watcher)
        watcher.close()

    def close_all_watches(self) -> None:
        with self.lock:
            watchers, self._watchers = self._watchers, []
        for watcher in watchers:
            watcher.close()
