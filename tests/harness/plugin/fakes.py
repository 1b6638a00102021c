"""Test doubles for the device plugin: its settings in a folder, an in-memory API server, kubelet holdings (pods:
tests/harness/pods.py)."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from deviceplugin.apiserver import PodListener
from deviceplugin.checkpoint import Checkpoint
from deviceplugin.kubelet import Holding, KubeletUnavailable
from deviceplugin.settings import PluginSettings, settings_from
from node.apiclient import ApiServerError, Conflict
from tests.harness.apiserver.status import ApiError
from tests.harness.apiserver.store import Store

NODE = "node-a"
PODS = "pods"  # the store's key, and the resource its errors name


def plugin_settings(tmp: str, **env: str) -> PluginSettings:
    base = {
        "GPUSHARE_NODE_NAME": NODE,
        "GPUSHARE_FAKE_GPUS": "2x8GiB",
        "GPUSHARE_DEVICE_PLUGIN_DIR": f"{tmp}/dp",
        "GPUSHARE_POD_RESOURCES_SOCKET": f"{tmp}/pr.sock",
        "GPUSHARE_CDI_DIR": f"{tmp}/cdi",
        "GPUSHARE_FAKE_GPU_DIR": f"{tmp}/fake-gpus",
        "GPUSHARE_RPC_TIMEOUT_SECONDS": "5",
        "GPUSHARE_METRICS_BIND": "127.0.0.1:0",
    }
    base.update(env)
    return settings_from(base)


class FakeApiServer:
    """A faithful in-memory stand-in for deviceplugin.apiserver.ApiServer: pods in the harness's versioned store
    (a resourceVersion on every write, 409 on a stale patch), this node's pods only in node_pods(), Events and
    patches recorded."""

    def __init__(self, node: str = NODE) -> None:
        self.node = node
        self._store = Store()
        self._lock = self._store.lock
        self.patches: list[tuple[str, dict[str, str]]] = []
        self.capacity: dict[str, str] = {}
        self.stale_cache = False  # node_pods() lags: it returns the pods as of the last refresh_cache()
        self._cache: list[dict[str, Any]] = []
        self._listeners: list[PodListener] = []
        self._fail = False
        self._posted: list[tuple[str, str, str, str]] = []
        self.settle: Callable[[], object] = lambda: None  # the rig sets it: wait for the plugin's queued Events

    @property
    def fail(self) -> bool:
        """True: every request fails as if the API server were unreachable, and the watch breaks with it."""
        return self._fail

    @fail.setter
    def fail(self, value: bool) -> None:
        self._fail = value
        with self._lock:
            pods = copy.deepcopy(self._node_pods())
        for listener in list(self._listeners):
            if value:
                listener.stale()  # as the real adapter's watch loop does when its stream breaks
            elif not self.stale_cache:
                listener.replace(pods)  # and lists again once it is back

    @property
    def events(self) -> list[tuple[str, str, str, str]]:
        """Events posted so far: (pod ref, type, reason, message), after those the plugin has queued are sent."""
        self.settle()
        return self._posted

    def subscribe(self, listener: PodListener) -> None:
        """Like the watch of the real adapter: the pods at once, then each change (or, with stale_cache, only
        what refresh_cache() shows)."""
        with self._lock:
            self._listeners.append(listener)
            pods = self._cache if self.stale_cache else self._node_pods()
        listener.replace(copy.deepcopy(pods))

    def _node_pods(self) -> list[dict[str, Any]]:
        return self._store.list(PODS, predicate=lambda p: p["spec"].get("nodeName") == self.node)[0]

    def _current(self, namespace: str, name: str) -> dict[str, Any]:
        pod = self._store.get(PODS, namespace, name)
        if pod is None:
            raise KeyError((namespace, name))
        return pod

    def _write(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Store a pod read under the lock: a new resourceVersion."""
        return self._store.replace(PODS, pod, pod["metadata"]["resourceVersion"], PODS)

    def _changed(self, pod: dict[str, Any] | None, uid: str = "") -> None:
        """Tell the listeners (outside the lock, like the watch thread), unless the cache is frozen."""
        if self.stale_cache:
            return
        for listener in list(self._listeners):
            if pod is None:
                listener.remove(uid)
            elif pod["spec"].get("nodeName") == self.node:
                listener.upsert(copy.deepcopy(pod))

    def add(self, pod: dict[str, Any], node: str | None = NODE, phase: str = "Pending") -> dict[str, Any]:
        with self._lock:
            stored = copy.deepcopy(pod)
            meta = stored["metadata"]
            meta.setdefault("uid", str(uuid.uuid4()))
            if node is not None:
                stored["spec"]["nodeName"] = node
            stored["status"] = {"phase": phase}
            replaced = self._store.get(PODS, meta["namespace"], meta["name"])
            if replaced is None:
                out = self._store.create(PODS, stored, PODS)
            else:
                out = self._store.replace(PODS, stored, replaced["metadata"]["resourceVersion"], PODS)
        if replaced is not None and replaced["metadata"]["uid"] != meta["uid"]:
            self._changed(None, replaced["metadata"]["uid"])
        self._changed(out)
        return copy.deepcopy(out)

    def delete(self, namespace: str, name: str) -> None:
        with self._lock:
            gone = self._store.get(PODS, namespace, name)
            if gone is not None:
                self._store.remove(PODS, namespace, name, None, PODS)
        if gone is not None:
            self._changed(None, gone["metadata"]["uid"])

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._current(namespace, name)

    def refresh_cache(self) -> None:
        with self._lock:
            self._cache = self._node_pods()
            listeners = list(self._listeners)
        for listener in listeners:
            listener.replace(copy.deepcopy(self._cache))

    def _check(self) -> None:
        if self.fail:
            raise ApiServerError("could not reach the API server: connection refused")

    def node_pods(self) -> list[dict[str, Any]]:
        self._check()
        if self.stale_cache:
            with self._lock:
                return copy.deepcopy(self._cache)
        return self.list_node_pods()

    def list_node_pods(self) -> list[dict[str, Any]]:
        self._check()
        return self._node_pods()

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._check()
        return self._store.get(PODS, namespace, name)

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str], resource_version: str
    ) -> dict[str, Any]:
        self._check()
        with self._lock:
            pod = self._store.get(PODS, namespace, name)
            if pod is None:
                raise ApiServerError(f"pod {namespace}/{name} no longer exists")
            pod["metadata"].setdefault("annotations", {}).update(annotations)
            try:
                out = self._store.replace(PODS, pod, resource_version, PODS)
            except ApiError as exc:
                raise Conflict(f"pod {namespace}/{name} changed meanwhile (409 Conflict)") from exc
            self.patches.append((f"{namespace}/{name}", dict(annotations)))
        self._changed(out)
        return copy.deepcopy(out)

    def update(self, namespace: str, name: str, *, deleting: bool = False,
               status: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """What the API server does on a graceful delete (a deletionTimestamp) and on the kubelet's status updates
        (`status` merged in): a new resourceVersion each, told to the watch."""
        with self._lock:
            pod = self._current(namespace, name)
            if deleting:
                pod["metadata"].setdefault("deletionTimestamp", "2026-01-02T03:04:05Z")
                pod["metadata"].setdefault("deletionGracePeriodSeconds", 30)
            pod["status"] = {**pod.get("status", {}), **(status or {})}
            out = self._write(pod)
        self._changed(out)
        return copy.deepcopy(out)

    def touch(self, namespace: str, name: str) -> None:
        """Someone else changed the pod (a status update): its resourceVersion moves on."""
        with self._lock:
            out = self._write(self._current(namespace, name))
        self._changed(out)

    def create_event(self, pod: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        self._check()
        meta = pod.get("metadata") or {}
        with self._lock:
            self._posted.append((f"{meta.get('namespace')}/{meta.get('name')}", event_type, reason, message))

    def patch_node_capacity(self, capacity: Mapping[str, str]) -> None:
        self._check()
        self.capacity.update(capacity)


@dataclass
class FakeHoldings:
    """Kubelet holdings set directly by a test (the socket-level tests use the real PodResources client)."""

    entries: list[Holding]
    recorded: list[Holding] = field(default_factory=list)
    stored: Checkpoint = field(default_factory=Checkpoint)  # what checkpoint() reads: the answers the kubelet keeps
    get: bool = False  # a kubelet with PodResources Get answers it from `entries`; without, the plugin lists
    unavailable: frozenset[str] = frozenset()  # "list", "checkpoint": refused as the real reader refuses them
    asked: list[str] = field(default_factory=list)  # "get ns/name", "list", "checkpoint", in order

    def holdings(self) -> list[Holding]:
        self.asked.append("list")
        if "list" in self.unavailable:
            raise KubeletUnavailable("the PodResources socket /var/lib/kubelet/pod-resources/kubelet.sock is missing")
        return list(self.entries)

    def from_checkpoint(self) -> list[Holding]:
        self.asked.append("checkpoint")
        if "checkpoint" in self.unavailable:
            raise KubeletUnavailable("the kubelet's checkpoint is unreadable")
        return list(self.recorded)

    def pod_holdings(self, namespace: str, name: str) -> list[Holding] | None:
        self.asked.append(f"get {namespace}/{name}")
        if not self.get:
            return None
        return [h for h in self.entries if (h.namespace, h.pod) == (namespace, name)]

    def checkpoint(self) -> Checkpoint:
        return self.stored
