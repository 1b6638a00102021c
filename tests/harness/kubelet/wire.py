"""The test kubelet's gRPC side, shared by its two drivers (node.py, which runs pods of the simulated cluster on its
own, and scripted.py, which the plugin's unit tests drive call by call): the Registration and PodResources servers
and a device-plugin client, as kubelet v1.34 serves and calls them (registration: also as v1.37 does)."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc

from deviceplugin.api import deviceplugin_pb2 as dp
from deviceplugin.api import deviceplugin_pb2_grpc, podresources_pb2_grpc
from deviceplugin.api import podresources_pb2 as pr
from tests.harness.apiserver.ports import Pod
from tests.harness.kubelet import sockets
from tests.harness.kubelet.devices import DeviceState

VERSION = "v1beta1"


def go_code(code: grpc.StatusCode) -> str:
    """grpc-go's spelling of a status code, as it appears in `rpc error: code = X desc = ...`."""
    return "".join(part.capitalize() for part in code.name.split("_"))


def rpc_error_text(exc: grpc.RpcError) -> str:
    if isinstance(exc, grpc.Call):
        return f"rpc error: code = {go_code(exc.code())} desc = {exc.details()}"
    return f"rpc error: {exc}"


@dataclass
class Registered:
    """One Register call: the request, whether the plugin answered GetDevicePluginOptions on its endpoint, and the
    kubelet's refusal ("" when it connected)."""

    request: dp.RegisterRequest
    plugin_was_serving: bool
    refused: str = ""


@dataclass
class PluginConn:
    """A registered plugin endpoint: its channel, options and the latest full ListAndWatch device list."""

    endpoint: str
    resource: str
    channel: grpc.Channel
    options: dp.DevicePluginOptions
    devices: dict[str, str] = field(default_factory=dict)
    cancel: Callable[[], object] | None = None
    lists: int = 0  # ListAndWatch messages on this connection

    def healthy(self) -> list[str]:
        return [d for d, health in self.devices.items() if health == "Healthy"]

    def allocate(self, device_ids: list[str], timeout: float) -> dp.AllocateResponse:
        request = dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=device_ids)])
        response: dp.AllocateResponse = _stub(self.channel).Allocate(request, timeout=timeout)
        return response

    def preferred(self, available: list[str], must_include: list[str], size: int, timeout: float) -> list[str]:
        request = dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size)])
        response: dp.PreferredAllocationResponse = _stub(self.channel).GetPreferredAllocation(request, timeout=timeout)
        return list(response.container_responses[0].deviceIDs) if response.container_responses else []

    def pre_start(self, device_ids: list[str], timeout: float) -> None:
        _stub(self.channel).PreStartContainer(dp.PreStartContainerRequest(devices_ids=device_ids), timeout=timeout)


def _stub(channel: grpc.Channel) -> deviceplugin_pb2_grpc.DevicePluginStub:
    return deviceplugin_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]


def remove_sockets(directory: str) -> None:
    """What a restarting kubelet does to the device-plugin directory: every socket goes, other files stay."""
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)


