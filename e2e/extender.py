"""A gpushare scheduler-extender stand-in, called by the real kube-scheduler over HTTP (filter and bind).

It does what the reference extender (AliyunContainerService/gpushare-scheduler-extender) does, with its
service account's token: `filter` keeps the nodes where one GPU has room for the pod's GPU-share total;
`bind` picks the GPU (best fit: the fullest GPU that still has room), writes ALIYUN_COM_GPU_MEM_IDX/DEV/POD/
ASSUME_TIME and ASSIGNED="false" on the pod (an UPDATE that the validating webhook judges), then creates the
Binding. A GPU's memory is node capacity ÷ `aliyun.com/gpu-count`, as the reference extender assumes. The
pod total is the effective request (`webhook.protocol.Demand.total`), which the webhook requires for POD.
Wire types: k8s.io/kube-scheduler/extender/v1/types.go (ExtenderArgs, ExtenderFilterResult,
ExtenderBindingArgs, ExtenderBindingResult; Go field names, no JSON tags).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from e2e.kube import KubeError, Rest
from webhook.protocol import (
    ASSIGNED,
    ASSUME_TIME,
    DEFAULT_RESOURCE,
    DEV,
    IDX,
    POD,
    ProtocolError,
    demand_of,
    read_annotations,
)

log = logging.getLogger("e2e.extender")
GPU_COUNT = "aliyun.com/gpu-count"


def _total(pod: dict[str, Any]) -> int:
    try:
        return demand_of(pod, DEFAULT_RESOURCE).total
    except ProtocolError:
        return 0


class Api(Protocol):
    """What the extender needs of the API server (e2e.kube.Rest in the tier, a fake in unit tests)."""

    def get(self, path: str) -> Any: ...

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any: ...


class Extender:
    def __init__(self, api: Api) -> None:
        self.api = api
        self._lock = threading.Lock()  # decisions are serial, as in the reference extender's bind

    def gpus(self, node: str) -> tuple[int, int]:
        """(GPU count, memory units of one GPU) of a node, from the plugin's capacity."""
        capacity = (self.api.get(f"/api/v1/nodes/{node}").get("status") or {}).get("capacity") or {}
        count = int(capacity.get(GPU_COUNT, "0"))
        total = int(capacity.get(DEFAULT_RESOURCE, "0"))
        return count, (total // count if count else 0)

    def used(self, node: str, exclude_uid: str = "") -> dict[int, int]:
        selector = urllib.parse.quote(f"spec.nodeName={node}")
        pods = self.api.get(f"/api/v1/pods?fieldSelector={selector}").get("items") or []
        used: dict[int, int] = {}
        for pod in pods:
            meta = pod.get("metadata") or {}
            if meta.get("uid") == exclude_uid or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            idx = read_annotations(pod).get(IDX)
            if idx is not None and idx.isdigit():
                used[int(idx)] = used.get(int(idx), 0) + _total(pod)
        return used

    def choose(self, node: str, units: int, uid: str) -> tuple[int | None, int, str]:
        count, per_gpu = self.gpus(node)
        if count == 0:
            return None, 0, f"node {node} publishes no {GPU_COUNT}; is the gpushare device plugin running?"
        used = self.used(node, uid)
        fits = [(per_gpu - used.get(i, 0), i) for i in range(count) if per_gpu - used.get(i, 0) >= units]
        if not fits:
            return None, per_gpu, f"no GPU of node {node} has {units} units free (used per GPU: {used})"
        return min(fits)[1], per_gpu, ""

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        pod = args.get("Pod") or {}
        units = _total(pod)
        names = list(args.get("NodeNames") or [])
        if units == 0:
            return {"NodeNames": names, "FailedNodes": {}, "Error": ""}
        keep, failed = [], {}
        for node in names:
            index, _, why = self.choose(node, units, str((pod.get("metadata") or {}).get("uid", "")))
            if index is None:
                failed[node] = why
            else:
                keep.append(node)
        return {"NodeNames": keep, "FailedNodes": failed, "Error": ""}

    def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        ns, name, node = args["PodNamespace"], args["PodName"], args["Node"]
        with self._lock:
            pod = self.api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
            units = _total(pod)
            if units:
                index, per_gpu, why = self.choose(node, units, str(pod["metadata"].get("uid", "")))
                if index is None:
                    return {"Error": why}
                annotations = {IDX: str(index), DEV: str(per_gpu), POD: str(units),
                               ASSUME_TIME: str(time.time_ns()), ASSIGNED: "false"}
                version = pod["metadata"]["resourceVersion"]
                patch = {"metadata": {"annotations": annotations, "resourceVersion": version}}
                self.api.call("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}", patch,
                              "application/merge-patch+json")
            binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": ns,
                       "uid": args.get("PodUID")}, "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
            self.api.call("POST", f"/api/v1/namespaces/{ns}/pods/{name}/binding", binding)
        log.info("bound %s/%s to %s%s", ns, name, node, f" GPU {index}" if units else "")
        return {"Error": ""}


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        log.debug(format, *args)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            args = json.loads(self.rfile.read(length))
            if self.path.endswith("/filter"):
                answer = self.server.extender.filter(args)
            elif self.path.endswith("/bind"):
                answer = self.server.extender.bind(args)
            else:
                answer = {"Error": f"unknown verb {self.path}"}
        except (KubeError, ValueError, KeyError, OSError) as exc:
            log.warning("%s failed: %s", self.path, exc)
            answer = {"Error": str(exc)}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, extender: Extender) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.extender = extender


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.extender", description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--server", required=True, help="the API server's URL")
    parser.add_argument("--ca", type=Path, required=True)
    parser.add_argument("--token-file", type=Path, required=True, help="the extender ServiceAccount's token")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api = Rest(args.server, args.ca, token=args.token_file.read_text().strip())
    server = Server(args.port, Extender(api))
    log.info("extender serving on 127.0.0.1:%s", args.port)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
