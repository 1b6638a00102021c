"""The kubelet's sockets and files: registration, restart watch, PodResources client and checkpoint reader."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc

from deviceplugin.api import deviceplugin_pb2, deviceplugin_pb2_grpc, podresources_pb2, podresources_pb2_grpc
from deviceplugin.checkpoint import Checkpoint, Entry, checkpoint_entries
from deviceplugin.dirwatch import EVERYTHING, DirWatch
from deviceplugin.sockets import probe
from node import deadline

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
# PodResources List is rate limited (100/s, burst 10): retry a RESOURCE_EXHAUSTED answer a few times.
_EXHAUSTED_RETRIES = 5
_EXHAUSTED_PAUSE = 0.1


class KubeletUnavailable(Exception):
    """The kubelet cannot say which pod holds which devices right now; the text says why."""


@dataclass(frozen=True)
class Holding:
    """One container's devices of our resource, as the kubelet reports them (PodResources or checkpoint)."""

    namespace: str
    pod: str
    container: str
    device_ids: tuple[str, ...]
    pod_uid: str = ""  # the checkpoint knows the UID only; PodResources knows namespace and name only


def checkpoint_holdings(entries: Iterable[Entry]) -> list[Holding]:
    """Holdings from the kubelet's device-manager checkpoint (pod UIDs only, no names): every container, init
    containers included."""
    return [Holding("", "", e.container, e.device_ids, e.pod_uid) for e in entries]


def holdings_from_checkpoint(text: str, resource: str) -> list[Holding]:
    """Holdings from the checkpoint's text (deviceplugin/checkpoint.py reads its layout); ValueError when it is not
    the device manager's JSON."""
    return checkpoint_holdings(checkpoint_entries(text, resource))


class RegistrationError(Exception):
    """Registering with the kubelet failed; the text says why in the kubelet's terms, not gRPC's."""