class RegistrationServer(deviceplugin_pb2_grpc.RegistrationServicer):
    """`/v1beta1.Registration/Register` on kubelet.sock. As the kubelet (pkg/kubelet/cm/devicemanager/plugin/
    v1beta1/server.go Register, handler.go connectClient) it connects to the plugin's endpoint and asks its options
    before answering, so a plugin that registers before it serves gets an error; then it follows ListAndWatch in the
    background (runClient). Every registration, every device list and the connection's changes wake `changed`.

    `minor` is the kubelet's minor version, for the two ways it keeps plugin clients (the rest is alike):

    - 1.34-1.36 (v1.36.3 server.go registerClient, getClient, deregisterClient; manager.go PluginConnected,
      PluginDisconnected): one client per resource. A new registration replaces the client and the endpoint and
      leaves the old connection open; when any client's stream ends, the resource's *current* client is
      disconnected: its connection closed, every device marked unhealthy, the endpoint stopped.
    - 1.37 (v1.37.2 manager.go PluginConnected, PluginDisconnected; handler.go connectClient, runClient;
      server.go deregisterClient, getClient): clients and endpoints per (resource, socket path). A registration
      whose path has an endpoint is refused with "device plugin already connected: <path>", and connectClient then
      deregisters every client of that path, the old one included; so when the old connection ends, runClient finds
      no client, PluginDisconnected never runs, the endpoint stays, and every later registration on that path is
      refused until the kubelet restarts. When a connection ends that is not the resource's last endpoint, it is
      removed and a remaining one serves; the last one marks every device unhealthy.

    `conn` is the endpoint the kubelet calls (manager.go endpoints[resource]); None once it has no healthy devices.
    The device lists of a connection that is not `conn` stay on that connection (a real kubelet takes every
    client's list as the resource's, PluginListAndWatchReceiver)."""

    def __init__(self, plugin_dir: str, resource: str, on_devices: Callable[[PluginConn | None], None],
                 minor: int = 34) -> None:
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.on_devices = on_devices
        self.minor = minor
        self.conn: PluginConn | None = None
        self.clients: list[PluginConn] = []  # server.go clients[resource]: one before 1.37, one per path from 1.37
        self.endpoints: dict[str, PluginConn] = {}  # 1.37 manager.go endpointStore[resource], by socket path
        self._open: list[PluginConn] = []  # every connection whose ListAndWatch is followed
        self.registered: list[Registered] = []
        self.lists_seen = 0  # ListAndWatch messages received, over every connection
        self.changed = threading.Condition()
        self._server: grpc.Server | None = None

    @property
    def per_socket(self) -> bool:
        return self.minor >= 37

    @property
    def registrations(self) -> int:
        return sum(r.plugin_was_serving and not r.refused for r in self.registered)

    def start(self) -> None:
        def add(server: grpc.Server) -> None:
            deviceplugin_pb2_grpc.add_RegistrationServicer_to_server(self, server)  # type: ignore[no-untyped-call]

        self._server = sockets.serve(add, os.path.join(self.plugin_dir, "kubelet.sock"), 2, "test-kubelet-reg")

    def stop(self) -> None:
        sockets.stop(self._server)
        self._server = None
        self.disconnect()

    def disconnect(self) -> None:
        """Close every plugin connection, as a stopping kubelet does (the plugin sees its ListAndWatch end)."""
        with self.changed:
            conns, self._open = self._open, []
            self.conn, self.clients, self.endpoints = None, [], {}
        for conn in conns:
            _close(conn)

    def wait_registrations(self, count: int, timeout: float) -> list[Registered]:
        with self.changed:
            self.changed.wait_for(lambda: len(self.registered) >= count, timeout)
            return list(self.registered)

    def _record(self, registered: Registered) -> None:
        with self.changed:
            self.registered.append(registered)
            self.changed.notify_all()

    def Register(self, request: dp.RegisterRequest, context: grpc.ServicerContext) -> dp.Empty:
        if request.version != VERSION:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported device plugin API version {request.version}")
        if request.resource_name != self.resource:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"this kubelet expects {self.resource}, not "
                          f"{request.resource_name}")
        path = os.path.join(self.plugin_dir, request.endpoint)
        channel = grpc.insecure_channel("unix://" + path)
        try:
            stub = _stub(channel)
            options: dp.DevicePluginOptions = stub.GetDevicePluginOptions(dp.Empty(), timeout=10)
        except grpc.RpcError as exc:
            channel.close()
            self._deregister(path)
            self._record(Registered(request, False))
            context.abort(grpc.StatusCode.UNKNOWN, f"failed to dial device plugin: {rpc_error_text(exc)}")
        conn = PluginConn(request.endpoint, request.resource_name, channel, options)
        with self.changed:
            if self.per_socket and path in self.endpoints:
                refused = f"device plugin already connected: {path}"
            else:
                refused = ""
                if self.per_socket:
                    self.clients = [*self.clients, conn]
                    self.endpoints[path] = conn
                else:
                    self.clients = [conn]
                self.conn = conn
                self._open.append(conn)
        if refused:
            channel.close()
            self._deregister(path)  # every client of that path: the connected one's end is never noticed
            self._record(Registered(request, True, refused))
            context.abort(grpc.StatusCode.UNKNOWN, refused)
        responses = _stub(channel).ListAndWatch(dp.Empty())
        conn.cancel = responses.cancel
        self._record(Registered(request, True))
        threading.Thread(target=self._follow, args=(conn, responses), name="test-kubelet-plugin",
                         daemon=True).start()
        return dp.Empty()

    def _deregister(self, path: str) -> None:
        """server.go deregisterClient: v1.37 drops the clients of that path, earlier ones the resource's client."""
        with self.changed:
            self.clients = [c for c in self.clients if self._path(c) != path] if self.per_socket else []

    def _path(self, conn: PluginConn) -> str:
        return os.path.join(self.plugin_dir, conn.endpoint)

    def _follow(self, conn: PluginConn, responses: Iterator[dp.ListAndWatchResponse]) -> None:
        try:
            for message in responses:
                with self.changed:
                    conn.devices = {d.ID: d.health for d in message.devices}
                    conn.lists += 1
                    self.lists_seen += 1
                    current = self.conn is conn
                    self.changed.notify_all()
                if current:
                    self.on_devices(conn)
        except grpc.RpcError:
            pass
        with self.changed:
            self._open = [c for c in self._open if c is not conn]
        self._run_client_ended(conn)
        conn.channel.close()

    def _run_client_ended(self, ended: PluginConn) -> None:
        """handler.go runClient after the stream ended: getClient, then disconnectClient and PluginDisconnected."""
        path = self._path(ended)
        with self.changed:
            # getClient: v1.37 the first client of this path, earlier ones the resource's client, whichever it is.
            found = [c for c in self.clients if self._path(c) == path] if self.per_socket else self.clients
            if not found:
                return
            client = found[0]
            self.clients = [c for c in self.clients if self._path(c) != path] if self.per_socket else []
            before = self.conn
            if not self.per_socket:
                self.conn = None  # the current endpoint is stopped, its devices unhealthy
            elif path in self.endpoints:
                del self.endpoints[path]
                # The last endpoint marks the devices unhealthy; otherwise a remaining one is promoted.
                self.conn = next(iter(self.endpoints.values()), None)
            after = self.conn
            self.changed.notify_all()
        if client is not ended:
            _close(client)
        if after is not before:
            self.on_devices(after)


