"""The small API-server interface the simulated actors use, and an in-memory store that implements it."""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from tests.harness.apiserver.patching import strategic_merge
from tests.harness.apiserver.status import ApiError

Pod = dict[str, Any]
__all__ = ["ApiError", "MemoryStore", "Pod", "PodApi"]


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


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what `application/merge-patch+json` does)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


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
    """Pods in memory with resourceVersions and a replayable event log; no admission chain.

    Used by the actors' own unit tests, where the HTTPS test API server would only slow them down.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._rv = 0
        self._pods: dict[tuple[str, str], Pod] = {}
        self._log: list[tuple[int, str, Pod]] = []
        self.events: list[dict[str, Any]] = []

    def client(self, user: str) -> MemoryClient:
        return MemoryClient(self, user)

    def _emit(self, kind: str, pod: Pod) -> Pod:
        self._rv += 1
        pod["metadata"]["resourceVersion"] = str(self._rv)
        self._log.append((self._rv, kind, copy.deepcopy(pod)))
        self._lock.notify_all()
        return copy.deepcopy(pod)

    def _get(self, namespace: str, name: str) -> Pod:
        pod = self._pods.get((namespace, name))
        if pod is None:
            raise ApiError(404, f'pods "{name}" not found in namespace {namespace}')
        return pod


def _visible(pod: Pod, node: str | None, selector: str | None) -> bool:
    if node is not None and (pod.get("spec") or {}).get("nodeName") != node:
        return False
    return selector_matches((pod.get("metadata") or {}).get("labels") or {}, selector)


class MemoryClient:
    """One identity's view of a MemoryStore; implements PodApi."""

    def __init__(self, store: MemoryStore, user: str) -> None:
        self._store = store
        self._user = user

    @property
    def user(self) -> str:
        return self._user

    def list_pods(self, *, node: str | None = None, label_selector: str | None = None) -> tuple[list[Pod], str]:
        with self._store._lock:
            pods = [copy.deepcopy(p) for p in self._store._pods.values() if _visible(p, node, label_selector)]
            return pods, str(self._store._rv)

    def watch_pods(
        self, resource_version: str, *, node: str | None = None, label_selector: str | None = None,
        timeout_s: float = 1.0,
    ) -> Iterator[tuple[str, Pod]]:
        since = int(resource_version or "0")
        deadline = time.monotonic() + timeout_s
        while True:
            with self._store._lock:
                batch = [(rv, k, copy.deepcopy(p)) for rv, k, p in self._store._log if rv > since]
                if not batch:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._store._lock.wait(left)
                    continue
            for rv, kind, pod in batch:
                since = rv
                if _visible(pod, node, label_selector):
                    yield kind, pod

    def get_pod(self, namespace: str, name: str) -> Pod | None:
        with self._store._lock:
            pod = self._store._pods.get((namespace, name))
            return copy.deepcopy(pod) if pod is not None else None

    def create_pod(self, namespace: str, pod: Pod) -> Pod:
        with self._store._lock:
            body = copy.deepcopy(pod)
            meta = body.setdefault("metadata", {})
            if not meta.get("name"):
                meta["name"] = str(meta.get("generateName") or "pod-") + uuid.uuid4().hex[:5]
            if (namespace, meta["name"]) in self._store._pods:
                raise ApiError(409, f'pods "{meta["name"]}" already exists')
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
            body.setdefault("status", {"phase": "Pending"})
            self._store._pods[(namespace, meta["name"])] = body
            return self._store._emit("ADDED", body)

    def _patch(self, namespace: str, name: str, patch: Mapping[str, Any], strategic: bool = False) -> Pod:
        with self._store._lock:
            pod = self._store._get(namespace, name)
            merged = strategic_merge(pod, dict(patch)) if strategic else merge_patch(pod, patch)
            self._store._pods[(namespace, name)] = merged
            return self._store._emit("MODIFIED", merged)

    def patch_pod(self, namespace: str, name: str, merge_patch: Mapping[str, Any], *, strategic: bool = False) -> Pod:
        return self._patch(namespace, name, {k: v for k, v in merge_patch.items() if k != "status"}, strategic)

    def patch_pod_status(self, namespace: str, name: str, merge_patch: Mapping[str, Any]) -> Pod:
        return self._patch(namespace, name, {"status": merge_patch.get("status") or {}})

    def bind(self, namespace: str, name: str, node: str) -> None:
        with self._store._lock:
            pod = self._store._get(namespace, name)
            if pod["spec"].get("nodeName"):
                raise ApiError(409, f"pod {name} is already assigned to node {pod['spec']['nodeName']}")
            pod["spec"]["nodeName"] = node
            self._store._emit("MODIFIED", pod)

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        with self._store._lock:
            pod = self._store._get(namespace, name)
            bound = bool(pod["spec"].get("nodeName"))
            if grace_seconds == 0 or not bound or pod["status"].get("phase") in ("Succeeded", "Failed"):
                del self._store._pods[(namespace, name)]
                self._store._emit("DELETED", pod)
            elif not pod["metadata"].get("deletionTimestamp"):
                pod["metadata"]["deletionTimestamp"] = now_rfc3339()
                pod["metadata"]["deletionGracePeriodSeconds"] = 30 if grace_seconds is None else grace_seconds
                self._store._emit("MODIFIED", pod)

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        with self._store._lock:
            self._store.events.append({"namespace": namespace, **event})
