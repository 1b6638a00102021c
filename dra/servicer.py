"""The kubelet's DRA gRPC services: DRAPlugin v1 (prepare, unprepare) and plugin registration, on unix sockets."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import grpc
from grpc_health.v1 import health_pb2_grpc

from contract.keys import DRA_DRIVER
from dra.api import dra_pb2 as pb
from dra.api import dra_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from dra.cdispec import PreparedDevice
from dra.claims import ClaimError, ClaimRef
from dra.health import HealthServicer
from node import deadline, lifecycle

log = logging.getLogger(__name__)
T = TypeVar("T")

# k8s.io/kubelet pkg/apis/pluginregistration/v1/constants.go; the service name the kubelet 1.34-1.37 knows
# (pkg/kubelet/cm/dra/plugin/dra_plugin.go:50-53).
PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin",)
# The kubelet gives each NodePrepareResources / NodeUnprepareResources call 45 s (pkg/kubelet/cm/dra/plugin/
# dra_plugin.go:46); claims of one call are worked on in parallel, and a claim whose API read hangs holds a worker
# until its deadline, so the pool outlasts a few hung calls.
CALL_WORKERS = 32
DEFAULT_TIMEOUT = 20.0
# Calls served at once. A call beyond them is refused at once (RESOURCE_EXHAUSTED, which the kubelet retries) rather
# than queued behind hung ones, where its time would run out before it started.
CALL_HANDLERS = 32
# What each call leaves of the deadline the kubelet gave it (its gRPC deadline, 45 s), for the answer's way back.
DEADLINE_MARGIN = 1.0


class ClaimDriver(Protocol):
    def prepare(self, ref: ClaimRef) -> list[PreparedDevice]: ...

    def unprepare(self, ref: ClaimRef) -> None: ...


class DRAPluginServicer(dra_pb2_grpc.DRAPluginServicer):
    """Answers every claim of a call by itself: a failure is that claim's `error`, never a gRPC status."""

    def __init__(self, driver: ClaimDriver, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.driver = driver
        self.timeout = timeout
        self._workers = concurrent.futures.ThreadPoolExecutor(CALL_WORKERS, thread_name_prefix="dra-claim")

    def close(self) -> None:
        self._workers.shutdown(wait=False, cancel_futures=True)

    def _each(self, verb: str, refs: Sequence[ClaimRef], work: Callable[[ClaimRef], T],
              remaining: float | None = None) -> list[tuple[T | None, str]]:
        """Each claim's answer or error; the deadline runs from the call's start and bounds every request the work
        makes (node/deadline.py), within what is left of the caller's own (`remaining`, seconds), so the answer
        comes before the kubelet gives up on it."""
        budget = self.timeout if remaining is None else min(self.timeout, remaining - DEADLINE_MARGIN)
        if budget <= 0:
            return [(None, f"the gpushare DRA driver could not start to {verb} ResourceClaim {ref} before the "
                           "kubelet's deadline for the call (other calls held it); the kubelet retries")
                    for ref in refs]
        until = time.monotonic() + budget
        futures = [self._workers.submit(deadline.run_until, until, functools.partial(work, ref)) for ref in refs]
        out: list[tuple[T | None, str]] = []
        for ref, future in zip(refs, futures, strict=True):
            try:
                out.append((future.result(timeout=max(0.0, until - time.monotonic())), ""))
            except concurrent.futures.TimeoutError:
                future.cancel()  # still queued: never start work whose answer nobody waits for
                out.append((None, f"the gpushare DRA driver could not {verb} ResourceClaim {ref} within "
                                  f"{budget:.3g} s; check its API server access in its log (the kubelet retries)"))
            except ClaimError as exc:
                log.warning("Could not %s ResourceClaim %s: %s", verb, ref, exc)
                out.append((None, str(exc)))
            except Exception as exc:
                log.exception("%s of ResourceClaim %s failed unexpectedly", verb, ref)
                out.append((None, f"the gpushare DRA driver failed unexpectedly to {verb} ResourceClaim {ref} "
                                  f"({exc!r}); see its log and report the problem"))
        return out

    def NodePrepareResources(
        self, request: pb.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> pb.NodePrepareResourcesResponse:
        refs = [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]
        response = pb.NodePrepareResourcesResponse()
        answers = self._each("prepare", refs, self.driver.prepare, context.time_remaining())
        for ref, (devices, error) in zip(refs, answers, strict=True):
            answer = response.claims[ref.uid]
            answer.error = error
            answer.devices.extend(
                pb.Device(request_names=[d.request], pool_name=d.pool, device_name=d.device,
                          cdi_device_ids=list(d.cdi_ids))
                for d in devices or []
            )
        return response

    def NodeUnprepareResources(
        self, request: pb.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> pb.NodeUnprepareResourcesResponse:
        refs = [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]
        response = pb.NodeUnprepareResourcesResponse()
        answers = self._each("unprepare", refs, self.driver.unprepare, context.time_remaining())
        for ref, (_, error) in zip(refs, answers, strict=True):
            response.claims[ref.uid].error = error  # every claim gets an entry, an empty one when it went well
        return response


class RegistrationServicer(pluginregistration_pb2_grpc.RegistrationServicer):
    """What the kubelet's plugin watcher asks on the registration socket; GetInfo must answer within its 1 s."""

    def __init__(self, endpoint: str, name: str = DRA_DRIVER) -> None:
        self.info = pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=name, endpoint=endpoint, supported_versions=list(SUPPORTED_VERSIONS)
        )
        self.registered = threading.Event()

    def GetInfo(
        self, request: pluginregistration_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> pluginregistration_pb2.PluginInfo:
        return self.info

    def NotifyRegistrationStatus(
        self, request: pluginregistration_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("the kubelet registered DRA driver %s at %s", self.info.name, self.info.endpoint)
            self.registered.set()
        else:
            self.registered.clear()
            log.error("The kubelet refused to register DRA driver %s (%s), so it will prepare no claim of this "
                      "driver; check the kubelet's log and its DRA settings, then restart the driver.",
                      self.info.name, request.error or "no reason given")
        return pluginregistration_pb2.RegistrationStatusResponse()


def _serve(socket_path: str, add: Callable[[grpc.Server], None], handlers: int = 8) -> grpc.Server:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)  # a stale socket from an earlier run
    return lifecycle.serve_unix(socket_path, add, handlers, "dra-grpc", max_calls=handlers)


def serve_plugin(servicer: DRAPluginServicer, socket_path: str, handlers: int = CALL_HANDLERS) -> grpc.Server:
    return _serve(socket_path, functools.partial(dra_pb2_grpc.add_DRAPluginServicer_to_server, servicer), handlers)


def serve_registration(servicer: RegistrationServicer, socket_path: str) -> grpc.Server:
    return _serve(
        socket_path, functools.partial(pluginregistration_pb2_grpc.add_RegistrationServicer_to_server, servicer)
    )


def serve_health(servicer: HealthServicer, socket_path: str) -> grpc.Server:
    return _serve(socket_path, functools.partial(health_pb2_grpc.add_HealthServicer_to_server, servicer), handlers=2)
