"""The small API-server interface the simulated actors use, and an in-memory store that implements it."""

from __future__ import annotations

import copy
import queue
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from tests.harness.apiserver.patching import merge_patch, strategic_merge
from tests.harness.apiserver.status import ApiError
from tests.harness.apiserver.store import Store

Pod = dict[str, Any]
__all__ = ["ApiError", "MemoryStore", "Pod", "PodApi"]
PODS = "pods"  # the store's key, and the resource its errors name


class PodApi(Protocol):
    """Pod operations as one identity (the kubelet as system:node:<n>, the extender as its service account)."""

    @property
    def user(self) -> str: ...

    def list_pods(self, *, node: str | None = None, label_selector: str | None = None) -> tuple[list[Pod], str]:
        """Pods in every namespace, and the list's resourceVersion to watch from."""
        ...

    def watch_pods(
        self, resource_version: str, *, node: str | None = None, label_selector: str | None = None,
        timeout_s: float = 1.0,
    ) -> Iterator[tuple[str, Pod]]:
        """(ADDED|MODIFIED|DELETED, pod) after resource_version, ending after timeout_s; ApiError 410 if too old."""
        ...

    def get_pod(self, namespace: str, name: str) -> Pod | None: ...

    def create_pod(self, namespace: str, pod: Pod) -> Pod: ...

    def patch_pod(self, namespace: str, name: str, merge_patch: Mapping[str, Any], *, strategic: bool = False) -> Pod:
        """A JSON merge patch, or with `strategic` a strategic-merge patch (what the real extender sends)."""
        ...

    def patch_pod_status(self, namespace: str, name: str, merge_patch: Mapping[str, Any]) -> Pod: ...

    def bind(self, namespace: str, name: str, node: str) -> None: ...

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None: ...

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None: ...


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def selector_matches(labels: Mapping[str, str], selector: str | None) -> bool:
    """Equality-based label selectors (`a=b,c=d`), which is all the actors use."""
    if not selector:
        return True
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


class MemoryStore:
    """Pods in the harness's versioned store (tests/harness/apiserver/store.py), watched from any resourceVersion; no
    admission chain. Used by the actors' own unit tests, where the HTTPS test API server would only slow them down.
    """

    def __init__(self) -> None:
        self.store = Store()
        self.events: list[dict[str, Any]] = []

    def client(self, user: str) -> MemoryClient:
        return MemoryClient(self, user)

    def current(self, namespace: str, name: str) -> Pod:
        pod = self.store.get(PODS, namespace, name)
        if pod is None:
            raise ApiError(404, f'pods "{name}" not found in namespace {namespace}')
        return pod

    def write(self, pod: Pod) -> Pod:
        """Store a changed pod read under `store.lock`: a new resourceVersion and a MODIFIED event."""
        return self.store.replace(PODS, pod, pod["metadata"]["resourceVersion"], PODS)


def _visible(pod: Pod, node: str | None, selector: str | None) -> bool:
    if node is not None and (pod.get("spec") or {}).get("nodeName") != node:
        return False
    return selector_matches((pod.get("metadata") or {}).get("labels") or {}, selector)


class MemoryClient:
    """One identity's view of a MemoryStore; implements PodApi."""

    def __init__(self, memory: MemoryStore, user: str) -> None:
        self._memory = memory
        self._store = memory.store
        self._user = user

    @property
    def user(self) -> str:
        return self._user

    def list_pods(self, *, node: str | None = None, label_selector: str | None = None) -> tuple[list[Pod], str]:
        pods, rv = self._store.list(PODS, predicate=lambda p: _visible(p, node, label_selector))
        return pods, str(rv)

    def watch_pods(
        self, resource_version: str, *, node: str | None = None, label_selector: str | None = None,
        timeout_s: float = 1.0,
    ) -> Iterator[tuple[str, Pod]]:
        # Every change after the version, filtered here rather than by the store, so that a pod leaving the
        # selection arrives as it is (MODIFIED) rather than as DELETED.
        watcher = self._store.watch(PODS, None, int(resource_version or "0"), lambda _: True)
        deadline = time.monotonic() + timeout_s
        try:
            while (left := deadline - time.monotonic()) > 0:
                try:
                    event = watcher.events.get(timeout=left)
                except queue.Empty:
                    return
                if event is None:
                    return
                if _visible(event.obj, node, label_selector):
                    yield event.type, event.obj
        finally:
            self._store.unwatch(watcher)

    def get_pod(self, namespace: str, name: str) -> Pod | None:
        return self._store.get(PODS, namespace, name)

    def create_pod(self, namespace: str, pod: Pod) -> Pod:
        body = copy.deepcopy(pod)
        meta = body.setdefault("metadata", {})
        if not meta.get("name"):
            meta["name"] = str(meta.get("generateName") or "pod-") + uuid.uuid4().hex[:5]
        meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
        body.setdefault("status", {"phase": "Pending"})
        return self._store.create(PODS, body, PODS)

    def _patch(self, namespace: str, name: str, patch: Mapping[str, Any], strategic: bool = False) -> Pod:
        with self._store.lock:
            pod = self._memory.current(namespace, name)
            merged = strategic_merge(pod, dict(patch)) if strategic else merge_patch(pod, dict(patch))
            merged["metadata"]["resourceVersion"] = pod["metadata"]["resourceVersion"]
            return self._memory.write(merged)

    def patch_pod(self, namespace: str, name: str, merge_patch: Mapping[str, Any], *, strategic: bool = False) -> Pod:
        return self._patch(namespace, name, {k: v for k, v in merge_patch.items() if k != "status"}, strategic)

    def patch_pod_status(self, namespace: str, name: str, merge_patch: Mapping[str, Any]) -> Pod:
        return self._patch(namespace, name, {"status": merge_patch.get("status") or {}})

    def bind(self, namespace: str, name: str, node: str) -> None:
        with self._store.lock:
            pod = self._memory.current(namespace, name)
            if pod["spec"].get("nodeName"):
                raise ApiError(409, f"pod {name} is already assigned to node {pod['spec']['nodeName']}")
            pod["spec"]["nodeName"] = node
            self._memory.write(pod)

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        with self._store.lock:
            pod = self._memory.current(namespace, name)
            bound = bool(pod["spec"].get("nodeName"))
            if grace_seconds == 0 or not bound or pod["status"].get("phase") in ("Succeeded", "Failed"):
                self._store.remove(PODS, namespace, name, None, PODS)
            elif not pod["metadata"].get("deletionTimestamp"):
                pod["metadata"]["deletionTimestamp"] = now_rfc3339()
                pod["metadata"]["deletionGracePeriodSeconds"] = 30 if grace_seconds is None else grace_seconds
                self._memory.write(pod)

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        with self._store.lock:
            self._memory.events.append({"namespace": namespace, **event})
