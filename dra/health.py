"""The driver's gRPC health service (grpc.health.v1) on its own unix socket, which the pod's probes call.

The overall service "" is what readiness asks: SERVING once the kubelet has registered the driver, its DRA service
is up and the node's ResourceSlices are published, NOT_SERVING otherwise. "liveness" is SERVING while the
process serves its sockets at all, so a driver that only waits on the API server is not restarted for it."""

from __future__ import annotations

from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

READY = ""
ALIVE = "liveness"


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Check answers from the driver's state at the time of the call (no status to keep in step); Watch is
    left unimplemented, as the probes do not use it."""

    def __init__(self, ready: Callable[[], bool], alive: Callable[[], bool]) -> None:
        self.checks = {READY: ready, ALIVE: alive}

    def Check(self, request: health_pb2.HealthCheckRequest,
              context: grpc.ServicerContext) -> health_pb2.HealthCheckResponse:
        check = self.checks.get(request.service)
        if check is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"The gpushare DRA driver has no health service "
                          f"{request.service!r}; ask for {READY!r} (ready) or {ALIVE!r} (alive).")
        status = health_pb2.HealthCheckResponse.SERVING if check() else health_pb2.HealthCheckResponse.NOT_SERVING
        return health_pb2.HealthCheckResponse(status=status)
