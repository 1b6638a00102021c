"""The reference plugin's algorithm as modelled: candidate selection (table), and its failures on a kubelet."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node.inventory import fake_gpus
from tests.harness.apiserver.ports import MemoryClient, MemoryStore, Pod
from tests.harness.kubelet.node import Kubelet, KubeletConfig
from tests.harness.sim.baseline import BaselinePlugin, app_units, candidates

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory: unix socket paths are limited to 107 characters, pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="gs-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)

RESOURCE = "aliyun.com/gpu-mem"
GPUS = tuple(fake_gpus("2x8GiB", "node-a", "GiB"))


def pod(name: str, units: list[int], *, phase: str = "Pending", assume: int | None = 1, assigned: str = "false",
        idx: str = "0", inits: list[int] | None = None, node: str = "node-a") -> Pod:
    annotations = {"ALIYUN_COM_GPU_MEM_IDX": idx, "ALIYUN_COM_GPU_MEM_ASSIGNED": assigned,
                   "ALIYUN_COM_GPU_MEM_POD": str(sum(units)), "ALIYUN_COM_GPU_MEM_DEV": "8"}
    if assume is not None:
        annotations["ALIYUN_COM_GPU_MEM_ASSUME_TIME"] = str(assume)
    spec: dict[str, Any] = {"nodeName": node, "containers": [
        {"name": f"c{i}", "image": "img", "resources": {"limits": {RESOURCE: str(u)}}} for i, u in enumerate(units)]}
    if inits:
        spec["initContainers"] = [{"name": f"i{i}", "image": "img", "resources": {"limits": {RESOURCE: str(u)}}}
                                  for i, u in enumerate(inits)]
    return {"metadata": {"name": name, "namespace": "default", "annotations": annotations}, "spec": spec,
            "status": {"phase": phase}}


@pytest.mark.parametrize(("pods", "expected"), [
    ([pod("a", [2], assume=5), pod("b", [2], assume=3)], ["b", "a"]),
    ([pod("a", [2], phase="Running"), pod("b", [2])], ["b"]),
    ([pod("a", [2], assigned="true"), pod("b", [2])], ["b"]),
    ([pod("a", [0]), pod("b", [2])], ["b"]),
    ([{**pod("a", [2]), "metadata": {"name": "a", "annotations": {}}}], []),
    # isGPUMemoryAssumedPod requires the ASSUME_TIME annotation; getPendingPodsInNode skips other nodes' pods.
    ([pod("a", [2], assume=None), pod("b", [2], assume=1)], ["b"]),
    ([pod("a", [2], node="node-b"), pod("b", [2])], ["b"]),
])
def test_candidates_are_pending_assumed_pods_oldest_first(pods: list[Pod], expected: list[str]) -> None:
    assert [p["metadata"]["name"] for p in candidates(pods, "node-a", RESOURCE)] == expected


@pytest.mark.parametrize(("shape", "inits", "units"), [([2], None, 2), ([1, 3], None, 4), ([2], [6], 2)])
def test_request_counts_app_containers_only(shape: list[int], inits: list[int] | None, units: int) -> None:
    assert app_units(pod("p", shape, inits=inits), RESOURCE) == units


class Node:
    def __init__(self, root: Path) -> None:
        self.store = MemoryStore()
        self.user: MemoryClient = self.store.client("alice")
        self.kubelet = Kubelet(KubeletConfig("node-a", str(root / "node-a"), GPUS, start_attempts=1),
                               self.store.client("system:node:node-a"))
        self.plugin = BaselinePlugin("node-a", self.kubelet.config.plugin_dir, GPUS, self.store.client("plugin"))

    def start(self) -> None:
        self.kubelet.start()
        self.plugin.start()
        assert self.kubelet.wait_registered(5)

    def create_bound(self, body: Pod) -> None:
        spec = {k: v for k, v in body["spec"].items() if k != "nodeName"}  # the bind below sets it
        body = {**body, "spec": spec, "status": {"phase": "Pending"}}
        self.user.create_pod("default", body)
        self.user.bind("default", body["metadata"]["name"], "node-a")

    def runs_of(self, name: str, timeout: float = 10) -> list[Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = [r for r in self.kubelet.runs if r.pod == name]
            if runs:
                return runs
            time.sleep(0.01)
        raise AssertionError(f"pod {name} never started a container")


@pytest.fixture
def node(sock_dir: Path) -> Iterator[Node]:
    made = Node(sock_dir)
    yield made
    made.plugin.close()
    made.kubelet.close()


def test_admission_order_differs_from_assume_order_gives_a_wrong_gpu(node: Node) -> None:
    # b is created first (so admitted first) but a was assumed first: b's Allocate takes a's GPU.
    node.create_bound(pod("b", [2], assume=2, idx="1"))
    node.create_bound(pod("a", [2], assume=1, idx="0"))
    node.user.patch_pod("default", "b", {"metadata": {"creationTimestamp": "2020-01-01T00:00:00Z"}})
    node.start()
    [run] = node.runs_of("b")
    assert run.gpus == (0,) and run.annotations["ALIYUN_COM_GPU_MEM_IDX"] == "1"
    a = node.user.get_pod("default", "a")
    assert a is not None and a["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "true"


def test_multi_container_pod_gets_a_made_up_device_id(node: Node) -> None:
    node.start()
    node.create_bound(pod("m", [1, 1], idx="1"))
    runs = node.runs_of("m")
    assert runs[0].visible == "no-gpu-has-1GiB-to-run" and runs[0].made_up and not runs[0].started
    stuck = node.user.get_pod("default", "m")
    assert stuck is not None
    waiting = stuck["status"]["containerStatuses"][0]["state"]["waiting"]
    assert "unknown device id: no-gpu-has-1GiB-to-run" in waiting["message"]


def test_matching_pod_gets_its_own_gpu_and_is_marked(node: Node) -> None:
    node.start()
    node.create_bound(pod("s", [3], idx="1"))
    [run] = node.runs_of("s")
    assert run.gpus == (1,) and run.env["NVIDIA_VISIBLE_DEVICES"] == GPUS[1].uuid
    s = node.user.get_pod("default", "s")
    assert s is not None and s["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "true"
