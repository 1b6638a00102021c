"""An in-process test kubelet over real unix sockets: Registration and PodResourcesLister servers from our
protos, and a real DevicePlugin client that allocates devices and starts containers like the kubelet does."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import grpc

from contract.keys import DEFAULT_RESOURCE
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc, podresources_pb2, podresources_pb2_grpc

RESOURCE = DEFAULT_RESOURCE


@dataclass
class Registered:
    request: pb.RegisterRequest
    plugin_was_serving: bool


@dataclass
class Admitted:
    """What the kubelet keeps per container after Allocate: its device IDs and the plugin's answer."""

    namespace: str
    pod: str
    container: str
    device_ids: list[str]
    response: pb.ContainerAllocateResponse


@dataclass
class _State:
    registrations: list[Registered] = field(default_factory=list)
    assignments: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    kinds: dict[tuple[str, str, str], str] = field(default_factory=dict)  # "init", "sidecar" or "app"
    devices: dict[str, str] = field(default_factory=dict)  # device ID -> health, from ListAndWatch
    lists_seen: int = 0
    preferred_calls: int = 0


class TestKubelet:
    __test__ = False  # not a pytest class

    def __init__(self, plugin_dir: str, pod_resources_socket: str,
                 uid_of: Callable[[str, str], str] = lambda namespace, pod: f"uid-{namespace}-{pod}") -> None:
        self.plugin_dir = plugin_dir
        self.uid_of = uid_of  # the pod UID the checkpoint records
        self.pod_resources_socket = pod_resources_socket
        self.state = _State()
        self.changed = threading.Condition()
        self._registration: grpc.Server | None = None
        self._pod_resources: grpc.Server | None = None
        self._channel: grpc.Channel | None = None
        self._watch: threading.Thread | None = None
        self.list_calls = 0
        self.list_failures: list[grpc.StatusCode] = []  # answers of the next List calls, before real ones
        # PodResources Get: on by default from Kubernetes 1.34 (gate KubeletPodResourcesGet), off here unless asked.
        self.get_enabled = False
        self.get_calls = 0

    # -- servers ---------------------------------------------------------------------------------------

    def start(self) -> None:
        os.makedirs(self.plugin_dir, exist_ok=True)
        self._start_registration()
        self._pod_resources = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(  # type: ignore[no-untyped-call]
            _Lister(self), self._pod_resources
        )
        self._pod_resources.add_insecure_port("unix://" + self.pod_resources_socket)
        self._pod_resources.start()

    def _start_registration(self) -> None:
        self._registration = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        deviceplugin_pb2_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
            _Registration(self), self._registration
        )
        self._registration.add_insecure_port("unix://" + os.path.join(self.plugin_dir, "kubelet.sock"))
        self._registration.start()

    def restart(self) -> None:
        """What a kubelet restart looks like to a plugin: every socket in the directory is deleted, then a new
        kubelet.sock is served."""
        self.close_plugin_channel()
        if self._registration is not None:
            self._registration.stop(grace=None).wait()
        for name in os.listdir(self.plugin_dir):
            path = os.path.join(self.plugin_dir, name)
            if name.endswith(".sock"):
                os.unlink(path)
        self._start_registration()

    def stop(self) -> None:
        self.close_plugin_channel()
        for server in (self._registration, self._pod_resources):
            if server is not None:
                server.stop(grace=None).wait()

    def close_plugin_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._watch is not None:
            self._watch.join(timeout=5)
            self._watch = None

    # -- the plugin side -------------------------------------------------------------------------------

    def wait_registrations(self, count: int, timeout: float = 20) -> list[Registered]:
        with self.changed:
            self.changed.wait_for(lambda: len(self.state.registrations) >= count, timeout)
            return list(self.state.registrations)

    def plugin(self) -> deviceplugin_pb2_grpc.DevicePluginStub:
        """A client of the last registered plugin; its ListAndWatch stream is followed in the background."""
        if self._channel is None:
            endpoint = self.state.registrations[-1].request.endpoint
            self._channel = grpc.insecure_channel("unix://" + os.path.join(self.plugin_dir, endpoint))
            stub = deviceplugin_pb2_grpc.DevicePluginStub(self._channel)  # type: ignore[no-untyped-call]
            self._watch = threading.Thread(target=self._follow, args=(stub,), daemon=True)
            self._watch.start()
            return stub
        return deviceplugin_pb2_grpc.DevicePluginStub(self._channel)  # type: ignore[no-untyped-call]

    def _follow(self, stub: deviceplugin_pb2_grpc.DevicePluginStub) -> None:
        with contextlib.suppress(grpc.RpcError):
            stream: Iterator[pb.ListAndWatchResponse] = stub.ListAndWatch(pb.Empty())
            for message in stream:
                with self.changed:
                    self.state.devices = {d.ID: d.health for d in message.devices}
                    self.state.lists_seen += 1
                    self.changed.notify_all()

    def wait_lists(self, count: int, timeout: float = 20) -> dict[str, str]:
        with self.changed:
            self.changed.wait_for(lambda: self.state.lists_seen >= count, timeout)
            return dict(self.state.devices)

    def free_devices(self) -> list[str]:
        with self.changed:
            used = {d for ids in self.state.assignments.values() for d in ids}
            return sorted(d for d, h in self.state.devices.items() if h == "Healthy" and d not in used)

    def admit(
        self, namespace: str, pod: str, containers: Sequence[tuple[str, int]], init: Sequence[tuple[str, int]] = (),
        pick: Sequence[str] | None = None, sidecars: Sequence[str] = (),
    ) -> list[Admitted]:
        """Allocate like the kubelet (manager.go, Allocate and devicesToAllocate): init containers first, one call
        per container; a container takes the devices of the pod's finished regular init containers first, then
        what GetPreferredAllocation answers (or `pick`); the assignment is recorded, and the checkpoint written,
        after Allocate returns. `sidecars` names the restartable init containers."""
        self.plugin()
        self.wait_lists(1)
        out = []
        reusable: set[str] = set()
        for kind, entries in (("init", init), ("app", containers)):
            for name, units in entries:
                ids = sorted(reusable)[:units]
                if len(ids) < units:
                    ids += self._choose(units, ids, pick)
                request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
                answer = self.plugin().Allocate(request, timeout=20)
                role = "sidecar" if name in sidecars else kind
                if role == "init":
                    reusable.update(ids)
                else:
                    reusable.difference_update(ids)
                with self.changed:
                    self.state.assignments[(namespace, pod, name)] = list(ids)
                    self.state.kinds[(namespace, pod, name)] = role
                self.write_checkpoint()
                out.append(Admitted(namespace, pod, name, list(ids), answer.container_responses[0]))
        return out

    def _choose(self, units: int, allocated: list[str], pick: Sequence[str] | None) -> list[str]:
        used = {d for ids in self.state.assignments.values() for d in ids} | set(allocated)
        if pick is not None:
            return [d for d in pick if d not in used][: units - len(allocated)]
        available = [d for d in self.free_devices() if d not in used]
        request = pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=available + allocated, must_include_deviceIDs=allocated, allocation_size=units)])
        answer = self.plugin().GetPreferredAllocation(request, timeout=20)
        self.state.preferred_calls += 1
        preferred = [d for d in answer.container_responses[0].deviceIDs if d in available]
        return (preferred + [d for d in available if d not in preferred])[: units - len(allocated)]

    def start_container(self, namespace: str, pod: str, container: str) -> None:
        ids = self.state.assignments[(namespace, pod, container)]
        self.plugin().PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids), timeout=30)

    def forget(self, namespace: str, pod: str) -> None:
        """The pod is gone from the kubelet (deleted): its devices are free again."""
        with self.changed:
            for key in [k for k in self.state.assignments if k[:2] == (namespace, pod)]:
                del self.state.assignments[key]
                self.state.kinds.pop(key, None)
        self.write_checkpoint()

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.plugin_dir, "kubelet_internal_checkpoint")

    def write_checkpoint(self) -> None:
        """kubelet_internal_checkpoint as v1.34 writes it (checkpoint/checkpoint.go): every container, init
        containers included, DeviceIDs per NUMA node ("-1": no topology), by temp file and rename."""
        with self.changed:
            entries = [
                {"PodUID": self.uid_of(namespace, pod), "ContainerName": container, "ResourceName": RESOURCE,
                 "DeviceIDs": {"-1": list(ids)}, "AllocResp": ""}
                for (namespace, pod, container), ids in self.state.assignments.items()
            ]
        temp = os.path.join(self.plugin_dir, ".checkpoint.tmp")
        with open(temp, "w") as handle:
            json.dump({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}, "Checksum": 0}, handle)
        os.replace(temp, self.checkpoint_path)

    def listing(self) -> podresources_pb2.ListPodResourcesResponse:
        with self.changed:
            self.list_calls += 1
        return self._resources()

    def _resources(self, only: tuple[str, str] | None = None) -> podresources_pb2.ListPodResourcesResponse:
        with self.changed:
            pods: dict[tuple[str, str], list[podresources_pb2.ContainerResources]] = {}
            for (namespace, pod, container), ids in self.state.assignments.items():
                if only is not None and (namespace, pod) != only:
                    continue
                if self.state.kinds.get((namespace, pod, container)) == "init":
                    continue  # PodResources v1 List: app and sidecar containers only (apis/podresources/server_v1.go)
                devices = podresources_pb2.ContainerDevices(resource_name=RESOURCE, device_ids=ids)
                pods.setdefault((namespace, pod), []).append(
                    podresources_pb2.ContainerResources(name=container, devices=[devices])
                )
        return podresources_pb2.ListPodResourcesResponse(
            pod_resources=[
                podresources_pb2.PodResources(name=name, namespace=ns, containers=containers)
                for (ns, name), containers in pods.items()
            ]
        )


