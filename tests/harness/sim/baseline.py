"""The reference plugin's Allocate algorithm, for the simulation only: it guesses the pod, and that is the bug.

The decision is e2e.refalloc's and the DevicePlugin service e2e.refservice's, both shared with the
reference-algorithm plugin of the real-cluster tier (which cites AliyunContainerService/gpushare-device-plugin's
allocate.go, podmanager.go and podutils.go); this module is the simulated node's transport for them: it lists the
simulated API server's pods, and registers again when the kubelet socket is recreated (the reference uses
fsnotify).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence

import grpc

from contract import DEFAULT_RESOURCE
from deviceplugin.api import deviceplugin_pb2 as dp
from deviceplugin.api import deviceplugin_pb2_grpc
from e2e.refalloc import Decision, app_units, assigned_patch, candidates, decide, no_gpu
from e2e.refservice import ReferenceService
from node.inventory import Gpu
from tests.harness.apiserver.ports import ApiError, PodApi
from tests.harness.kubelet import sockets

__all__ = ["BaselinePlugin", "app_units", "candidates"]

log = logging.getLogger(__name__)


class BaselinePlugin(ReferenceService):
    """A device plugin speaking the kubelet protocol over a unix socket, with the reference plugin's Allocate."""

    list_and_watch_poll = 0.2

    def __init__(self, node: str, plugin_dir: str, gpus: Sequence[Gpu], api: PodApi, *, unit: str = "GiB",
                 resource: str = DEFAULT_RESOURCE, endpoint: str = "gpushare-baseline.sock") -> None:
        super().__init__(gpus, unit)
        self.node = node
        self.plugin_dir = plugin_dir
        self.api = api
        self.resource = resource
        self.endpoint = endpoint
        self.responses: list[dp.ContainerAllocateResponse] = []
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
        sockets.stop(self._server, self.socket_path)
        self._server = None

    def _serve_and_register(self) -> None:
        self._stop_server()
        def add(server: grpc.Server) -> None:
            deviceplugin_pb2_grpc.add_DevicePluginServicer_to_server(self, server)  # type: ignore[no-untyped-call]

        self._server = sockets.serve(add, self.socket_path, 8, "sim-baseline")
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

    # -- Allocate: the simulated API server's view --------------------------------------------------------

    def answered(self, decision: Decision, pod_units: int, response: dp.AllocateResponse) -> None:
        self.responses.extend(response.container_responses)

    def decide(self, pod_units: int) -> Decision:
        try:
            pods, _ = self.api.list_pods(node=self.node)
        except ApiError as exc:
            return no_gpu(pod_units, self.unit, f"listing pods failed: {exc}")
        decision = decide(pods, self.node, pod_units, self.gpus, resource=self.resource, unit=self.unit)
        if decision.pod is None:
            if decision.made_up:
                log.info("baseline plugin on %s: %s", self.node, decision.why)
            return decision
        meta = decision.pod["metadata"]
        for _ in range(2):  # the reference retries once on an optimistic-lock error
            try:
                self.api.patch_pod(meta["namespace"], meta["name"], assigned_patch(time.time_ns()))
                return decision
            except ApiError:
                continue
        return no_gpu(pod_units, self.unit, f"marking pod {meta['namespace']}/{meta['name']} assigned failed")