def _close(conn: PluginConn) -> None:
    if conn.cancel is not None:
        conn.cancel()
    conn.channel.close()


class TokenBucket:
    """The kubelet's PodResources limiter: `rate` calls a second with bursts of `burst` (100/s, 10 by default)."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.rejected = 0
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            self.rejected += 1
            return False


class PodResourcesServer(podresources_pb2_grpc.PodResourcesListerServicer):
    """`v1.PodResourcesLister` on its own socket. Like v1.34's (pkg/kubelet/apis/podresources/server_v1.go) List
    reports the active pods' app containers and restartable (sidecar) init containers, with their devices (regular
    init containers never appear), and Get answers plain errors (UNKNOWN) when its gate is off and for a pod it
    does not run. `limit` is the kubelet's rate limiter (100/s, bursts of 10); None: unlimited. Tests may queue
    `failures`, the codes of the next List calls, and set `list_hook`, which List answers instead."""

    def __init__(self, socket_path: str, state: DeviceState, allocatable: Callable[[], list[str]],
                 active_pods: Callable[[], list[Pod]], limit: TokenBucket | None,
                 get_enabled: bool = True, pod_named: Callable[[str, str], Pod | None] | None = None) -> None:
        self.socket_path = socket_path
        self.state = state
        self.allocatable = allocatable
        self.active_pods = active_pods
        self.limit = limit
        self.get_enabled = get_enabled  # the KubeletPodResourcesGet gate: on by default from 1.34
        self.pod_named = pod_named  # one active pod by namespace and name, as the kubelet's pod manager finds it
        self.failures: list[grpc.StatusCode] = []
        self.list_hook: Callable[[], pr.ListPodResourcesResponse] | None = None
        self.list_calls = 0
        self.get_calls = 0
        self._server: grpc.Server | None = None

    def _admit(self, context: grpc.ServicerContext) -> None:
        if self.limit is not None and not self.limit.allow():
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")

    def start(self) -> None:
        def add(server: grpc.Server) -> None:
            podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)  # type: ignore[no-untyped-call]

        self._server = sockets.serve(add, self.socket_path, 4, "test-kubelet-podres")

    def stop(self) -> None:
        sockets.stop(self._server, self.socket_path)
        self._server = None

    def _resources(self, pod: Pod) -> pr.PodResources:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        sidecars = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
        containers = []
        for container in [*sidecars, *(spec.get("containers") or [])]:
            entry = self.state.entry(meta.get("uid", ""), container.get("name"))
            devices = [pr.ContainerDevices(resource_name=entry.resource, device_ids=list(entry.device_ids))
                       ] if entry is not None else []
            containers.append(pr.ContainerResources(name=container.get("name"), devices=devices))
        return pr.PodResources(name=meta.get("name"), namespace=meta.get("namespace"), containers=containers)

    def _pods(self) -> Iterator[pr.PodResources]:
        for pod in self.active_pods():
            yield self._resources(pod)

    def _named(self, namespace: str, name: str) -> Pod | None:
        """The kubelet's Get looks the pod up by name (server_v1.go, GetPodByName), without listing the others."""
        if self.pod_named is not None:
            return self.pod_named(namespace, name)
        for pod in self.active_pods():
            meta = pod.get("metadata") or {}
            if meta.get("name") == name and meta.get("namespace") == namespace:
                return pod
        return None

    def listing(self) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(pod_resources=list(self._pods()))

    def List(self, request: pr.ListPodResourcesRequest, context: grpc.ServicerContext) -> pr.ListPodResourcesResponse:
        self.list_calls += 1
        self._admit(context)
        if self.failures:
            context.abort(self.failures.pop(0), "test kubelet says no")
        return self.list_hook() if self.list_hook is not None else self.listing()

    def Get(self, request: pr.GetPodResourcesRequest, context: grpc.ServicerContext) -> pr.GetPodResourcesResponse:
        self.get_calls += 1
        self._admit(context)
        if not self.get_enabled:
            context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        pod = self._named(request.pod_namespace, request.pod_name)
        if pod is not None:
            return pr.GetPodResourcesResponse(pod_resources=self._resources(pod))
        context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found")
        raise AssertionError("unreachable")

    def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        self._admit(context)
        devices = [pr.ContainerDevices(resource_name=self.state.resource, device_ids=self.allocatable())]
        return pr.AllocatableResourcesResponse(devices=devices)
