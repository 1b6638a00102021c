"""The reference device plugin's v1beta1.DevicePlugin service, re-implemented for the simulated cluster's baseline.

As the reference's server.go serves it: no options (so the kubelet never calls PreStartContainer or
GetPreferredAllocation), every device healthy in one ListAndWatch answer, and an Allocate that holds the plugin's
mutex for the whole call (allocate.go) around the decision e2e.refalloc makes from the API server's view. Where
the pods come from and how the chosen one is marked is the transport's (tests/harness/sim/baseline.py). On the real node
the tier runs the reference plugin itself, built from its sources (e2e.refstack).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import grpc

from deviceplugin.api import deviceplugin_pb2 as dp
from deviceplugin.api import deviceplugin_pb2_grpc
from deviceplugin.devices import device_ids
from e2e.refalloc import Decision, container_envs
from node.inventory import Gpu


class ReferenceService(deviceplugin_pb2_grpc.DevicePluginServicer):
    """The service; a transport supplies `decide` (list the candidates, pick, mark) and may watch `answered`."""

    # How often an open ListAndWatch stream checks that the plugin or the kubelet has not ended it.
    list_and_watch_poll = 0.5

    def __init__(self, gpus: Sequence[Gpu], unit: str) -> None:
        self.gpus = tuple(sorted(gpus, key=lambda g: g.index))
        self.unit = unit
        self._allocating = threading.Lock()
        self._stop = threading.Event()

    def decide(self, pod_units: int) -> Decision:
        """The decision for an Allocate of `pod_units` device IDs, the chosen pod already marked assigned."""
        raise NotImplementedError

    def answered(self, decision: Decision, pod_units: int, response: dp.AllocateResponse) -> None:
        """Called after each Allocate with what was answered (logging, or recording in the simulation)."""

    def GetDevicePluginOptions(self, request: dp.Empty, context: grpc.ServicerContext) -> dp.DevicePluginOptions:
        return dp.DevicePluginOptions()

    def ListAndWatch(self, request: dp.Empty, context: grpc.ServicerContext) -> Iterator[dp.ListAndWatchResponse]:
        devices = [dp.Device(ID=d, health="Healthy") for gpu in self.gpus for d in device_ids(gpu)]
        yield dp.ListAndWatchResponse(devices=devices)
        while context.is_active() and not self._stop.wait(self.list_and_watch_poll):
            pass

    def PreStartContainer(self, request: dp.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> dp.PreStartContainerResponse:
        return dp.PreStartContainerResponse()

    def Allocate(self, request: dp.AllocateRequest, context: grpc.ServicerContext) -> dp.AllocateResponse:
        pod_units = sum(len(r.devices_ids) for r in request.container_requests)
        with self._allocating:
            decision = self.decide(pod_units)
        out = dp.AllocateResponse()
        for req in request.container_requests:
            envs = container_envs(decision, pod_units, len(req.devices_ids), self.gpus[0].memory_units)
            out.container_responses.append(dp.ContainerAllocateResponse(envs=envs))
        self.answered(decision, pod_units, out)
        return out
