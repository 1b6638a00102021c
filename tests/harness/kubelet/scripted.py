"""The test kubelet driven call by call, for the plugin's unit tests: the same servers, plugin client and device
manager as the simulated cluster's kubelet (wire.py, devices.py), with the tests, not a pod watch, deciding when a
pod's containers are admitted, started and forgotten.

What differs from node.py on purpose: no API server (a test names the pods it admits; `uid_of` gives their UIDs),
no rate limit on PodResources and its Get gate off unless a test turns it on (tests pace the calls themselves), and
`admit(..., pick=...)` hands Allocate exactly the IDs a test names, known or not, so that a test can make the kubelet
ask for what a real one might.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import grpc

from contract.keys import DEFAULT_RESOURCE
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc, podresources_pb2
from tests.harness.kubelet.devices import DeviceState, Entry
from tests.harness.kubelet.wire import PluginConn, PodResourcesServer, Registered, RegistrationServer, remove_sockets

RESOURCE = DEFAULT_RESOURCE
CALL_TIMEOUT_S = 20
PRE_START_TIMEOUT_S = 30  # the kubelet's PreStartContainer timeout
T = TypeVar("T")


@dataclass
class Admitted:
    """What the kubelet keeps per container after Allocate: its device IDs and the plugin's answer."""

    namespace: str
    pod: str
    container: str
    device_ids: list[str]
    response: pb.ContainerAllocateResponse


@dataclass
class _Counts:
    preferred_calls: int = 0


class _PodResources(Generic[T]):
    """An attribute of the kubelet's PodResources server, read and set through the kubelet."""

    def __init__(self, name: str, copy: Callable[[T], T] = lambda value: value) -> None:
        self.name = name
        self.copy = copy

    def __get__(self, kubelet: TestKubelet, owner: type | None = None) -> T:
        return cast(T, getattr(kubelet.pod_resources, self.name))

    def __set__(self, kubelet: TestKubelet, value: T) -> None:
        setattr(kubelet.pod_resources, self.name, self.copy(value))


