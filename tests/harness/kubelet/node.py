"""A simulated kubelet: watches its node's pods, admits them serially, calls Allocate, pulls, PreStarts, starts."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from tests.harness.apiserver.ports import ApiError, Pod, PodApi
from tests.harness.kubelet.devices import DeviceState, Entry, Prefer, Unavailable
from tests.harness.kubelet.parts import KubeletConfig, PodState, containers_of, meta_of, started_status, waiting_status
from tests.harness.kubelet.runtime import ContainerRun, create_container
from tests.harness.kubelet.wire import (
    PluginConn,
    PodResourcesServer,
    RegistrationServer,
    TokenBucket,
    remove_sockets,
    rpc_error_text,
)

log = logging.getLogger(__name__)

__all__ = ["ContainerRun", "Kubelet", "KubeletConfig"]


class Kubelet:
    """One node. start()/stop() model a kubelet restart (sockets removed, checkpoint kept); close() ends it."""

    def __init__(self, config: KubeletConfig, api: PodApi) -> None:
        self.config = config
        self.api = api
        self.runs: list[ContainerRun] = []
        self.devices = DeviceState(config.checkpoint, config.resource)
        self._rng = random.Random(config.seed)
        self._lock = threading.Condition()
        self._pods: dict[str, PodState] = {}
        self._queue: list[str] = []
        self._images: dict[str, float] = {}
        self._closed = threading.Event()
        self._up = threading.Event()
        self._registered = threading.Event()
        self._inflight = 0
        self._threads: list[threading.Thread] = []
        for path in (config.plugin_dir, os.path.dirname(config.pod_resources_socket), config.cdi_dir):
            os.makedirs(path, exist_ok=True)
        self.registration = RegistrationServer(config.plugin_dir, config.resource, self._on_devices)
        self.pod_resources = PodResourcesServer(config.pod_resources_socket, self.devices, self._healthy,
                                                self._active_pods, TokenBucket(100.0, 10))

    # -- lifecycle --------------------------------------------------------------------------------------

    def start(self) -> None:
        names = {uid: (meta_of(s.pod).get("namespace", ""), meta_of(s.pod).get("name", "")) for uid, s in
                 self._snapshot().items()}
        self.devices.load(names)
        self.pod_resources.start()
        self.registration.start()
        self._up.set()
        if not self._threads:
            for target, name in ((self._watch_loop, "watch"), (self._admit_loop, "admit")):
                thread = threading.Thread(target=target, name=f"sim-kubelet-{self.config.node}-{name}", daemon=True)
                thread.start()
                self._threads.append(thread)

    def stop(self) -> None:
        """The kubelet process goes away: calls drain, servers stop, every socket in the plugin dir is removed."""
        with self._lock:
            self._up.clear()
            self._registered.clear()
            while self._inflight:
                self._lock.wait(1.0)
        self.registration.stop()
        self.pod_resources.stop()
        remove_sockets(self.config.plugin_dir)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self._closed.set()
        self.stop()
        with self._lock:
            states = list(self._pods.values())
            self._lock.notify_all()
        for state in states:
            state.cancel.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def wait_registered(self, timeout: float) -> bool:
        return self._registered.wait(timeout)

    @property
    def plugin(self) -> PluginConn | None:
        return self.registration.conn

    def _on_devices(self, conn: PluginConn | None) -> None:
        if conn is None:
            self._registered.clear()
            return
        self.devices.registered = list(conn.devices)
        self._registered.set()

    def _active_pods(self) -> list[Pod]:
        """The pods the kubelet still runs or will run: not finished, not failed at admission."""
        with self._lock:
            states = list(self._pods.values())
        return [s.pod for s in states if not s.cancel.is_set()
                and (s.pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    def _healthy(self) -> list[str]:
        conn = self.registration.conn
        return conn.healthy() if conn is not None else []

    @contextlib.contextmanager
    def _plugin_call(self) -> Iterator[PluginConn]:
        """Wait for a running kubelet with a registered plugin; a restart waits for the call to finish."""
        deadline = time.monotonic() + self.config.register_wait_s
        while True:
            if self._closed.is_set():
                raise _Closed
            with self._lock:
                conn = self.registration.conn
                if self._up.is_set() and self._registered.is_set() and conn is not None:
                    self._inflight += 1
                    break
            if time.monotonic() > deadline:
                raise _NoPlugin
            self._registered.wait(0.05)
        try:
            yield conn
        finally:
            with self._lock:
                self._inflight -= 1
                self._lock.notify_all()

    def _snapshot(self) -> dict[str, PodState]:
        with self._lock:
            return dict(self._pods)

    # -- watching ---------------------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        version = ""
        while not self._closed.is_set():
            try:
                if not version:
                    pods, version = self.api.list_pods(node=self.config.node)
                    listed = {meta_of(p).get("uid") for p in pods}
                    for uid, state in self._snapshot().items():
                        if uid not in listed:  # removed while we were not watching
                            self._on_pod("DELETED", state.pod)
                    for pod in pods:
                        self._on_pod("ADDED", pod)
                for kind, pod in self.api.watch_pods(version, node=self.config.node, timeout_s=0.5):
                    version = meta_of(pod).get("resourceVersion", version)
                    self._on_pod(kind, pod)
            except ApiError as exc:
                if exc.code == 410:
                    version = ""
                self._closed.wait(0.1)
            except Exception:  # the watch must survive a flaky server: log, back off, watch again
                log.exception("kubelet %s: watching pods failed; retrying", self.config.node)
                self._closed.wait(0.1)

    def _on_pod(self, kind: str, pod: Pod) -> None:
        uid = meta_of(pod).get("uid", "")
        with self._lock:
            state = self._pods.get(uid)
            if kind == "DELETED":
                if state is not None:
                    state.pod = pod
                    self._spawn(self._terminate, uid, False)
                return
            if state is None:
                state = PodState(pod)
                self._pods[uid] = state
                if meta_of(pod).get("deletionTimestamp"):
                    state.terminating = True
                    self._spawn(self._terminate, uid, True)
                elif (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    self._queue.append(uid)
                    self._lock.notify_all()
                return
            state.pod = pod
            if meta_of(pod).get("deletionTimestamp") and not state.terminating:
                state.terminating = True
                self._spawn(self._terminate, uid, True)

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        threading.Thread(target=target, args=args, name=f"sim-kubelet-{self.config.node}-pod", daemon=True).start()

    # -- admission: serial, sorted by creation time within a batch -------------------------------------

    def _admit_loop(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                while not self._queue and not self._closed.is_set():
                    self._lock.wait(0.5)
                batch = [self._pods[u] for u in self._queue if u in self._pods]
                self._queue.clear()
            batch.sort(key=lambda s: (meta_of(s.pod).get("creationTimestamp", ""), meta_of(s.pod).get("name", "")))
            for state in batch:
                if self._closed.is_set():
                    return
                if not state.terminating:
                    self._admit(state)

    def _pulled_at(self, pod: Pod) -> float:
        """When this pod's images are on the node: the first pod of an image pulls it, later ones wait for that
        pull or find the image present (images survive kubelet restarts)."""
        spec = pod.get("spec") or {}
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        images = {str(c.get("image", "")) for c in containers}
        ready = time.monotonic()
        with self._lock:
            for image in sorted(images):
                if image not in self._images:
                    self._images[image] = time.monotonic() + self.config.pull_delay(pod)
                ready = max(ready, self._images[image])
        return ready

    def _admit(self, state: PodState) -> None:
        pod = state.pod
        uid = meta_of(pod).get("uid", "")
        for container, init, units in containers_of(self.config.resource, pod):
            if not units or self.devices.entry(uid, container["name"]) is not None:
                continue
            try:
                with self._plugin_call() as conn:
                    ids = self.devices.pick(uid, units, conn.healthy(), self._rng, self._prefer(conn))
                    response = conn.allocate(ids, self.config.rpc_timeout_s)
            except _Closed:
                return
            except _NoPlugin:
                return self._reject(state, f"no healthy devices present; cannot allocate unhealthy devices "
                                           f"{self.config.resource}")
            except Unavailable as exc:
                return self._reject(state, str(exc))
            except grpc.RpcError as exc:
                return self._reject(state, rpc_error_text(exc))
            if len(response.container_responses) != 1:
                return self._reject(state, f"the plugin returned {len(response.container_responses)} container "
                                           "responses for 1 container request")
            restartable = container.get("restartPolicy") == "Always"
            entry = Entry(uid, meta_of(pod).get("namespace", ""), meta_of(pod).get("name", ""), container["name"],
                          self.config.resource, tuple(ids), response.container_responses[0].SerializeToString())
            self.devices.record(entry, init, restartable)
        with self._lock:
            if state.cancel.is_set():  # deleted while being admitted: the termination already ran
                self.devices.release(uid)
                return
            state.admitted = True
            state.worker = threading.Thread(target=self._work, args=(state,), daemon=True,
                                            name=f"sim-kubelet-{self.config.node}-worker")
            state.worker.start()

    def _prefer(self, conn: PluginConn) -> Prefer | None:
        """GetPreferredAllocation, when the plugin offers it; the kubelet takes its answer (manager.go)."""
        if not conn.options.get_preferred_allocation_available:
            return None
        return lambda available, must, size: conn.preferred(available, must, size, self.config.rpc_timeout_s)

    def _reject(self, state: PodState, cause: str) -> None:
        meta = meta_of(state.pod)
        self.devices.release(meta.get("uid", ""))
        message = f"Allocate failed due to {cause}, which is unexpected"
        self._status(state, {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": message})
        self._event(state, "UnexpectedAdmissionError", message)

    # -- the pod worker: pull, then start init containers in order, then app containers -----------------

    def _work(self, state: PodState) -> None:
        interrupt = state.cancel if self.config.cancel_pull else self._closed
        interrupt.wait(max(0.0, self._pulled_at(state.pod) - time.monotonic()))
        if self._closed.is_set():
            return
        if state.cancel.is_set():
            if self.config.start_deleted:  # the sync in flight tries its first container once
                for container, init, units in containers_of(self.config.resource, state.pod)[:1]:
                    self._start_container(state, container, init, units)
            return
        statuses: list[dict[str, Any]] = []
        init_statuses: list[dict[str, Any]] = []
        for container, init, units in containers_of(self.config.resource, state.pod):
            error = self._start_container(state, container, init, units)
            if state.cancel.is_set():
                return
            if error is not None:
                reason, message = error
                key = "initContainerStatuses" if init else "containerStatuses"
                waiting = waiting_status(container["name"], reason, message)
                self._status(state, {"phase": "Pending", key: [*(init_statuses if init else statuses), waiting]})
                return
            (init_statuses if init else statuses).append(started_status(container, init))
        self._status(state, {"phase": "Running", "initContainerStatuses": init_statuses,
                             "containerStatuses": statuses,
                             "conditions": [{"type": "Ready", "status": "True"}]})

    def _start_container(
        self, state: PodState, container: dict[str, Any], init: bool, units: int
    ) -> tuple[str, str] | None:
        """Start one container with bounded retries; None on success, else (reason, message) of the last try."""
        uid = meta_of(state.pod).get("uid", "")
        last: tuple[str, str] = ("CreateContainerError", "not attempted")
        for attempt in range(self.config.start_attempts):
            if attempt and state.cancel.wait(self.config.backoff_s * 2 ** (attempt - 1)):
                return last
            entry = self.devices.entry(uid, container["name"])
            try:
                if entry is not None:
                    with self._plugin_call() as conn:
                        if conn.options.pre_start_required:
                            conn.pre_start(list(entry.device_ids), 30.0)  # the kubelet's PreStart timeout
            except (_Closed, _NoPlugin):
                last = ("CreateContainerError", "the device plugin is not registered with the kubelet")
                continue
            except grpc.RpcError as exc:
                last = ("CreateContainerError", f"PreStartContainer failed for container {container['name']!r}: "
                                                f"{rpc_error_text(exc)}")
                continue
            failure = self._launch(state, container, init, units, entry)
            if failure is None:
                return None
            last = failure
        return last

    def _launch(
        self, state: PodState, container: dict[str, Any], init: bool, units: int, entry: Entry | None
    ) -> tuple[str, str] | None:
        meta = meta_of(state.pod)
        current = self.api.get_pod(meta.get("namespace", ""), meta.get("name", ""))
        if current is None or meta_of(current).get("uid") != meta.get("uid"):
            state.cancel.set()
            return ("ContainerCreating", "the pod is gone")
        response = entry.allocate_response() if entry is not None else None
        run = create_container(self.config.node, self.config.gpus, self.config.cdi_dir, current, container, init,
                               units, response, self.config.env_interface)
        self.runs.append(run)
        return None if run.error is None else (run.reason, run.error)

    # -- deletion ----------------------------------------------------------------------------------------

    def _terminate(self, uid: str, confirm: bool) -> None:
        with self._lock:
            state = self._pods.get(uid)
        if state is None:
            return
        with self._lock:
            state.cancel.set()
            worker = state.worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout=10)
        self.devices.release(uid)
        meta = meta_of(state.pod)
        if confirm:
            with contextlib.suppress(ApiError):
                self.api.delete_pod(meta.get("namespace", ""), meta.get("name", ""), grace_seconds=0)
        else:
            with self._lock:
                self._pods.pop(uid, None)

    # -- API writes as system:node:<node> ------------------------------------------------------------------

    def _status(self, state: PodState, status: dict[str, Any]) -> None:
        meta = meta_of(state.pod)
        try:
            self.api.patch_pod_status(meta.get("namespace", ""), meta.get("name", ""), {"status": status})
        except ApiError as exc:
            log.info("kubelet %s: status of %s/%s not written: %s", self.config.node, meta.get("namespace"),
                     meta.get("name"), exc.message)

    def _event(self, state: PodState, reason: str, message: str) -> None:
        meta = meta_of(state.pod)
        event = {"metadata": {"generateName": f"{meta.get('name')}."}, "type": "Warning", "reason": reason,
                 "message": message, "involvedObject": {"kind": "Pod", "namespace": meta.get("namespace"),
                                                        "name": meta.get("name"), "uid": meta.get("uid")},
                 "source": {"component": "kubelet", "host": self.config.node}}
        with contextlib.suppress(ApiError):
            self.api.create_event(meta.get("namespace", ""), event)

    # -- what the invariants read -------------------------------------------------------------------------

    def live_pods(self) -> dict[str, Pod]:
        with self._lock:
            return {uid: s.pod for uid, s in self._pods.items()}


class _Closed(Exception):
    pass


class _NoPlugin(Exception):
    pass
