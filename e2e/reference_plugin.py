"""The reference device plugin's algorithm as a real device plugin for the real-cluster tier's kubelet.

    python -m e2e.reference_plugin --node localhost --fake-gpus 4x64GiB --server https://127.0.0.1:24003 \
        --ca ca.crt --token-file plugin.token

The reference program (AliyunContainerService/gpushare-device-plugin) cannot be built here, so this process does
what it does, over the same protocol: it serves `v1beta1.DevicePlugin` on `aliyungpushare.sock` in the kubelet's
device-plugin directory (pkg/gpu/nvidia/const.go, serverSock), registers `aliyun.com/gpu-mem` with no options
(server.go: no PreStartContainer, no GetPreferredAllocation), publishes `aliyun.com/gpu-count` in the node's status
(podmanager.go, patchGPUCount), registers again when the kubelet restarts (gpumanager.go watches the directory
with fsnotify), and answers Allocate with e2e.refalloc's decision: the pod it guesses, or a successful answer
naming `no-gpu-has-<N>GiB-to-run`. It lists pods from the API server as the reference does by default
(`spec.nodeName=<node>,status.phase=Pending`, retried) and marks the chosen pod with a strategic-merge patch,
retried once on a conflict (allocate.go). It acts with its ServiceAccount's token, under the reference's RBAC.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path
from types import FrameType

import grpc

from deviceplugin.api import deviceplugin_pb2 as dp
from deviceplugin.api import deviceplugin_pb2_grpc
from deviceplugin.inventory import Gpu, InventoryError, fake_gpus
from deviceplugin.kubelet import RestartWatch, register
from e2e.extender import Api
from e2e.kube import KubeError, Rest
from e2e.refalloc import Decision, assigned_patch, decide, no_gpu
from e2e.refservice import ReferenceService
from webhook.protocol import DEFAULT_RESOURCE

log = logging.getLogger("e2e.reference_plugin")

SOCKET_NAME = "aliyungpushare.sock"
GPU_COUNT = "aliyun.com/gpu-count"
LIST_RETRIES = 3  # podmanager.go, getPodListsByListAPIServer: three more tries, a second apart
RPC_TIMEOUT = 10.0


class ReferencePlugin(ReferenceService):
    def __init__(self, node: str, gpus: Sequence[Gpu], api: Api, plugin_dir: Path, unit: str = "GiB") -> None:
        super().__init__(gpus, unit)
        self.node = node
        self.api = api
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / SOCKET_NAME
        self._server: grpc.Server | None = None
        self._serve_lock = threading.Lock()
        self._watch: RestartWatch | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self.publish_gpu_count()
        self.serve_and_register()
        self._watch = RestartWatch(str(self.plugin_dir / "kubelet.sock"), str(self.socket), self.serve_and_register,
                                   interval=1.0)
        self._watch.start()
        log.info("reference-algorithm device plugin serving %s (%d GPUs) on %s", DEFAULT_RESOURCE, len(self.gpus),
                 self.socket)

    def publish_gpu_count(self) -> None:
        count = str(len(self.gpus))
        body = {"status": {"capacity": {GPU_COUNT: count}, "allocatable": {GPU_COUNT: count}}}
        self.api.call("PATCH", f"/api/v1/nodes/{self.node}/status", body, "application/merge-patch+json")

    def serve_and_register(self) -> None:
        with self._serve_lock:
            self._stop_server()
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="ref-grpc"))
            deviceplugin_pb2_grpc.add_DevicePluginServicer_to_server(self, server)  # type: ignore[no-untyped-call]
            server.add_insecure_port(f"unix://{self.socket}")
            server.start()
            self._server = server
            register(str(self.plugin_dir / "kubelet.sock"), SOCKET_NAME, DEFAULT_RESOURCE, dp.DevicePluginOptions(),
                     RPC_TIMEOUT)
        log.info("registered %s with the kubelet (endpoint %s)", DEFAULT_RESOURCE, SOCKET_NAME)

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(grace=1).wait(timeout=5)
            self._server = None

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        with self._serve_lock:
            self._stop_server()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    # -- Allocate: the API server's view, and the log --------------------------------------------------

    def answered(self, decision: Decision, pod_units: int, response: dp.AllocateResponse) -> None:
        if decision.made_up:
            log.warning("Allocate of %s %s: %s; answered NVIDIA_VISIBLE_DEVICES=%s", pod_units, self.unit,
                        decision.why, decision.visible)
        else:
            meta = (decision.pod or {}).get("metadata") or {}
            log.info("Allocate of %s %s: guessed pod %s/%s, GPU %s (%s)", pod_units, self.unit,
                     meta.get("namespace"), meta.get("name"), decision.index, decision.visible)

    def _pending_pods(self) -> list[dict[str, object]]:
        selector = urllib.parse.quote(f"spec.nodeName={self.node},status.phase=Pending")
        for attempt in range(LIST_RETRIES + 1):
            try:
                items: list[dict[str, object]] = self.api.get(f"/api/v1/pods?fieldSelector={selector}")["items"]
                return items
            except (KubeError, OSError):
                if attempt == LIST_RETRIES:
                    raise
                time.sleep(1)
        return []

    def decide(self, pod_units: int) -> Decision:
        try:
            pods = self._pending_pods()
        except (KubeError, OSError) as exc:
            return no_gpu(pod_units, self.unit, f"listing the node's pending pods failed: {exc}")
        decision = decide(pods, self.node, pod_units, self.gpus, resource=DEFAULT_RESOURCE, unit=self.unit)
        if decision.pod is None:
            return decision
        meta = decision.pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        for attempt in range(2):  # allocate.go retries once when the API server reports a conflict
            try:
                self.api.call("PATCH", path, assigned_patch(time.time_ns()), "application/strategic-merge-patch+json")
                return decision
            except (KubeError, OSError) as exc:
                if attempt == 0 and isinstance(exc, KubeError) and exc.status == 409:
                    continue
                return no_gpu(pod_units, self.unit, f"marking pod {meta['namespace']}/{meta['name']} assigned "
                                                    f"failed: {exc}")
        return no_gpu(pod_units, self.unit, "unreachable")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.reference_plugin", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node", required=True, help="this node's name (the reference reads NODE_NAME)")
    parser.add_argument("--fake-gpus", required=True, help="the GPUs, as COUNTxMEMORY (e.g. 4x64GiB)")
    parser.add_argument("--server", required=True, help="the API server's URL")
    parser.add_argument("--ca", type=Path, required=True, help="the API server's CA certificate")
    parser.add_argument("--token-file", type=Path, required=True, help="the plugin ServiceAccount's token")
    parser.add_argument("--plugin-dir", type=Path, default=Path("/var/lib/kubelet/device-plugins"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        gpus = fake_gpus(args.fake_gpus, args.node, "GiB")
        token = args.token_file.read_text().strip()
    except (InventoryError, OSError) as exc:
        print(f"reference plugin: {exc}", file=sys.stderr)
        return 2
    plugin = ReferencePlugin(args.node, gpus, Rest(args.server, args.ca, token=token), args.plugin_dir)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        plugin.start()
    except (KubeError, OSError, grpc.RpcError) as exc:
        print(f"reference plugin: could not start: {exc}", file=sys.stderr)
        plugin.stop()
        return 1
    stop.wait()
    plugin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