def register(kubelet_socket: str, endpoint: str, resource: str, options: deviceplugin_pb2.DevicePluginOptions,
             timeout: float) -> None:
    """Register with the kubelet; the plugin must already be serving on `endpoint`."""
    if not os.path.exists(kubelet_socket):
        # Without this check gRPC waits for the whole timeout and reports DEADLINE_EXCEEDED.
        raise RegistrationError(f"the kubelet's socket {kubelet_socket} does not exist yet (the kubelet is not "
                                "running, or GPUSHARE_DEVICE_PLUGIN_DIR is not its device-plugins directory)")
    if probe(kubelet_socket) == "refused":
        # A stopped kubelet leaves its socket until the next one replaces it; gRPC would wait out the timeout there,
        # and the watch would meet the next kubelet that much later.
        raise RegistrationError(f"the kubelet's socket {kubelet_socket} does not accept connections (the kubelet "
                                "is stopped or starting)")
    with grpc.insecure_channel("unix://" + kubelet_socket) as channel:
        stub = deviceplugin_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        request = deviceplugin_pb2.RegisterRequest(
            version=API_VERSION, endpoint=endpoint, resource_name=resource, options=options
        )
        try:
            stub.Register(request, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                why = f"did not answer within {timeout:g} s (GPUSHARE_RPC_TIMEOUT_SECONDS)"
            elif code == grpc.StatusCode.UNAVAILABLE:
                why = "does not accept connections (it is starting or stopping)"
            else:
                why = f"refused the registration: {code.name} {exc.details()}"
            raise RegistrationError(f"the kubelet at {kubelet_socket} {why}") from exc


class KubeletHoldings:
    """Who holds which devices of our resource: PodResources List, else the kubelet's checkpoint file."""

    def __init__(self, pod_resources_socket: str, checkpoint: str, resource: str, timeout: float) -> None:
        self.socket = pod_resources_socket
        self.checkpoint_path = checkpoint
        self.resource = resource
        self.timeout = timeout
        self._channel: grpc.Channel | None = None
        self._lock = threading.Lock()
        self._get_supported = True  # until the kubelet says otherwise (per connection: it may be upgraded)
        self._read_lock = threading.Lock()
        self._read: tuple[tuple[int, int, int, int], Checkpoint] | None = None  # (file identity, what it held)

    def holdings(self) -> list[Holding]:
        try:
            return self.from_pod_resources()
        except KubeletUnavailable as first:
            try:
                return self.from_checkpoint()
            except KubeletUnavailable as second:
                raise KubeletUnavailable(f"{first}; and {second}") from second

    def _stub(self) -> podresources_pb2_grpc.PodResourcesListerStub:
        with self._lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel("unix://" + self.socket)
            return podresources_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]

    def from_pod_resources(self) -> list[Holding]:
        if not os.path.exists(self.socket):
            raise KubeletUnavailable(f"the PodResources socket {self.socket} does not exist")
        for attempt in range(_EXHAUSTED_RETRIES):
            try:
                wait = deadline.left(self.timeout)  # never longer than the kubelet call being answered
                response = self._stub().List(podresources_pb2.ListPodResourcesRequest(), timeout=wait)
                break
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED and attempt + 1 < _EXHAUSTED_RETRIES:
                    time.sleep(_EXHAUSTED_PAUSE * (attempt + 1))
                    continue
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED):
                    self.close()  # the kubelet may have restarted: reconnect next time
                raise KubeletUnavailable(f"PodResources List failed: {code.name} {exc.details()}") from exc
        return [h for pod in response.pod_resources for h in self._of(pod)]

    def _of(self, pod: podresources_pb2.PodResources) -> list[Holding]:
        out = []
        for container in pod.containers:
            ids = [d for devices in container.devices if devices.resource_name == self.resource
                   for d in devices.device_ids]
            if ids:
                out.append(Holding(pod.namespace, pod.name, container.name, tuple(ids)))
        return out

    def pod_holdings(self, namespace: str, name: str) -> list[Holding] | None:
        """One pod's app and sidecar containers' devices by PodResources Get (beta and on by default since
        Kubernetes 1.34, gate KubeletPodResourcesGet); None where the kubelet has no Get, so the caller lists."""
        if not self._get_supported or not os.path.exists(self.socket):
            return None
        request = podresources_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace)
        try:
            response = self._stub().Get(request, timeout=deadline.left(self.timeout))
        except grpc.RpcError as exc:
            code, details = exc.code(), str(exc.details() or "")
            # pkg/kubelet/apis/podresources/server_v1.go: with the gate off Get answers "PodResources API Get method
            # disabled", for a pod it does not know "pod NAME in namespace NS not found" (both as plain errors).
            if code == grpc.StatusCode.UNIMPLEMENTED or "disabled" in details:
                log.info("the kubelet has no PodResources Get (%s); listing every pod instead", details or code.name)
                self._get_supported = False
                return None
            if "not found" in details:
                return []
            if code == grpc.StatusCode.UNAVAILABLE:
                self.close()
            return None  # rate limited or broken now: List decides, and says what is wrong if it fails too
        return self._of(response.pod_resources)

    def from_checkpoint(self) -> list[Holding]:
        read = self.checkpoint()
        if read.problem:
            raise KubeletUnavailable(read.problem)
        return checkpoint_holdings(read.entries)

    def checkpoint(self) -> Checkpoint:
        """The checkpoint as the kubelet last wrote it, parsed again only when the file is another one: the kubelet
        writes a temporary file and renames it over the checkpoint (pkg/kubelet/util/store/filestore.go, writeFile),
        so every write is a new inode."""
        try:
            st = os.stat(self.checkpoint_path)
        except OSError as exc:
            return Checkpoint(problem=f"the kubelet checkpoint {self.checkpoint_path} cannot be read ({exc})")
        identity = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        with self._read_lock:
            if self._read is None or self._read[0] != identity:
                self._read = (identity, self._parse())  # read after the stat: never older than its identity
            return self._read[1]

    def _parse(self) -> Checkpoint:
        path = self.checkpoint_path
        try:
            with open(path, "rb") as handle:
                text = handle.read().decode("utf-8")
            return Checkpoint(tuple(checkpoint_entries(text, self.resource)))
        except OSError as exc:
            return Checkpoint(problem=f"the kubelet checkpoint {path} cannot be read ({exc})")
        except UnicodeDecodeError as exc:
            return Checkpoint(problem=f"the kubelet checkpoint {path} is not UTF-8 text ({exc})")
        except ValueError as exc:
            return Checkpoint(problem=str(exc))

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
            self._get_supported = True


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


