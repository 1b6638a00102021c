"""Allocate and PreStartContainer with 50, 110 and 800 pods on the node, against an API server 0 and 1-5 ms away.

Run: .venv/bin/python -m bench.bench_deviceplugin_calls [--sizes 50,110,800] [--samples 200] [--latencies 0,1-5]
The real plugin (deviceplugin.main.Plugin, its kubernetes-client adapter and pod watch) runs against the test API
server (tests/harness/apiserver) over HTTPS, which waits a uniform 1-5 ms before answering each request (as across a
network) or answers at once (0: what the plugin itself costs shows without the wait), and against the test kubelet
(tests/harness/kubelet) over real unix sockets (PodResources Get on, as in Kubernetes 1.34, and answered by pod name as
the kubelet does). Each latency gets a fresh node. The API server and the kubelet run in processes of their own, as on
a node: the plugin's process holds what a plugin's does, plus this client, and freezes its start-up heap as the
plugin's run() does (common/heap.py). (The test kubelet rewrites its whole checkpoint after every Allocate and removal,
as the kubelet does; when that cost it 16 ms of Python at 800 pods, just before each timed call, that work (not the
file's write) slowed the plugin's next call, from either process, seemingly through the CPU's caches: every step of
PreStartContainer, pure ones included, took about a fifth longer at 800 pods than at 50: the plugin's cost looked as if
it grew with the pods while it did not. tests/harness/kubelet/devices.py now rewrites it in about 0.5 ms.) The node is
filled with running, allocated pods; then new pods are created one at a time, the kubelet's calls for each are timed,
and each is deleted again, so the node holds the same pods throughout a size: Allocate (its GetPreferredAllocation not
counted), timed here, and PreStartContainer (resolution, validation, a GET and a PATCH of the pod), timed by the
kubelet's process around its own call. The sizes take turns, 5 turns of a fifth of the samples each (the node is filled
up and emptied down again between them), so that a machine whose load changes during the run weighs on every size
alike. A few new pods that are not timed come first: a fresh plugin opens its connections on its first calls.
Baselines measured in the same run: GetDevicePluginOptions (a gRPC round trip that decides nothing) and a GET of a
pod through the plugin's own API client (one API round trip). Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from common import heap
from contract import ASSIGNED, Allocation, ContainerSlot, Contract
from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc
from deviceplugin.devices import device_ids, slot_of
from deviceplugin.main import Plugin
from deviceplugin.settings import settings_from
from node.inventory import fake_gpus
from tests.harness.apiserver.client import SimClient
from tests.harness.kubelet.scripted import TestKubelet
from tests.harness.pods import admitted, assigned, unit_pod

NODE = "bench-node"
GPUS = "8x128GiB"
WARM_UP = 20
ROUNDS = 5  # turns of the sizes
TARGETS = {"allocate_p99_ms": 5.0, "prestart_p99_ms": 50.0, "flat": 1.3}
Latency = tuple[float, float]  # what the API server waits before each answer: uniform between the two, seconds


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def timed(call: Callable[[], object]) -> float:
    begin = time.perf_counter()
    call()
    return time.perf_counter() - begin


def latency_of(text: str) -> Latency:
    """`0` or `1-5` (milliseconds) as seconds."""
    low, _, high = text.partition("-")
    return float(low) / 1000, float(high or low) / 1000


def serve_api(ready: Path, latency: Latency) -> None:
    """The API server process: serve until the parent closes our stdin; `ready` gets its URL, CA and admin token.

    Imported here only: the API server's modules (its admission chain with a CEL interpreter) have no place in the
    measured process, whose heap should be what a plugin's is."""
    import tests.harness.apiserver.server as sim
    from tests.harness.apiserver.handler import Handler

    class SlowHandler(Handler):
        """The test API server's handler, answering `latency` late like an API server across a network (watches and
        their events are not delayed: they stream)."""

        def _dispatch(self, method: str) -> None:
            if "watch=" not in self.path and latency[1] > 0:
                time.sleep(random.uniform(*latency))
            super()._dispatch(method)

    vars(sim)["Handler"] = SlowHandler  # ApiServer.start builds its handler class from this module name
    api = sim.ApiServer(deletion="immediate").start()
    try:
        api.client().create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        api.write_kubeconfig(ready.with_suffix(".kubeconfig"))
        ready.with_suffix(".tmp").write_text(json.dumps({"url": api.url, "token": api.admin_token,
                                                         "ca": api.ca_pem.decode()}))
        ready.with_suffix(".tmp").rename(ready)
        sys.stdin.read()
    finally:
        api.stop()


