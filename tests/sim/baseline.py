"""The reference plugin's Allocate algorithm, for the simulation only: it guesses the pod, and that is the bug.

Modelled on AliyunContainerService/gpushare-device-plugin (pkg/gpu/nvidia/allocate.go, podmanager.go,
podutils.go): under one lock, Allocate sums the requested device IDs, lists this node's *Pending* pods,
keeps the "assumed" ones (a GPU-mem limit, an ALIYUN_COM_GPU_MEM_IDX annotation and ASSIGNED="false"),
sorts them by ALIYUN_COM_GPU_MEM_ASSUME_TIME and takes the first whose app containers' limits add up to the
request. Found: every container gets NVIDIA_VISIBLE_DEVICES=<that pod's GPU UUID> and the
ALIYUN_COM_GPU_MEM_* envs, and that pod is patched ASSIGNED="true". Not found on a one-GPU node: GPU 0.
Otherwise a *successful* response with NVIDIA_VISIBLE_DEVICES=no-gpu-has-<N><unit>-to-run.
No PreStartContainer; re-registers when the kubelet socket is recreated (the reference uses fsnotify).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent import futures

import grpc

from deviceplugin.api import deviceplugin_pb2 as dp
from deviceplugin.api import deviceplugin_pb2_grpc
from deviceplugin.inventory import Gpu
from tests.sim.ports import ApiError, Pod, PodApi
from webhook.protocol import ASSIGNED, ASSUME_TIME, DEFAULT_RESOURCE, IDX, ProtocolError, container_units

log = logging.getLogger(__name__)


def _int(value: object, default: int) -> int:
    try:
        return int(str(value))
    except ValueError:
        return default


def app_units(pod: Pod, resource: str) -> int:
    """getGPUMemoryFromPodResource: the sum over *app* containers' limits (init containers are ignored)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        with contextlib.suppress(ProtocolError):
            total += container_units(container, resource, "container")
    return total


