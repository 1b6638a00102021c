"""The DevicePlugin gRPC servicer: translates the kubelet's calls to the service and its errors to statuses."""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc
from deviceplugin.devices import UnitInventory
from deviceplugin.errors import PluginError
from deviceplugin.metrics import PluginMetrics
from deviceplugin.service import Service
from node import deadline, lifecycle

log = logging.getLogger(__name__)

T = TypeVar("T")
# Kubelet calls answered at once. A call whose API requests hang holds a worker until its deadline
# (GPUSHARE_RPC_TIMEOUT_SECONDS, below the kubelet's 30 s for PreStartContainer); the kubelet starts the
# containers of many pods at once, so the pool outlasts a burst of hung calls and healthy ones still find a worker.
CALL_WORKERS = 64
OPTIONS = pb.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)


class DevicePluginServicer(deviceplugin_pb2_grpc.DevicePluginServicer):
    def __init__(self, service: Service, inventory: UnitInventory, stop: threading.Event, timeout: float,
                 metrics: PluginMetrics | None = None, *, on_dropped: Callable[[], None] | None = None) -> None:
        self.service = service
        self.metrics = metrics or PluginMetrics()
        self.inventory = inventory
        self.stop = stop
        self.timeout = timeout
        # Called when a ListAndWatch stream ends that neither the plugin's stop nor retire() ended: the kubelet
        # dropped this endpoint (kubelet.RestartWatch.request registers again).
        self.on_dropped = on_dropped
        self._retired = threading.Event()
        # The kubelet waits forever for Allocate while it admits pods one at a time: bound every answer.
        self._workers = concurrent.futures.ThreadPoolExecutor(CALL_WORKERS, thread_name_prefix="kubelet-call")

    def retire(self) -> None:
        """The plugin is stopping this server itself: the stream ends that follow are not the kubelet's doing."""
        self._retired.set()

    def close(self) -> None:
        self.retire()
        self._workers.shutdown(wait=False, cancel_futures=True)

    def _bounded(self, call: str, context: grpc.ServicerContext, work: Callable[[], T]) -> T:
        # The deadline runs from the call's arrival, and every API and PodResources request the work makes is cut
        # to what is left of it, so a worker whose requests hang is free again when its call has been answered.
        started = time.monotonic()
        until = started + self.timeout
        future = self._workers.submit(deadline.run_until, until, work)
        code, reason = "OK", ""
        try:
            return future.result(timeout=self.timeout)
        except PluginError as exc:
            code, reason = exc.code, exc.reason
            context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
        except concurrent.futures.TimeoutError:
            code = "DEADLINE_EXCEEDED"
            future.cancel()  # still queued: never start work whose answer nobody waits for
            context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the gpushare device plugin could not answer {call} within {self.timeout:g} s "
                "(GPUSHARE_RPC_TIMEOUT_SECONDS); check its API server and kubelet access in its log",
            )
        except Exception as exc:
            code = "INTERNAL"
            log.exception("%s failed unexpectedly", call)
            context.abort(
                grpc.StatusCode.INTERNAL,
                f"the gpushare device plugin failed in {call} ({exc!r}); see its log and report the problem",
            )
        finally:
            self.metrics.call(call, code, time.monotonic() - started, reason)
        raise AssertionError("context.abort always raises")  # pragma: no cover

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return OPTIONS

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        """The full device list first, then again after every health change, until the stream ends."""
        sent = -1
        try:
            while context.is_active() and not self.stop.is_set() and not self._retired.is_set():
                version = self.inventory.version
                if version != sent:
                    devices = [pb.Device(ID=i, health=health) for i, health in self.inventory.devices()]
                    yield pb.ListAndWatchResponse(devices=devices)
                    sent = version
                self.inventory.wait_change(sent, 0.5)
        finally:  # also when gRPC closes the generator at a yield
            if not self.stop.is_set() and not self._retired.is_set() and self.on_dropped is not None:
                self.on_dropped()

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        # Any units will do (annotations decide the GPU); the least recently handed out, so slots rarely repeat.
        answers = [
            pb.ContainerPreferredAllocationResponse(deviceIDs=self.service.preferred(
                list(wanted.available_deviceIDs), list(wanted.must_include_deviceIDs), wanted.allocation_size
            ))
            for wanted in request.container_requests
        ]
        return pb.PreferredAllocationResponse(container_responses=answers)

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        requests = [list(r.devices_ids) for r in request.container_requests]
        answers = self._bounded("Allocate", context, lambda: self.service.allocate(requests))
        return pb.AllocateResponse(
            container_responses=[
                pb.ContainerAllocateResponse(
                    envs=dict(a.envs), cdi_devices=[pb.CDIDevice(name=name) for name in a.cdi_devices]
                )
                for a in answers
            ]
        )

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        device_ids = list(request.devices_ids)
        self._bounded("PreStartContainer", context, lambda: self.service.prestart(device_ids))
        return pb.PreStartContainerResponse()


def serve(servicer: DevicePluginServicer, socket_path: str) -> grpc.Server:
    """Serve the DevicePlugin service on a unix socket at a free path (each serve has a name of its own: a file there
    may be another instance's socket, so it is never removed here; sockets.clear_stale removes dead ones)."""
    # One gRPC thread waits on each call in flight, plus ListAndWatch streams and the calls answered inline.
    return lifecycle.serve_unix(
        socket_path, functools.partial(deviceplugin_pb2_grpc.add_DevicePluginServicer_to_server, servicer),
        CALL_WORKERS + 8, "grpc",
    )
