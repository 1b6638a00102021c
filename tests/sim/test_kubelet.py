"""The simulated kubelet against a scripted device plugin over real unix sockets, and an in-memory API server."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from deviceplugin.api import deviceplugin_pb2 as dp
from deviceplugin.api import deviceplugin_pb2_grpc, podresources_pb2_grpc
from deviceplugin.api import podresources_pb2 as pr
from deviceplugin.devices import device_ids
from node.inventory import Gpu, fake_gpus
from tests.harness.apiserver.ports import MemoryStore, Pod
from tests.harness.kubelet.devices import DeviceState, Entry
from tests.harness.kubelet.node import Kubelet, KubeletConfig

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory: unix socket paths are limited to 107 characters, pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="gs-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)

RESOURCE = "aliyun.com/gpu-mem"
GPUS = tuple(fake_gpus("2x4GiB", "node-a", "GiB"))


class Refuse(Exception):
    pass


class ScriptedPlugin(deviceplugin_pb2_grpc.DevicePluginServicer):
    """A device plugin whose Allocate and PreStartContainer answers a test decides; it records every call."""

    def __init__(self, plugin_dir: str, gpus: tuple[Gpu, ...], *, pre_start_required: bool = True,
                 allocate: Callable[[list[str]], dp.ContainerAllocateResponse] | None = None,
                 prestart_failures: int = 0, prefer: Callable[[list[str], int], list[str]] | None = None) -> None:
        self.plugin_dir = plugin_dir
        self.prefer = prefer  # GetPreferredAllocation, offered only when given: (available, size) -> answer
        self.devices = [d for g in gpus for d in device_ids(g)]
        self.pre_start_required = pre_start_required
        self.allocate_fn = allocate or (lambda ids: dp.ContainerAllocateResponse(envs={"SLOT": ",".join(ids)}))
        self.prestart_failures = prestart_failures
        self.calls: list[tuple[str, list[str]]] = []
        self.server: grpc.Server | None = None

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        deviceplugin_pb2_grpc.add_DevicePluginServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port("unix://" + os.path.join(self.plugin_dir, "scripted.sock"))
        server.start()
        self.server = server
        with grpc.insecure_channel("unix://" + os.path.join(self.plugin_dir, "kubelet.sock")) as channel:
            registration = deviceplugin_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            registration.Register(
                dp.RegisterRequest(version="v1beta1", endpoint="scripted.sock", resource_name=RESOURCE), timeout=5)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop(0).wait(5)

    def GetDevicePluginOptions(self, request: dp.Empty, context: grpc.ServicerContext) -> dp.DevicePluginOptions:
        self.calls.append(("GetDevicePluginOptions", []))
        return dp.DevicePluginOptions(pre_start_required=self.pre_start_required,
                                      get_preferred_allocation_available=self.prefer is not None)

    def GetPreferredAllocation(self, request: dp.PreferredAllocationRequest, context: grpc.ServicerContext
                               ) -> dp.PreferredAllocationResponse:
        assert self.prefer is not None and len(request.container_requests) == 1
        wanted = request.container_requests[0]
        self.calls.append(("GetPreferredAllocation", sorted(wanted.must_include_deviceIDs)))
        answer = self.prefer(sorted(wanted.available_deviceIDs), wanted.allocation_size)
        return dp.PreferredAllocationResponse(container_responses=[dp.ContainerPreferredAllocationResponse(
            deviceIDs=answer)])

    def ListAndWatch(self, request: dp.Empty, context: grpc.ServicerContext) -> Iterator[dp.ListAndWatchResponse]:
        yield dp.ListAndWatchResponse(devices=[dp.Device(ID=d, health="Healthy") for d in self.devices])
        while context.is_active():
            time.sleep(0.05)

    def Allocate(self, request: dp.AllocateRequest, context: grpc.ServicerContext) -> dp.AllocateResponse:
        assert len(request.container_requests) == 1
        ids = list(request.container_requests[0].devices_ids)
        self.calls.append(("Allocate", ids))
        try:
            return dp.AllocateResponse(container_responses=[self.allocate_fn(ids)])
        except Refuse as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            raise

    def PreStartContainer(self, request: dp.PreStartContainerRequest, context: grpc.ServicerContext
                   ) -> dp.PreStartContainerResponse:
        self.calls.append(("PreStartContainer", list(request.devices_ids)))
        if self.prestart_failures:
            self.prestart_failures -= 1
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "pod default/p has no valid intent; recreate it")
        return dp.PreStartContainerResponse()


def wait_for(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def gpu_pod(name: str, apps: list[int], inits: list[int] | None = None, env: list[dict[str, Any]] | None = None,
            annotations: dict[str, str] | None = None, sidecars: tuple[int, ...] = ()) -> Pod:
    """`sidecars`: the positions of the init containers that are restartable."""
    def container(prefix: str, i: int, units: int) -> dict[str, Any]:
        out: dict[str, Any] = {"name": f"{prefix}{i}", "image": "img", "env": list(env or [])}
        if units:
            out["resources"] = {"limits": {RESOURCE: str(units)}}
        if prefix == "init" and i in sidecars:
            out["restartPolicy"] = "Always"
        return out

    spec: dict[str, Any] = {"containers": [container("app", i, u) for i, u in enumerate(apps)]}
    if inits:
        spec["initContainers"] = [container("init", i, u) for i, u in enumerate(inits)]
    return {"metadata": {"name": name, "annotations": dict(annotations or {})}, "spec": spec}


class Node:
    def __init__(self, root: Path, plugin: Callable[[str], ScriptedPlugin]) -> None:
        self.store = MemoryStore()
        self.user = self.store.client("alice")
        self.kubelet = Kubelet(KubeletConfig("node-a", str(root / "node-a"), GPUS, backoff_s=0.01),
                               self.store.client("system:node:node-a"))
        self.kubelet.start()
        self.plugin = plugin(self.kubelet.config.plugin_dir)
        self.plugin.start()
        assert self.kubelet.wait_registered(5)

    def run(self, pod: Pod) -> Pod:
        name = pod["metadata"]["name"]
        self.user.create_pod("default", pod)
        self.user.bind("default", name, "node-a")
        wait_for(lambda: self.phase(name) in ("Running", "Failed") or self.waiting(name))
        found = self.user.get_pod("default", name)
        assert found is not None
        return found

    def phase(self, name: str) -> str:
        pod = self.user.get_pod("default", name)
        return str(((pod or {}).get("status") or {}).get("phase"))

    def waiting(self, name: str) -> bool:
        pod = self.user.get_pod("default", name) or {}
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        return any("waiting" in (s.get("state") or {}) for s in statuses)

    def close(self) -> None:
        self.plugin.close()
        self.kubelet.close()


@pytest.fixture
def node_factory(sock_dir: Path) -> Iterator[Callable[..., Node]]:
    made: list[Node] = []

    def make(**kwargs: Any) -> Node:
        node = Node(sock_dir, lambda d: ScriptedPlugin(d, GPUS, **kwargs))
        made.append(node)
        return node

    yield make
    for node in made:
        node.close()


def test_registration_options_and_device_list(node_factory: Callable[..., Node]) -> None:
    node = node_factory()
    assert node.plugin.calls[0] == ("GetDevicePluginOptions", [])
    conn = node.kubelet.plugin
    assert conn is not None and conn.options.pre_start_required
    assert sorted(conn.healthy()) == sorted(node.plugin.devices)


def test_init_container_first_one_request_per_call_and_reuse(node_factory: Callable[..., Node]) -> None:
    node = node_factory()
    pod = node.run(gpu_pod("p", apps=[2, 1], inits=[3]))
    assert pod["status"]["phase"] == "Running"
    allocs = [ids for call, ids in node.plugin.calls if call == "Allocate"]
    assert [len(ids) for ids in allocs] == [3, 2, 1]
    # The app containers reuse the finished init container's devices, as the kubelet's device manager does.
    assert set(allocs[1]) <= set(allocs[0]) and set(allocs[2]) <= set(allocs[0])
    assert not set(allocs[1]) & set(allocs[2])
    prestarts = [ids for call, ids in node.plugin.calls if call == "PreStartContainer"]
    assert prestarts == allocs


def test_pod_resources_and_checkpoint(node_factory: Callable[..., Node]) -> None:
    node = node_factory()
    pod = node.run(gpu_pod("p", apps=[2]))
    config = node.kubelet.config
    with grpc.insecure_channel("unix://" + config.pod_resources_socket) as channel:
        lister = podresources_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        listed = lister.List(pr.ListPodResourcesRequest(), timeout=5)
        got = lister.Get(pr.GetPodResourcesRequest(pod_name="p", pod_namespace="default"), timeout=5)
        allocatable = lister.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=5)
    [listed_pod] = listed.pod_resources
    assert (listed_pod.name, listed_pod.namespace) == ("p", "default")
    ids = list(listed_pod.containers[0].devices[0].device_ids)
    assert len(ids) == 2 and got.pod_resources == listed_pod
    assert len(allocatable.devices[0].device_ids) == 8
    with open(config.checkpoint, encoding="utf-8") as fh:
        doc = json.load(fh)
    [entry] = doc["Data"]["PodDeviceEntries"]
    assert entry["PodUID"] == pod["metadata"]["uid"] and entry["ContainerName"] == "app0"
    assert entry["ResourceName"] == RESOURCE and entry["DeviceIDs"] == {"-1": ids}
    assert isinstance(doc["Checksum"], int) and len(doc["Data"]["RegisteredDevices"][RESOURCE]) == 8


def test_pod_resources_lists_app_and_sidecar_containers_only(node_factory: Callable[..., Node]) -> None:
    node = node_factory()
    pod = node.run(gpu_pod("p", apps=[1, 0], inits=[3, 1], sidecars=(1,)))
    assert pod["status"]["phase"] == "Running"
    with grpc.insecure_channel("unix://" + node.kubelet.config.pod_resources_socket) as channel:
        lister = podresources_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        [listed] = lister.List(pr.ListPodResourcesRequest(), timeout=5).pod_resources
    held = {c.name: [d for devices in c.devices for d in devices.device_ids] for c in listed.containers}
    assert list(held) == ["init1", "app0", "app1"]  # the regular init container init0 never appears
    assert (len(held["init1"]), len(held["app0"]), held["app1"]) == (1, 1, [])
    with open(node.kubelet.config.checkpoint, encoding="utf-8") as fh:
        entries = json.load(fh)["Data"]["PodDeviceEntries"]
    assert sorted(e["ContainerName"] for e in entries) == ["app0", "init0", "init1"]  # the checkpoint has them all


def test_preferred_allocation_is_asked_and_taken(node_factory: Callable[..., Node]) -> None:
    node = node_factory(prefer=lambda available, size: available[-size:])
    pod = node.run(gpu_pod("p", apps=[3], inits=[2]))
    assert pod["status"]["phase"] == "Running"
    calls = [(call, ids) for call, ids in node.plugin.calls if call in ("GetPreferredAllocation", "Allocate")]
    devices = sorted(node.plugin.devices)
    assert [c for c, _ in calls] == ["GetPreferredAllocation", "Allocate", "GetPreferredAllocation", "Allocate"]
    assert sorted(calls[1][1]) == devices[-2:]  # the init container: the answer, taken
    assert calls[2][1] == devices[-2:]  # the app container must include the init container's devices
    assert set(calls[3][1]) > set(devices[-2:])


def test_allocate_error_fails_pod_with_kubelet_message(node_factory: Callable[..., Node]) -> None:
    def refuse(ids: list[str]) -> dp.ContainerAllocateResponse:
        raise Refuse("no validated pod asks for 2 GiB; is the webhook installed?")

    node = node_factory(allocate=refuse)
    pod = node.run(gpu_pod("p", apps=[2]))
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    assert pod["status"]["message"] == (
        "Allocate failed due to rpc error: code = FailedPrecondition desc = no validated pod asks for 2 GiB; "
        "is the webhook installed?, which is unexpected")
    assert not node.kubelet.devices.in_use()


@pytest.mark.parametrize(("failures", "phase"), [(0, "Running"), (2, "Running"), (10, "Pending")])
def test_prestart_errors_back_off_and_retry(node_factory: Callable[..., Node], failures: int, phase: str) -> None:
    node = node_factory(prestart_failures=failures)
    pod = node.run(gpu_pod("p", apps=[1]))
    assert pod["status"]["phase"] == phase
    prestarts = [c for c, _ in node.plugin.calls if c == "PreStartContainer"]
    assert len(prestarts) == min(failures + 1, node.kubelet.config.start_attempts)
    if phase == "Pending":
        waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
        assert waiting["reason"] == "CreateContainerError"
        assert "pod default/p has no valid intent; recreate it" in waiting["message"]


def test_environment_uses_current_annotations_and_cdi_specs(node_factory: Callable[..., Node]) -> None:
    def cdi(ids: list[str]) -> dp.ContainerAllocateResponse:
        device = dp.CDIDevice(name="gpushare.io/gpu=s1")
        return dp.ContainerAllocateResponse(envs={"FROM_PLUGIN": "1"}, cdi_devices=[device])

    node = node_factory(allocate=cdi)
    spec = {"cdiVersion": "0.6.0", "kind": "gpushare.io/gpu", "devices": [{"name": "s1", "containerEdits": {
        "env": [f"NVIDIA_VISIBLE_DEVICES={GPUS[1].uuid}"], "deviceNodes": [{"path": "/dev/nvidia1"}]}}]}
    with open(os.path.join(node.kubelet.config.cdi_dir, "gpushare.json"), "w", encoding="utf-8") as fh:
        json.dump(spec, fh)
    env = [{"name": "IDX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['ALIYUN_COM_GPU_MEM_IDX']"}}},
           {"name": "MISSING", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['nope']"}}}]
    node.run(gpu_pod("p", apps=[1], env=env, annotations={"ALIYUN_COM_GPU_MEM_IDX": "1"}))
    [run] = node.kubelet.runs
    assert run.env["FROM_PLUGIN"] == "1" and run.env["IDX"] == "1" and run.env["MISSING"] == ""
    assert run.gpus == (1,) and run.started and not run.made_up


def test_unknown_cdi_device_is_a_start_failure(node_factory: Callable[..., Node]) -> None:
    node = node_factory(allocate=lambda ids: dp.ContainerAllocateResponse(cdi_devices=[dp.CDIDevice(name="x/y=z")]))
    pod = node.run(gpu_pod("p", apps=[1]))
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert "unresolvable CDI devices x/y=z" in waiting["message"]


def test_deletion_frees_devices_and_confirms(node_factory: Callable[..., Node]) -> None:
    node = node_factory()
    node.run(gpu_pod("p", apps=[3]))
    assert len(node.kubelet.devices.in_use()) == 3
    node.user.delete_pod("default", "p")
    wait_for(lambda: node.user.get_pod("default", "p") is None)
    assert not node.kubelet.devices.in_use()


def test_admission_is_serial_and_sorted_by_creation_within_a_batch(sock_dir: Path) -> None:
    store = MemoryStore()
    user = store.client("alice")
    for name, units in (("b", 1), ("a", 2), ("c", 3)):
        user.create_pod("default", gpu_pod(name, apps=[units]))
        user.bind("default", name, "node-a")
    for name, stamp in (("a", "2020-01-01T00:00:01Z"), ("b", "2020-01-01T00:00:02Z"), ("c", "2020-01-01T00:00:00Z")):
        user.patch_pod("default", name, {"metadata": {"creationTimestamp": stamp}})
    kubelet = Kubelet(KubeletConfig("node-a", str(sock_dir / "n"), GPUS), store.client("system:node:node-a"))
    plugin = ScriptedPlugin(kubelet.config.plugin_dir, GPUS)
    try:
        kubelet.start()  # the three pods arrive in one batch from the initial list
        plugin.start()
        wait_for(lambda: len([c for c, _ in plugin.calls if c == "Allocate"]) == 3)
        assert [len(ids) for c, ids in plugin.calls if c == "Allocate"] == [3, 2, 1]
    finally:
        plugin.close()
        kubelet.close()


def test_the_checkpoint_file_holds_every_container_held_and_is_rewritten_on_each_change(tmp_path: Path) -> None:
    path = tmp_path / "kubelet_internal_checkpoint"
    state = DeviceState(str(path), "aliyun.com/gpu-mem")
    state.registered = ["GPU-0-_-0", "GPU-0-_-1", "GPU-0-_-2"]
    answer = dp.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": "0"}).SerializeToString()
    state.record(Entry("u1", "team", "a", "init", "aliyun.com/gpu-mem", ("GPU-0-_-0",), b""), init=True,
                 restartable=False)
    state.record(Entry("u1", "team", "a", "main", "aliyun.com/gpu-mem", ("GPU-0-_-0", "GPU-0-_-1"), answer),
                 init=False, restartable=False)
    state.record(Entry("u2", "team", "b", "main", "aliyun.com/gpu-mem", ("GPU-0-_-2",), answer), init=False,
                 restartable=False)
    written = json.loads(path.read_text())
    assert written == state.checkpoint()
    assert [(e["PodUID"], e["ContainerName"], e["DeviceIDs"]) for e in written["Data"]["PodDeviceEntries"]] == [
        ("u1", "init", {"-1": ["GPU-0-_-0"]}), ("u1", "main", {"-1": ["GPU-0-_-0", "GPU-0-_-1"]}),
        ("u2", "main", {"-1": ["GPU-0-_-2"]})]
    assert written["Data"]["RegisteredDevices"] == {"aliyun.com/gpu-mem": state.registered}
    assert written["Checksum"] == zlib.crc32(json.dumps(written["Data"], sort_keys=True).encode())

    state.release("u1")
    written = json.loads(path.read_text())
    assert [e["PodUID"] for e in written["Data"]["PodDeviceEntries"]] == ["u2"]
    assert written["Checksum"] == zlib.crc32(json.dumps(written["Data"], sort_keys=True).encode())
    again = DeviceState(str(path), "aliyun.com/gpu-mem")
    again.load({"u2": ("team", "b")})
    assert again.entries() == state.entries()


def test_restart_removes_sockets_keeps_checkpoint_and_reloads_it(node_factory: Callable[..., Node]) -> None:
    node = node_factory()
    node.run(gpu_pod("p", apps=[2]))
    before = node.kubelet.devices.checkpoint()
    node.kubelet.stop()
    plugin_dir = node.kubelet.config.plugin_dir
    assert sorted(os.listdir(plugin_dir)) == ["kubelet_internal_checkpoint"]
    node.kubelet.start()
    assert os.path.exists(os.path.join(plugin_dir, "kubelet.sock"))
    assert node.kubelet.devices.checkpoint() == before
    node.plugin.close()
    node.plugin = ScriptedPlugin(plugin_dir, GPUS)
    node.plugin.start()
    assert node.kubelet.wait_registered(5)
    assert node.kubelet.registration.registrations == 2