class RestartWatch:
    """Calls `on_restart` (serve again under a new name and register) when the kubelet restarts: its socket is
    recreated, or ours is deleted; and when the kubelet dropped our endpoint while it kept running (`request`).

    A starting kubelet deletes every socket in the device-plugin directory, then listens on a new kubelet.sock
    (CleanupPluginDirectory in pkg/kubelet/cm/devicemanager/manager.go, Start in plugin/v1beta1/server.go); until
    the plugin has registered again the kubelet has no healthy devices for it and fails the admission of every pod
    that asks for them. So the directory is watched with inotify, and `interval` is only a slow safety-net poll.

    A dropped endpoint: kubelets v1.34-v1.36 keep one client per resource (plugin/v1beta1/server.go registerClient,
    getClient; v1.34.4, v1.36.3). When an earlier instance's ListAndWatch stream ends after our registration, its
    runClient (handler.go) finds *our* client under the resource's name and disconnects it: the kubelet closes our
    connection, PluginDisconnected (manager.go) marks every device of the resource unhealthy and stops our endpoint,
    and nothing connects again until a plugin registers. Our ListAndWatch stream ends then, with neither the plugin
    nor the kubelet stopping, and the servicer calls `request` (server.DevicePluginServicer.on_dropped). Kubelet
    v1.37 keeps one endpoint per socket path and promotes ours when the earlier one disconnects (manager.go
    PluginDisconnected, v1.37.2): our stream goes on, and nothing is registered again, which would stop the
    endpoint the kubelet is using for a moment.
    """

    def __init__(self, kubelet_socket: str, own_socket: Callable[[], str | None], on_restart: Callable[[], None],
                 interval: float, *, settle: float = 0.05, drop_settle: float = 0.5) -> None:
        self.kubelet_socket = kubelet_socket
        self.own_socket = own_socket  # the socket of the current serve (it changes with every serve)
        self.on_restart = on_restart
        self.interval = interval
        self.settle = settle  # the kubelet deletes the sockets, then listens: act once the directory is quiet
        self.drop_settle = drop_settle  # after a stream's end, how long a stopping kubelet takes to stop answering
        self._requested = threading.Event()
        self._stop = threading.Event()
        self._dir = DirWatch(os.path.dirname(kubelet_socket))
        self._thread = threading.Thread(target=self._run, name="kubelet-watch", daemon=True)

    @property
    def notified(self) -> bool:
        """True when the directory is watched by inotify (else it is only polled)."""
        return self._dir.watching

    def start(self, registered: bool = True) -> None:
        """Start watching; when the first registration failed, register as soon as the kubelet answers."""
        self._known = _identity(self.kubelet_socket) if registered else None
        self._thread.start()

    def request(self) -> None:
        """The kubelet dropped our endpoint: serve and register again (from any thread)."""
        if not self._requested.is_set():
            log.warning("The kubelet ended this plugin's ListAndWatch stream while it kept running (a kubelet before "
                        "v1.37 does so when an earlier instance of the plugin disconnects); serving and registering "
                        "again")
        self._requested.set()
        self._dir.wake()

    def stop(self) -> None:
        self._stop.set()
        self._dir.wake()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._dir.close()

    def _names(self) -> set[str]:
        own = self.own_socket()
        return {os.path.basename(self.kubelet_socket), EVERYTHING} | ({os.path.basename(own)} if own else set())

    def _run(self) -> None:
        while not self._stop.is_set():
            changed = self._dir.wait(self.interval)
            if self._stop.is_set():
                return
            requested = self._requested.is_set()
            if changed and not changed & self._names() and not requested:
                continue  # another file (the kubelet's checkpoint, another plugin's socket)
            while changed and self._dir.wait(self.settle) and not self._stop.is_set():
                pass  # more is happening in the directory: wait until it is quiet
            self._check(requested)

    def _check(self, requested: bool = False) -> None:
        current = _identity(self.kubelet_socket)
        if current is None:
            return  # the kubelet is down; register when its socket is back
        if requested and current == self._known:
            # The stream ends too when the kubelet stops, and its kubelet.sock stays until the next kubelet replaces
            # it: a registration sent there now would wait out its timeout while the new kubelet cleans the
            # directory, and hold back the registration with that kubelet. Register again only while this kubelet
            # still answers; a stopped one's successor is met by the restart path.
            self._stop.wait(self.drop_settle)
            current = _identity(self.kubelet_socket)
            if current == self._known and probe(self.kubelet_socket) != "accepts":
                log.info("the kubelet stopped (its socket no longer accepts connections); registering when it is back")
                self._requested.clear()
                return
        own = self.own_socket()
        if current != self._known or requested or own is None or not os.path.exists(own):
            if not requested:
                log.info("the kubelet restarted (its socket is new or ours is gone); serving and registering again")
            self._requested.clear()  # a drop reported from here on is one of the new endpoint
            try:
                self.on_restart()
                self._known = current
            except Exception as exc:
                self._known = None  # retry at the next change or poll, whatever made this one register
                log.warning("Registering again with the kubelet failed (%s); retrying in %g s, or as soon as the "
                            "device-plugin directory changes.", exc, self.interval)
