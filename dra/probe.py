"""`gpushare-dra-probe ready|alive`: the driver container's exec probes, a Check of its gRPC health service.

The driver serves grpc.health.v1 on `health[-<pod uid>].sock` in its plugin directory (dra/health.py); the probe
runs in the same container, so it finds the socket from the same GPUSHARE_DRA_PLUGIN_DIR and GPUSHARE_POD_UID.
Exit 0 when the service answers SERVING, 1 otherwise, with one sentence on stdout that the kubelet puts in the
pod's Unhealthy event."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common import cli
from common.settings import SettingsError
from dra import settings as dra_settings
from dra.health import ALIVE, READY
from dra.settings import DRA_VARIABLES

CHECKS = {"ready": READY, "alive": ALIVE}
# Within the probes' own timeoutSeconds (manifests/dra/dra-plugin.yaml: 3 s), so the kubelet reads our reason.
TIMEOUT = 1.5
_WHAT = {
    "ready": "ready once the kubelet has registered it, its DRA service serves and its node's ResourceSlices are "
             "published; its log says which is missing",
    "alive": "alive while it serves its sockets; its log says why it stopped",
}


def probe(check: str, socket_path: str, timeout: float = TIMEOUT) -> tuple[bool, str]:
    """Ask the health service at `socket_path` about `check` ("ready" or "alive"): (passed, a sentence)."""
    with grpc.insecure_channel("unix:" + socket_path) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            answer = stub.Check(health_pb2.HealthCheckRequest(service=CHECKS[check]), timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
            return False, (f"The gpushare DRA driver's health service on {socket_path} did not answer within "
                           f"{timeout:g} s ({code}): the driver is not serving; see its log.")
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
    if answer.status == health_pb2.HealthCheckResponse.SERVING:
        return True, f"The gpushare DRA driver on {socket_path} is {check} ({status})."
    return False, f"The gpushare DRA driver on {socket_path} is not {check} ({status}): it is {_WHAT[check]}."


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    parser = cli.parser("gpushare-dra-probe", "Ask the gpushare DRA driver's health service whether it is ready "
                        "or alive (the DaemonSet's exec probes).", DRA_VARIABLES)
    parser.add_argument("check", choices=sorted(CHECKS), help="ready: registered, serving, slices published; "
                        "alive: serving its sockets")
    args = parser.parse_args(argv)
    try:
        settings = dra_settings.dra_settings_from(environ) if environ is not None else dra_settings.from_environ()
    except SettingsError as exc:
        print(f"The gpushare DRA driver's settings are not valid, so its health socket is unknown: {exc}.")
        return 1
    passed, message = probe(args.check, settings.health_path)
    print(message)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