def assumed(pod: Pod, resource: str) -> bool:
    """isGPUMemoryAssumedPod."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return app_units(pod, resource) > 0 and IDX in annotations and annotations.get(ASSIGNED) == "false"


def candidates(pods: Sequence[Pod], resource: str) -> list[Pod]:
    """getCandidatePods: pending assumed pods, oldest ASSUME_TIME first (a stable sort, as Go's sort.Sort is not)."""
    pending = [p for p in pods if (p.get("status") or {}).get("phase", "Pending") == "Pending" and assumed(p, resource)]
    return sorted(pending, key=lambda p: _int(((p.get("metadata") or {}).get("annotations") or {}).get(ASSUME_TIME), 0))


class BaselinePlugin(deviceplugin_pb2_grpc.DevicePluginServicer):
    """A device plugin speaking the kubelet protocol over a unix socket, with the reference plugin's Allocate."""

    def __init__(self, node: str, plugin_dir: str, gpus: Sequence[Gpu], api: PodApi, *, unit: str = "GiB",
                 resource: str = DEFAULT_RESOURCE, endpoint: str = "gpushare-baseline.sock") -> None:
        self.node = node
        self.plugin_dir = plugin_dir
        self.gpus = tuple(sorted(gpus, key=lambda g: g.index))
        self.api = api
        self.unit = unit
        self.resource = resource
        self.endpoint = endpoint
        self.responses: list[dp.ContainerAllocateResponse] = []
        self._alloc_lock = threading.Lock()
        self._stop = threading.Event()
        self._server: grpc.Server | None = None
        self._watcher: threading.Thread | None = None

    @property
    def socket_path(self) -> str:
        return os.path.join(self.plugin_dir, self.endpoint)

    def start(self) -> None:
        self._serve_and_register()
        self._watcher = threading.Thread(target=self._watch_kubelet, name=f"sim-baseline-{self.node}", daemon=True)
        self._watcher.start()

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        self._stop_server()

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(5)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def _serve_and_register(self) -> None:
        self._stop_server()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="sim-baseline"))
        deviceplugin_pb2_grpc.add_DevicePluginServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port("unix://" + self.socket_path)
        server.start()
        self._server = server
        with grpc.insecure_channel("unix://" + os.path.join(self.plugin_dir, "kubelet.sock")) as channel:
            registration = deviceplugin_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            registration.Register(dp.RegisterRequest(version="v1beta1", endpoint=self.endpoint,
                                                     resource_name=self.resource, options=dp.DevicePluginOptions()),
                                  timeout=10)

    def _watch_kubelet(self) -> None:
        kubelet_sock = os.path.join(self.plugin_dir, "kubelet.sock")
        while not self._stop.wait(0.05):
            if os.path.exists(kubelet_sock) and not os.path.exists(self.socket_path):
                try:
                    self._serve_and_register()
                except grpc.RpcError as exc:
                    log.info("baseline plugin on %s: registration failed (%s); retrying", self.node, exc)
                    self._stop_server()

    # -- the DevicePlugin service ------------------------------------------------------------------------

    def GetDevicePluginOptions(self, request: dp.Empty, context: grpc.ServicerContext) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions()

    def ListAndWatch(self, request: dp.Empty, context: grpc.ServicerContext) -> Iterator[dp.ListAndWatchResponse]:
        devices = [dp.Device(ID=d, health="Healthy") for gpu in self.gpus for d in gpu.device_ids()]
        yield dp.ListAndWatchResponse(devices=devices)
        while context.is_active() and not self._stop.wait(0.2):
            pass

    def PreStartContainer(self, request: dp.PreStartContainerRequest, context: grpc.ServicerContext
                   ) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()

    def _error_response(self, request: dp.AllocateRequest, pod_units: int) -> dp.AllocateResponse:
        return self._answer(request, f"no-gpu-has-{pod_units}{self.unit}-to-run", -1, pod_units)

    def _response(self, request: dp.AllocateRequest, gpu: Gpu, pod_units: int) -> dp.AllocateResponse:
        return self._answer(request, gpu.uuid, gpu.index, pod_units)

    def _answer(self, request: dp.AllocateRequest, visible: str, index: int, pod_units: int) -> dp.AllocateResponse:
        out = dp.AllocateResponse()
        for req in request.container_requests:
            out.container_responses.append(dp.ContainerAllocateResponse(envs={
                "NVIDIA_VISIBLE_DEVICES": visible,
                "ALIYUN_COM_GPU_MEM_IDX": str(index),
                "ALIYUN_COM_GPU_MEM_POD": str(pod_units),
                "ALIYUN_COM_GPU_MEM_CONTAINER": str(len(req.devices_ids)),
                "ALIYUN_COM_GPU_MEM_DEV": str(self.gpus[0].memory_units),
            }))
        return out

    def Allocate(self, request: dp.AllocateRequest, context: grpc.ServicerContext) -> dp.AllocateResponse:
        response = self._decide(request)
        self.responses.extend(response.container_responses)
        return response

    def _decide(self, request: dp.AllocateRequest) -> dp.AllocateResponse:
        pod_units = sum(len(r.devices_ids) for r in request.container_requests)
        with self._alloc_lock:
            try:
                pods, _ = self.api.list_pods(node=self.node)
            except ApiError:
                return self._error_response(request, pod_units)
            chosen = next((p for p in candidates(pods, self.resource) if app_units(p, self.resource) == pod_units),
                          None)
            if chosen is None:
                if len(self.gpus) == 1:
                    return self._response(request, self.gpus[0], pod_units)
                log.info("baseline plugin on %s: no assumed pod requests %s %s", self.node, pod_units, self.unit)
                return self._error_response(request, pod_units)
            meta = chosen["metadata"]
            gpu = next((g for g in self.gpus if g.index == _int(meta["annotations"].get(IDX), -1)), None)
            if gpu is None:
                return self._error_response(request, pod_units)
            patch = {"metadata": {"annotations": {ASSIGNED: "true", ASSUME_TIME: str(time.time_ns())}}}
            for _ in range(2):  # the reference retries once on an optimistic-lock error
                try:
                    self.api.patch_pod(meta["namespace"], meta["name"], patch)
                    break
                except ApiError:
                    continue
            else:
                return self._error_response(request, pod_units)
            return self._response(request, gpu, pod_units)