class _Registration(deviceplugin_pb2_grpc.RegistrationServicer):
    def __init__(self, kubelet: TestKubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        # The kubelet dials the plugin's endpoint right away: the plugin must already be serving.
        path = os.path.join(self.kubelet.plugin_dir, request.endpoint)
        serving = False
        if os.path.exists(path):
            with grpc.insecure_channel("unix://" + path) as channel:
                stub = deviceplugin_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
                with contextlib.suppress(grpc.RpcError):
                    serving = stub.GetDevicePluginOptions(pb.Empty(), timeout=5).pre_start_required
        with self.kubelet.changed:
            self.kubelet.state.registrations.append(Registered(request, serving))
            self.kubelet.changed.notify_all()
        return pb.Empty()


class _Lister(podresources_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: TestKubelet) -> None:
        self.kubelet = kubelet

    def List(
        self, request: podresources_pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> podresources_pb2.ListPodResourcesResponse:
        if self.kubelet.list_failures:
            self.kubelet.list_calls += 1
            context.abort(self.kubelet.list_failures.pop(0), "test kubelet says no")
        return self.kubelet.listing()

    def Get(
        self, request: podresources_pb2.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> podresources_pb2.GetPodResourcesResponse:
        """As pkg/kubelet/apis/podresources/server_v1.go answers: plain errors (UNKNOWN) when the gate is off and
        for a pod it does not run; else the pod's app and sidecar containers."""
        self.kubelet.get_calls += 1
        if not self.kubelet.get_enabled:
            context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        found = self.kubelet._resources((request.pod_namespace, request.pod_name)).pod_resources
        if not found:
            context.abort(grpc.StatusCode.UNKNOWN,
                          f"pod {request.pod_name} in namespace {request.pod_namespace} not found")
        return podresources_pb2.GetPodResourcesResponse(pod_resources=found[0])