class TestKubelet:
    __test__ = False  # not a pytest class

    def __init__(self, plugin_dir: str, pod_resources_socket: str,
                 uid_of: Callable[[str, str], str] = lambda namespace, pod: f"uid-{namespace}-{pod}",
                 minor: int = 34) -> None:
        self.plugin_dir = plugin_dir
        self.uid_of = uid_of  # the pod UID the checkpoint records
        self.pod_resources_socket = pod_resources_socket
        self.devices = DeviceState(os.path.join(plugin_dir, "kubelet_internal_checkpoint"), RESOURCE)
        self.registration = RegistrationServer(plugin_dir, RESOURCE, self._on_devices, minor)  # how it keeps clients
        self.pod_resources = PodResourcesServer(pod_resources_socket, self.devices, self._healthy,
                                                self._active_pods, limit=None, get_enabled=False,
                                                pod_named=self._active_pod)
        self.pod_resources.list_hook = self.listing  # a subclass's override is what List answers
        self.counts = _Counts()
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}  # the pods PodResources reports, as specs
        self._uids: dict[tuple[str, str], str] = {}  # what uid_of gave at admission (the pod may be gone since)
        self._rng = random.Random(0)
        self._lock = threading.Lock()

    # -- servers ---------------------------------------------------------------------------------------

    def start(self) -> None:
        os.makedirs(self.plugin_dir, exist_ok=True)
        self.registration.start()
        self.pod_resources.start()

    def restart(self) -> None:
        """What a kubelet restart looks like to a plugin: every socket in the directory is deleted, then a new
        kubelet.sock is served."""
        self.registration.stop()
        remove_sockets(self.plugin_dir)
        self.registration.start()

    def stop(self) -> None:
        self.registration.stop()
        self.pod_resources.stop()

    def close_plugin_channel(self) -> None:
        self.registration.disconnect()

    # -- what tests read and set -----------------------------------------------------------------------

    @property
    def changed(self) -> threading.Condition:
        return self.registration.changed

    @property
    def registered(self) -> list[Registered]:
        with self.changed:
            return list(self.registration.registered)

    @property
    def lists_seen(self) -> int:
        return self.registration.lists_seen

    list_calls = _PodResources[int]("list_calls")
    list_failures = _PodResources[list[grpc.StatusCode]]("failures", list)  # a copy: the server consumes it
    get_enabled = _PodResources[bool]("get_enabled")
    get_calls = _PodResources[int]("get_calls")

    @property
    def checkpoint_path(self) -> str:
        return self.devices.checkpoint_path

    # -- the plugin side -------------------------------------------------------------------------------

    def wait_registrations(self, count: int, timeout: float = 20) -> list[Registered]:
        return self.registration.wait_registrations(count, timeout)

    def _conn(self, listed: bool = False, timeout: float = 20) -> PluginConn:
        """The plugin's current connection; with `listed`, once its ListAndWatch has sent the devices."""
        def ready() -> bool:
            conn = self.registration.conn
            return conn is not None and (conn.lists > 0 or not listed)

        with self.changed:
            self.changed.wait_for(ready, timeout)
            conn = self.registration.conn
        if conn is None or not ready():
            raise AssertionError(f"no plugin registered with the test kubelet and listed its devices within "
                                 f"{timeout:g} s")
        return conn

    def plugin(self) -> deviceplugin_pb2_grpc.DevicePluginStub:
        """A client of the registered plugin, over the kubelet's own connection (its ListAndWatch is followed)."""
        return deviceplugin_pb2_grpc.DevicePluginStub(self._conn().channel)  # type: ignore[no-untyped-call]

    def _on_devices(self, conn: PluginConn | None) -> None:
        if conn is not None:
            self.devices.registered = list(conn.devices)

    def wait_lists(self, count: int, timeout: float = 20) -> dict[str, str]:
        with self.changed:
            self.changed.wait_for(lambda: self.registration.lists_seen >= count, timeout)
            conn = self.registration.conn
            return dict(conn.devices) if conn is not None else {}

    def _healthy(self) -> list[str]:
        conn = self.registration.conn
        return conn.healthy() if conn is not None else []

    def free_devices(self) -> list[str]:
        used = self.devices.in_use()
        return sorted(d for d in self._healthy() if d not in used)

    def admit(
        self, namespace: str, pod: str, containers: Sequence[tuple[str, int]], init: Sequence[tuple[str, int]] = (),
        pick: Sequence[str] | None = None, sidecars: Sequence[str] = (),
    ) -> list[Admitted]:
        """Allocate like the kubelet (manager.go, Allocate and devicesToAllocate): init containers first, one call
        per container; a container takes the devices of the pod's finished regular init containers first, then
        what GetPreferredAllocation answers (or `pick`); the assignment is recorded, and the checkpoint written,
        after Allocate returns. `sidecars` names the restartable init containers."""
        conn = self._conn(listed=True)
        uid = self._uid(namespace, pod)
        out = []
        for kind, entries in (("init", init), ("app", containers)):
            for name, units in entries:
                ids = self._choose(conn, uid, units, pick)
                answer = conn.allocate(ids, CALL_TIMEOUT_S)
                role = "sidecar" if name in sidecars else kind
                self.hold(namespace, pod, name, ids, role, answer.container_responses[0])
                out.append(Admitted(namespace, pod, name, list(ids), answer.container_responses[0]))
        return out

    def _choose(self, conn: PluginConn, uid: str, units: int, pick: Sequence[str] | None) -> list[str]:
        if pick is None:
            return self.devices.pick(uid, units, conn.healthy(), self._rng, self._prefer(conn))
        ids = self.devices.reusable(uid)[:units]
        used = self.devices.in_use() | set(ids)
        return ids + [d for d in pick if d not in used][: units - len(ids)]

    def _prefer(self, conn: PluginConn) -> Callable[[list[str], list[str], int], list[str]]:
        def prefer(available: list[str], must: list[str], size: int) -> list[str]:
            self.counts.preferred_calls += 1
            return conn.preferred(available, must, size, CALL_TIMEOUT_S)

        return prefer

    def hold(self, namespace: str, pod: str, container: str, ids: Sequence[str], kind: str = "app",
             response: pb.ContainerAllocateResponse | None = None) -> None:
        """Record that a container holds `ids` (kind "app", "init" or "sidecar"), in PodResources and the
        checkpoint, as the kubelet does once Allocate returned; with no `response`, as if the plugin answered
        nothing."""
        uid = self._uid(namespace, pod)
        with self._lock:
            spec = self._pods.setdefault((namespace, pod), {
                "metadata": {"uid": uid, "name": pod, "namespace": namespace},
                "spec": {"initContainers": [], "containers": []}})["spec"]
            for group in (spec["initContainers"], spec["containers"]):
                group[:] = [c for c in group if c["name"] != container]
            if kind == "app":
                spec["containers"].append({"name": container})
            else:
                spec["initContainers"].append({"name": container, **({"restartPolicy": "Always"}
                                                                       if kind == "sidecar" else {})})
        entry = Entry(uid, namespace, pod, container, RESOURCE, tuple(ids),
                      (response or pb.ContainerAllocateResponse()).SerializeToString())
        self.devices.record(entry, init=kind != "app", restartable=kind == "sidecar")

    def start_container(self, namespace: str, pod: str, container: str) -> None:
        entry = self.devices.entry(self._uid(namespace, pod), container)
        if entry is None:
            raise AssertionError(f"the test kubelet admitted no container {namespace}/{pod}/{container}")
        self._conn().pre_start(list(entry.device_ids), PRE_START_TIMEOUT_S)

    def forget(self, namespace: str, pod: str) -> None:
        """The pod is gone from the kubelet (deleted): its devices are free again."""
        uid = self._uid(namespace, pod)
        with self._lock:
            self._pods.pop((namespace, pod), None)
        self.devices.release(uid)

    def write_checkpoint(self) -> None:
        """kubelet_internal_checkpoint as v1.34 writes it (checkpoint/checkpoint.go): every container, init
        containers included, DeviceIDs per NUMA node ("-1": no topology), by temp file and rename."""
        self.devices.save()

    def _uid(self, namespace: str, pod: str) -> str:
        with self._lock:
            uid = self._uids.get((namespace, pod))
        if uid is None:
            uid = self.uid_of(namespace, pod)
            with self._lock:
                self._uids[(namespace, pod)] = uid
        return uid

    def _active_pods(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._pods.values())

    def _active_pod(self, namespace: str, pod: str) -> dict[str, Any] | None:
        with self._lock:
            return self._pods.get((namespace, pod))

    def listing(self) -> podresources_pb2.ListPodResourcesResponse:
        """What PodResources List answers (tests may override it)."""
        return self.pod_resources.listing()