def stop_child(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """A child process of this bench ends when its stdin closes; one that does not within 10 s is killed."""
    if process.stdin is not None and not process.stdin.closed:
        process.stdin.close()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class ApiProcess:
    """The test API server in a child process, stopped by its PID."""

    def __init__(self, tmp: Path, latency: str) -> None:
        ready = tmp / "api.json"
        self.process = subprocess.Popen([sys.executable, "-m", "bench.bench_deviceplugin_calls", "--serve-api",
                                         str(ready), "--latencies", latency], stdin=subprocess.PIPE)
        until = time.monotonic() + 60
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > until:
                self.stop()
                raise SystemExit("the test API server process did not start; see its output above")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        self.kubeconfig = ready.with_suffix(".kubeconfig")
        self.admin = SimClient(info["url"], info["token"], info["ca"].encode())

    def stop(self) -> None:
        stop_child(self.process)


def serve_kubelet(tmp: Path) -> None:
    """The test kubelet's process: started, it answers `{}`; then one JSON order per line on stdin (`registered`,
    `hold`, `start`, `forget`), one JSON answer per line on stdout, until the parent closes stdin. The order `start`
    is the kubelet's PreStartContainer, answered with the seconds it took; a failed order is answered `error`."""
    uids: dict[str, str] = {}  # pod name -> UID, as the parent created them
    kubelet = TestKubelet(str(tmp / "dp"), str(tmp / "pr.sock"), lambda ns, name: uids[name])
    kubelet.get_enabled = True
    kubelet.start()
    try:
        print("{}", flush=True)
        for line in sys.stdin:
            order = json.loads(line)
            name = order.get("name", "")
            answer: dict[str, Any] = {}
            try:
                if order["op"] == "registered":  # the plugin's endpoint, once it registered and listed its devices
                    kubelet.wait_registrations(1)
                    kubelet.wait_lists(1)
                    answer["endpoint"] = kubelet.registered[-1].request.endpoint
                elif order["op"] == "hold":  # the kubelet records the assignment after Allocate returns
                    uids[name] = order["uid"]
                    kubelet.hold("team", name, "main", order["ids"])
                elif order["op"] == "start":
                    answer["seconds"] = timed(functools.partial(kubelet.start_container, "team", name, "main"))
                elif order["op"] == "forget":
                    kubelet.forget("team", name)
                else:
                    answer["error"] = "no such order"
            except Exception as exc:  # the parent stops with it
                answer["error"] = f"{order['op']} {name}: {exc!r}"
            print(json.dumps(answer), flush=True)
    finally:
        kubelet.stop()


class KubeletProcess:
    """The test kubelet in a child process, as the kubelet is on a node, told what to do line by line; stopped by
    its PID."""

    def __init__(self, tmp: Path) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "bench.bench_deviceplugin_calls", "--serve-kubelet",
                                         str(tmp)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._answer("start")

    def ask(self, op: str, **order: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **order}) + "\n")
        self.process.stdin.flush()
        return self._answer(op)

    def _answer(self, op: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.stop()
            raise SystemExit(f"the test kubelet process ended during '{op}'; see its output above")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            self.stop()
            raise SystemExit(f"the test kubelet failed: {answer['error']}")
        return answer

    def stop(self) -> None:
        stop_child(self.process)


class Node:
    """One node: the slow API server and the test kubelet (processes of their own) and the real plugin, and the pods
    on it."""

    def __init__(self, tmp: Path, latency: str) -> None:
        self.api = ApiProcess(tmp, latency)
        self.admin = self.api.admin
        self.signer = Ed25519PrivateKey.generate()
        public = tmp / "verify.pub"
        public.write_bytes(self.signer.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
        self.contract = Contract(delivery="env")
        self.gpus = fake_gpus(GPUS, NODE, "GiB")
        self.used = [0] * len(self.gpus)
        self.uids: dict[str, str] = {}
        self.kubelet = KubeletProcess(tmp)
        settings = settings_from({
            "GPUSHARE_NODE_NAME": NODE, "GPUSHARE_VERIFY_KEY": str(public), "GPUSHARE_FAKE_GPUS": GPUS,
            "GPUSHARE_DEVICE_PLUGIN_DIR": str(tmp / "dp"), "GPUSHARE_POD_RESOURCES_SOCKET": str(tmp / "pr.sock"),
            "GPUSHARE_KUBELET_CHECKPOINT": str(tmp / "dp" / "kubelet_internal_checkpoint"),
            "GPUSHARE_CDI_DIR": str(tmp / "cdi"), "GPUSHARE_FAKE_GPU_DIR": str(tmp / "fake-gpus"),
            "GPUSHARE_KUBECONFIG": str(self.api.kubeconfig),
            "GPUSHARE_MAX_DEVICES": "100000", "GPUSHARE_LOG_LEVEL": "WARNING",
        })
        self.plugin = Plugin(settings)
        self.plugin.start()
        heap.freeze_start_up()  # as deviceplugin.main.run does once the plugin has started
        endpoint = self.kubelet.ask("registered")["endpoint"]
        self.channel = grpc.insecure_channel(f"unix://{tmp / 'dp' / endpoint}")
        self.stub = deviceplugin_pb2_grpc.DevicePluginStub(self.channel)  # type: ignore[no-untyped-call]
        self.free = {g.index: list(device_ids(g)) for g in self.gpus}
        self.count = 0  # pods created so far (their names)
        self.running: list[tuple[str, int, list[str]]] = []  # the pods the node is filled with: name, GPU, IDs

    def stop(self) -> None:
        self.channel.close()
        self.plugin.stop()
        self.kubelet.stop()
        self.api.stop()

    def _pod(self, units: int, running: bool) -> tuple[str, dict[str, Any], int, list[str]]:
        self.count += 1
        name = f"job-{self.count}"
        index = next(i for i, g in enumerate(self.gpus) if self.used[i] + units <= g.memory_units)
        self.used[index] += units
        pod = assigned(admitted(unit_pod(name, {"main": units}), self.contract, self.signer), index, 128)
        pod["spec"]["nodeName"] = NODE
        ids = [self.free[index].pop() for _ in range(units)]
        if running:  # what the plugin recorded when it started: the allocation record and ASSIGNED=true
            annotations = pod["metadata"]["annotations"]
            intent = annotations[self.contract.intent_key]
            allocation_id = str(json.loads(intent)["allocationId"])
            gpu = self.gpus[index]
            record = Allocation(allocation_id, NODE, index, gpu.uuid, {"main": ContainerSlot(units, slot_of(ids))})
            annotations.update({self.contract.allocation_key: record.to_json(), ASSIGNED: "true"})
            pod["status"] = {"phase": "Running"}
        created = self.admin.create_pod("team", pod)
        self.uids[name] = created["metadata"]["uid"]
        return name, created, index, ids

    def resize(self, size: int) -> None:
        """Running, allocated pods of 1 GiB, created or deleted until the node has `size` of them."""
        changed = ""
        while len(self.running) < size:
            name, _, index, ids = self._pod(1, running=True)
            self.kubelet.ask("hold", name=name, uid=self.uids[name], ids=ids)
            self.running.append((name, index, ids))
            changed = name
        while len(self.running) > size:
            changed = self.running[-1][0]
            self._delete(*self.running.pop())
        if changed:
            self._seen(self.uids[changed], present=any(name == changed for name, _, _ in self.running))

    def _delete(self, name: str, index: int, ids: list[str]) -> None:
        self.admin.delete_pod("team", name)
        self.kubelet.ask("forget", name=name)
        self.free[index][:0] = ids  # handed out last again, as the plugin prefers (GetPreferredAllocation)
        self.used[index] -= len(ids)

    def _seen(self, uid: str, present: bool = True) -> None:
        """Wait until the plugin's pod watch has delivered the pod (or its deletion)."""
        until = time.monotonic() + 10
        while (uid in self.plugin.service.index) != present and time.monotonic() < until:
            time.sleep(0.002)

    def get_one(self) -> None:
        """One API round trip through the plugin's own client: the baseline of PreStartContainer's GET and PATCH."""
        assert self.plugin.api is not None
        self.plugin.api.get_pod("team", self.running[0][0])

    def new_pod(self) -> tuple[float, float]:
        """A new pod bound to the node, then the kubelet's Allocate and PreStartContainer for it (seconds each); then
        the pod is deleted, so the node keeps the number of pods it was filled with."""
        name, created, index, ids = self._pod(1, running=False)
        self._seen(created["metadata"]["uid"])
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
        allocate = timed(lambda: self.stub.Allocate(request, timeout=20))
        self.kubelet.ask("hold", name=name, uid=self.uids[name], ids=ids)
        prestart: float = self.kubelet.ask("start", name=name)["seconds"]
        self._delete(name, index, ids)
        self._seen(created["metadata"]["uid"], present=False)
        return allocate, prestart


def measure(latency: str, sizes: list[int], samples: int) -> dict[int, dict[str, list[float]]]:
    """Per node size, the seconds of each call for `samples` new pods, on a fresh node whose API server waits
    `latency`."""
    rows: dict[int, dict[str, list[float]]] = {size: {"allocate": [], "prestart": [], "options": [], "get": []}
                                               for size in sizes}
    with tempfile.TemporaryDirectory(prefix="gpb-", dir="/tmp") as tmp:
        node = Node(Path(tmp), latency)
        try:
            node.resize(min(sizes))
            for _ in range(WARM_UP):  # a fresh plugin's first calls open its connections
                node.new_pod()
            # The sizes take turns, a share of the samples each, so that a machine whose load changes during the run
            # weighs on every size alike.
            for turn in range(ROUNDS):
                for size in sizes:
                    node.resize(size)
                    got = rows[size]
                    for _ in range(samples * (turn + 1) // ROUNDS - samples * turn // ROUNDS):
                        allocate, prestart = node.new_pod()
                        got["allocate"].append(allocate)
                        got["prestart"].append(prestart)
                        got["options"].append(timed(lambda: node.stub.GetDevicePluginOptions(pb.Empty(), timeout=5)))
                        got["get"].append(timed(node.get_one))
        finally:
            node.stop()
    return rows


def report(latency: str, rows: dict[int, dict[str, list[float]]], samples: int) -> list[tuple[str, bool]]:
    """Print the table of one latency; the targets it meets or misses."""
    print(f"Allocate and PreStartContainer, API server {latency} ms away, {GPUS}, {samples} new pods per size "
          "(ms: p50 / p99)")
    print(f"{'pods on node':>12} {'Options':>15} {'API GET':>15} {'Allocate':>15} {'PreStart':>15}")
    for size, got in rows.items():
        cells = [f"{p(got[k], 0.5):6.2f} / {p(got[k], 0.99):6.2f}" for k in ("options", "get", "allocate", "prestart")]
        print(f"{size:>12} " + " ".join(f"{c:>15}" for c in cells))
    checks: list[tuple[str, bool]] = []
    for size, got in rows.items():
        checks.append((f"Allocate p99 at {size} pods, API {latency} ms < {TARGETS['allocate_p99_ms']:g} ms",
                       p(got["allocate"], 0.99) < TARGETS["allocate_p99_ms"]))
        checks.append((f"PreStartContainer p99 at {size} pods, API {latency} ms < {TARGETS['prestart_p99_ms']:g} ms",
                       p(got["prestart"], 0.99) < TARGETS["prestart_p99_ms"]))
    small, large = rows[min(rows)], rows[max(rows)]
    for call in ("allocate", "prestart"):
        ratio = statistics.median(large[call]) / statistics.median(small[call])
        checks.append((f"{call} flat, API {latency} ms: median at {max(rows)} pods / at {min(rows)} pods = "
                       f"{ratio:.2f} <= {TARGETS['flat']}", ratio <= TARGETS["flat"]))
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="50,110,800")
    # 200 new pods per size, so the p99 is the 99th percentile: of 40 it was the slowest call, a single stall of the
    # machine (the gRPC round trip that decides nothing had p99 of 2-4 ms in the same runs).
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--latencies", default="0,1-5", help="API server latencies in ms, each a fresh node")
    parser.add_argument("--serve-api", type=Path, help=argparse.SUPPRESS)  # the API server's own process
    parser.add_argument("--serve-kubelet", type=Path, help=argparse.SUPPRESS)  # the kubelet's own process
    args = parser.parse_args()
    if args.serve_api is not None:
        serve_api(args.serve_api, latency_of(args.latencies))
        return 0
    if args.serve_kubelet is not None:
        serve_kubelet(args.serve_kubelet)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    checks: list[tuple[str, bool]] = []
    for latency in args.latencies.split(","):
        checks += report(latency, measure(latency, sizes, args.samples), args.samples)
    for text, met in checks:
        print(f"{'met   ' if met else 'MISSED'} {text}")
    return 0 if all(met for _, met in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
