"""The API server, seen by the plugin: a watch cache of this node's pods, fresh reads, patches and Events.

Its requests go through node.apiclient.KubeClient, which owns the `kubernetes` client. Pods are plain dicts in the
API's own JSON shape.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from node.apiclient import ApiServerError, KubeClient, NotFound, describe

log = logging.getLogger(__name__)

COMPONENT = "gpushare-device-plugin"


class PodListener(Protocol):
    """Told every change the watch sees: a full listing, a pod added or changed, a pod gone, the watch broken."""

    def replace(self, pods: Sequence[Mapping[str, Any]]) -> None: ...

    def upsert(self, pod: Mapping[str, Any]) -> None: ...

    def remove(self, uid: str) -> None: ...

    def stale(self) -> None: ...


class ApiServer(Protocol):
    """What the plugin needs from the API server (tests use an in-memory fake of exactly this)."""

    def subscribe(self, listener: PodListener) -> None:
        """Feed `listener` from the watch of this node's pods: the cache at once (when synced), then each change."""
        ...

    def node_pods(self) -> list[dict[str, Any]]:
        """This node's pods from the watch cache (may lag behind by a moment)."""
        ...

    def list_node_pods(self) -> list[dict[str, Any]]:
        """This node's pods, freshly listed."""
        ...

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod read fresh, or None when it does not exist."""
        ...

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str], resource_version: str
    ) -> dict[str, Any]:
        """Set these annotations if the pod is still at resource_version (else raise Conflict)."""
        ...

    def create_event(self, pod: Mapping[str, Any], event_type: str, reason: str, message: str) -> None: ...

    def patch_node_capacity(self, capacity: Mapping[str, str]) -> None: ...


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(pod: Mapping[str, Any], event_type: str, reason: str, message: str, node: str) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    now = _now()
    return {
        "metadata": {"generateName": f"{meta.get('name', 'pod')}.", "namespace": meta.get("namespace")},
        "involvedObject": {
            "apiVersion": "v1", "kind": "Pod", "name": meta.get("name"), "namespace": meta.get("namespace"),
            "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message[:1024],  # Event messages are truncated by the API server beyond 1 KiB anyway
        "type": event_type,
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class KubeApiServer:
    """ApiServer over the kubernetes client: in-cluster config, or a kubeconfig file (GPUSHARE_KUBECONFIG)."""

    def __init__(self, node_name: str, kubeconfig: str, timeout: float) -> None:
        self._kube = KubeClient(kubeconfig, timeout)
        self.where = self._kube.where
        self._client = self._kube.client
        self._core = self._client.CoreV1Api(self._kube.api_client)
        self.node_name = node_name
        self.timeout = timeout
        self._selector = f"spec.nodeName={node_name}"
        self._cache: dict[str, dict[str, Any]] = {}
        self._listeners: list[PodListener] = []
        self._synced = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._watch_loop, name="pod-watch", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                # close() alone does not wake a read blocked in the watch thread; shutdown() (urllib3 >= 2.3)
                # shuts the socket down under it, so the thread ends now instead of at its join timeout.
                shutdown = getattr(response, "shutdown", None)
                if shutdown is not None:
                    shutdown()
                response.close()
            except Exception:  # closing a half-read stream may raise from urllib3; nothing to do
                log.debug("closing the pod watch stream failed", exc_info=True)
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._kube.close()

    def subscribe(self, listener: PodListener) -> None:
        with self._lock:  # the watch thread tells listeners under the same lock: no change slips between
            self._listeners.append(listener)
            if self._synced.is_set():
                listener.replace(list(self._cache.values()))

    # -- reads -----------------------------------------------------------------------------------------

    def node_pods(self) -> list[dict[str, Any]]:
        if not self._synced.is_set():
            return self.list_node_pods()
        with self._lock:
            return list(self._cache.values())

    def _list(self) -> dict[str, Any]:
        response = self._kube.call(
            "list this node's pods", self._core.list_pod_for_all_namespaces, field_selector=self._selector
        )
        return json.loads(response.data)  # type: ignore[no-any-return]

    def list_node_pods(self) -> list[dict[str, Any]]:
        return list(self._list().get("items") or [])

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._kube.read(f"read pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace)

    # -- writes ----------------------------------------------------------------------------------------

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str], resource_version: str
    ) -> dict[str, Any]:
        # A merge patch carrying metadata.resourceVersion is refused with 409 if the pod changed since.
        body = {"metadata": {"resourceVersion": resource_version, "annotations": dict(annotations)}}
        try:
            response = self._kube.call(
                f"patch the annotations of pod {namespace}/{name}", self._core.patch_namespaced_pod, name, namespace,
                body, _content_type="application/merge-patch+json",
            )
        except NotFound as exc:
            raise ApiServerError(f"pod {namespace}/{name} no longer exists") from exc
        return json.loads(response.data)  # type: ignore[no-any-return]

    def create_event(self, pod: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        body = event_body(pod, event_type, reason, message, self.node_name)
        event = self._client.CoreV1Event.from_dict(body)
        namespace = str(body["metadata"]["namespace"])
        self._kube.send(f"post an Event on pod {namespace}", self._core.create_namespaced_event, namespace, event)

    def patch_node_capacity(self, capacity: Mapping[str, str]) -> None:
        body = {"status": {"capacity": dict(capacity)}}
        self._kube.send(
            f"patch the capacity of node {self.node_name}", self._core.patch_node_status, self.node_name, body,
            _content_type="application/merge-patch+json",
        )

    # -- plumbing --------------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        from kubernetes.watch.watch import iter_resp_lines

        backoff = 0.5
        while not self._stop.is_set():
            try:
                listing = self._list()
                with self._lock:
                    self._cache = {p["metadata"]["uid"]: p for p in listing.get("items") or []}
                    for listener in self._listeners:
                        listener.replace(list(self._cache.values()))
                self._synced.set()
                version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
                while not self._stop.is_set():
                    self._response = self._core.list_pod_for_all_namespaces(
                        field_selector=self._selector, watch=True, resource_version=version,
                        allow_watch_bookmarks=True, timeout_seconds=240, _preload_content=False,
                        _request_timeout=(self.timeout, 300),
                    )
                    for line in iter_resp_lines(self._response):  # type: ignore[no-untyped-call]
                        version = self._apply(json.loads(line)) if line else version
                backoff = 0.5
            except _Expired:
                log.info("the pod watch expired; listing this node's pods again")
            except Exception as exc:
                if self._stop.is_set():
                    break
                self._synced.clear()  # serve fresh lists until the watch is back
                with self._lock:
                    for listener in self._listeners:
                        listener.stale()
                log.warning("Watching this node's pods at the API server %s failed (%s); retrying in %.1f s.",
                            self.where, describe(exc), backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _apply(self, event: Mapping[str, Any]) -> str:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            raise _Expired()
        meta = obj.get("metadata") or {}
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._cache[meta["uid"]] = obj
                for listener in self._listeners:
                    listener.upsert(obj)
            elif kind == "DELETED":
                self._cache.pop(meta.get("uid", ""), None)
                for listener in self._listeners:
                    listener.remove(str(meta.get("uid", "")))
        return str(meta.get("resourceVersion") or "")


class _Expired(Exception):
    pass
