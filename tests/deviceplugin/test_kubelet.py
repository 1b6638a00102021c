"""The plugin driven by an in-process test kubelet over real unix sockets, with an in-memory API server."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from contract import ASSIGNED, IDX, Contract, parse_allocation
from deviceplugin.devices import device_ids, slot_of
from deviceplugin.kubelet import KubeletHoldings, KubeletUnavailable
from tests.harness.plugin.fakes import NODE
from tests.harness.plugin.rig import Rig, make_rig
from tests.harness.pods import admitted, assigned, unit_pod

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cdi_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    yield from make_rig(tmp_path_factory.mktemp("c"), GPUSHARE_DELIVERY="cdi", GPUSHARE_PLACEMENT="node")


def test_serves_before_registering_with_the_right_options(rig: Rig) -> None:
    (first,) = rig.kubelet.wait_registrations(1)
    assert first.plugin_was_serving
    assert first.request.version == "v1beta1"
    assert re.fullmatch(r"gpushare-aliyun-com-gpu-mem-[0-9a-f]{8}\.sock", first.request.endpoint)
    assert rig.plugin.socket_path == os.path.join(rig.kubelet.plugin_dir, first.request.endpoint)
    assert first.request.resource_name == "aliyun.com/gpu-mem"
    assert first.request.options.pre_start_required
    assert rig.api.capacity == {"aliyun.com/gpu-count": "2"}


def test_list_and_watch_sends_the_full_list_again_on_health_change(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.kubelet.plugin()
    devices = rig.kubelet.wait_lists(1)
    assert sorted(devices) == sorted(d for g in rig.inventory.gpus for d in device_ids(g))
    assert set(devices.values()) == {"Healthy"}
    rig.inventory.set_health(1, False)  # what a critical XID does
    devices = rig.kubelet.wait_lists(2)
    assert len(devices) == 16
    assert {devices[d] for d in device_ids(rig.inventory.gpus[1])} == {"Unhealthy"}
    assert {devices[d] for d in device_ids(rig.inventory.gpus[0])} == {"Healthy"}


def test_registers_again_after_the_kubelet_restarts(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    # The restart removes every plugin socket (the plugin may serve a new one before the next line runs): the
    # plugin registers again, serving on a socket that exists.
    rig.kubelet.restart()
    registrations = rig.kubelet.wait_registrations(2)
    assert len(registrations) >= 2 and registrations[-1].plugin_was_serving
    assert registrations[-1].request.endpoint != registrations[0].request.endpoint  # a new name for each serve
    assert rig.plugin.socket_path is not None and os.path.exists(rig.plugin.socket_path)
    rig.pod("p", {"main": 2})
    (admitted,) = rig.kubelet.admit("team", "p", [("main", 2)])
    assert admitted.response.envs["GPUSHARE_SLOT"] == slot_of(admitted.device_ids)


def test_multi_container_pod_with_init_container(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("p", {"a": 2, "b": 3}, index=1, init={"setup": 2})
    admitted = rig.kubelet.admit("team", "p", [("a", 2), ("b", 3)], init=[("setup", 2)])
    assert [a.container for a in admitted] == ["setup", "a", "b"]
    assert admitted[0].device_ids == admitted[1].device_ids  # the init container's devices are reused
    for a in admitted:
        assert dict(a.response.envs) == {"GPUSHARE_SLOT": slot_of(a.device_ids)}
        assert not a.response.cdi_devices
    for name in ("setup", "a", "b"):
        rig.kubelet.start_container("team", "p", name)
    pod = rig.api.pod("team", "p")
    annotations = pod["metadata"]["annotations"]
    assert annotations[ASSIGNED] == "true"
    record = parse_allocation(annotations["gpushare.io/allocation"])
    assert (record.node, record.gpu_index, record.gpu_uuid) == (NODE, 1, rig.inventory.gpus[1].uuid)
    # PodResources names "a" for the set "setup" shares with it, so the record lists the app containers.
    assert {n: s.units for n, s in record.containers.items()} == {"a": 2, "b": 3}
    assert record.containers["b"].slot == slot_of(admitted[2].device_ids)
    events = [e for e in rig.api.events if e[0] == "team/p"]
    assert events and {e[1] for e in events} == {"Normal"} and events[0][2] == "GpuShareAllocated"
    assert "GPU 1" in events[-1][3]


def test_repeated_allocate_and_prestart_are_idempotent(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("p", {"main": 4})
    (admitted,) = rig.kubelet.admit("team", "p", [("main", 4)])
    rig.kubelet.start_container("team", "p", "main")
    patches, events = len(rig.api.patches), len(rig.api.events)
    assert patches == 1
    stub = rig.kubelet.plugin()
    from deviceplugin.api import deviceplugin_pb2 as pb

    again = stub.Allocate(pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=list(reversed(admitted.device_ids)))
    ]))
    assert again.container_responses[0] == admitted.response
    for _ in range(3):  # container restarts
        rig.kubelet.start_container("team", "p", "main")
    assert (len(rig.api.patches), len(rig.api.events)) == (patches, events)


def test_allocate_refuses_devices_for_no_validated_pod(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.api.add(assigned(unit_pod("raw", {"main": 2}), 0, 8))  # created before the webhook: no intent
    with pytest.raises(grpc.RpcError) as caught:
        rig.kubelet.admit("team", "raw", [("main", 2)])
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    text = caught.value.details() or ""
    assert "exactly 2 GiB" in text and "webhook is installed" in text and "team/raw has no gpushare.io/intent" in text


def test_allocate_refuses_unknown_devices(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("p", {"main": 1})
    with pytest.raises(grpc.RpcError) as caught:
        rig.kubelet.admit("team", "p", [("main", 1)], pick=["no-gpu-has-8MiB-to-run"])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no-gpu-has-8MiB-to-run" in (caught.value.details() or "")


def test_prestart_refusal_is_an_error_and_a_warning_event(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    pod = admitted(unit_pod("p", {"main": 2}), rig.contract, rig.signer)
    rig.api.add(assigned(pod, 0, 16))  # the extender thinks GPU 0 has 16 GiB
    rig.kubelet.admit("team", "p", [("main", 2)])
    with pytest.raises(grpc.RpcError) as caught:
        rig.kubelet.start_container("team", "p", "main")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "pod team/p (container 'main') says GPU 0 has 16 GiB" in (caught.value.details() or "")
    assert [(e[1], e[2]) for e in rig.api.events] == [("Warning", "GpuShareBadAssignment")]
    assert rig.api.pod("team", "p")["metadata"]["annotations"][ASSIGNED] == "false"


def test_prestart_retries_a_conflicting_patch(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("p", {"main": 2})
    rig.kubelet.admit("team", "p", [("main", 2)])
    original = rig.api.patch_pod_annotations
    calls: list[str] = []

    def racing(namespace: str, name: str, annotations: dict[str, str], resource_version: str) -> dict[str, object]:
        if not calls:
            rig.api.touch(namespace, name)  # a status update lands between our read and our patch
        calls.append(resource_version)
        return original(namespace, name, annotations, resource_version)

    rig.api.patch_pod_annotations = racing  # type: ignore[method-assign,assignment]
    rig.kubelet.start_container("team", "p", "main")
    assert len(calls) == 2 and calls[0] != calls[1]
    assert rig.api.pod("team", "p")["metadata"]["annotations"][ASSIGNED] == "true"


def test_cdi_mode_places_on_the_node_and_writes_the_spec(cdi_rig: Rig) -> None:
    rig = cdi_rig
    rig.kubelet.wait_registrations(1)
    rig.pod("big", {"main": 6}, index=None)
    rig.pod("small", {"main": 3}, index=None)
    rig.pod("huge", {"main": 6}, index=None)
    rig.pod("tiny", {"main": 2}, index=None)
    for name, units in (("big", 6), ("small", 3), ("huge", 6), ("tiny", 2)):
        (admitted,) = rig.kubelet.admit("team", name, [("main", units)])
        slot = slot_of(admitted.device_ids)
        assert list(admitted.response.cdi_devices) == [pb_name(slot)]
        if name == "huge":  # 7 GiB are free on the node, but no single GPU has 6
            with pytest.raises(grpc.RpcError) as caught:
                rig.kubelet.start_container("team", name, "main")
            assert "no GPU of node node-a has that much room (free GiB: GPU 0: 2, GPU 1: 5)" in (
                caught.value.details() or ""
            )
            assert IDX not in rig.api.pod("team", name)["metadata"]["annotations"]
            rig.kubelet.forget("team", name)
            continue
        rig.kubelet.start_container("team", name, "main")
        with open(os.path.join(rig.plugin.settings.cdi_dir, f"gpushare-{slot}.json")) as handle:
            spec = json.load(handle)
        index = int(rig.api.pod("team", name)["metadata"]["annotations"][IDX])
        uuid = rig.inventory.gpus[index].uuid
        assert spec["kind"] == "gpushare.io/gpu" and spec["devices"][0]["name"] == slot
        assert f"NVIDIA_VISIBLE_DEVICES={uuid}" in spec["devices"][0]["containerEdits"]["env"]
    placed = {n: rig.api.pod("team", n)["metadata"]["annotations"][IDX] for n in ("big", "small", "tiny")}
    assert placed == {"big": "0", "small": "1", "tiny": "0"}  # best fit: 2 GiB fit in GPU 0's last 2
    assert [e[2] for e in rig.api.events if e[0] == "team/huge"] == ["GpuShareNoRoom"]
    # Garbage collection: the kubelet forgets a pod, its spec goes.
    rig.kubelet.forget("team", "big")
    rig.plugin.service.clock = lambda: 1e12  # far past the grace period
    removed = rig.plugin.service.collect_garbage()
    assert len(removed) == 1
    assert len(os.listdir(rig.plugin.settings.cdi_dir)) == 2


def pb_name(slot: str) -> object:
    from deviceplugin.api import deviceplugin_pb2 as pb

    return pb.CDIDevice(name=f"gpushare.io/gpu={slot}")


def test_checkpoint_fallback_when_pod_resources_is_missing(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    stored = rig.pod("p", {"main": 2})
    (admitted,) = rig.kubelet.admit("team", "p", [("main", 2)])
    rig.kubelet.forget("team", "p")  # PodResources no longer says it ...
    settings = rig.plugin.settings
    holdings = rig.plugin.holdings
    assert holdings is not None
    holdings.socket = str(rig.tmp / "missing.sock")  # type: ignore[attr-defined]
    checkpoint = {"Data": {"PodDeviceEntries": [{
        "PodUID": stored["metadata"]["uid"], "ContainerName": "main", "ResourceName": "aliyun.com/gpu-mem",
        "DeviceIDs": {"0": admitted.device_ids}, "AllocResp": "",
    }], "RegisteredDevices": {}}, "Checksum": 0}
    with open(settings.kubelet_checkpoint, "w") as handle:
        json.dump(checkpoint, handle)
    from deviceplugin.api import deviceplugin_pb2 as pb

    rig.kubelet.plugin().PreStartContainer(pb.PreStartContainerRequest(devices_ids=admitted.device_ids))
    assert rig.api.pod("team", "p")["metadata"]["annotations"][ASSIGNED] == "true"


def test_env_mode_refuses_a_container_without_the_webhooks_env(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    cdi_stamped = admitted(unit_pod("p", {"main": 2}), Contract(delivery="cdi"), rig.signer)  # no env injected
    rig.api.add(assigned(cdi_stamped, 0, 8))
    rig.kubelet.admit("team", "p", [("main", 2)])
    with pytest.raises(grpc.RpcError) as caught:
        rig.kubelet.start_container("team", "p", "main")
    text = caught.value.details() or ""
    assert "pod team/p container 'main' lacks the gpushare webhook's GPU environment" in text
    assert "NVIDIA_VISIBLE_DEVICES is missing" in text and "GPUSHARE_DELIVERY=env" in text
    assert [e[2] for e in rig.api.events] == ["GpuShareNoEnv"]


def test_unreachable_api_server_fails_allocate_loudly(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("p", {"main": 2})
    rig.api.fail = True
    with pytest.raises(grpc.RpcError) as caught:
        rig.kubelet.admit("team", "p", [("main", 2)])
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "could not read node node-a's pods" in (caught.value.details() or "")


@pytest.fixture
def slow_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    yield from make_rig(tmp_path_factory.mktemp("s"), GPUSHARE_RPC_TIMEOUT_SECONDS="0.5")


def test_a_hung_api_server_cannot_hang_the_kubelet(slow_rig: Rig) -> None:
    rig = slow_rig
    rig.kubelet.wait_registrations(1)
    rig.api.stale_cache = True
    rig.api.refresh_cache()  # the watch has not delivered "p" yet: Allocate must ask the API server
    rig.pod("p", {"main": 2})
    release = threading.Event()
    original = rig.api.list_node_pods

    def hung() -> list[dict[str, Any]]:
        release.wait(10)
        return original()

    rig.api.node_pods = rig.api.list_node_pods = hung  # type: ignore[method-assign]
    try:
        with pytest.raises(grpc.RpcError) as caught:
            rig.kubelet.admit("team", "p", [("main", 2)])
    finally:
        release.set()
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "could not answer Allocate within 0.5 s (GPUSHARE_RPC_TIMEOUT_SECONDS)" in (caught.value.details() or "")


def test_rate_limited_pod_resources_is_retried(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("p", {"main": 2})
    rig.kubelet.admit("team", "p", [("main", 2)])
    rig.kubelet.list_failures = [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
    rig.kubelet.list_calls = 0
    rig.kubelet.start_container("team", "p", "main")
    assert rig.kubelet.list_calls == 3
    assert rig.api.pod("team", "p")["metadata"]["annotations"][ASSIGNED] == "true"


def test_unimplemented_pod_resources_falls_back_to_the_checkpoint(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("p", {"main": 2})
    (admitted,) = rig.kubelet.admit("team", "p", [("main", 2)])
    os.unlink(rig.kubelet.checkpoint_path)
    rig.kubelet.list_failures = [grpc.StatusCode.UNIMPLEMENTED]
    with pytest.raises(grpc.RpcError) as caught:  # no checkpoint file either: a clear error, no guess
        rig.kubelet.start_container("team", "p", "main")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    text = caught.value.details() or ""
    assert "PodResources List failed: UNIMPLEMENTED" in text and "kubelet_internal_checkpoint" in text
    uid = rig.api.pod("team", "p")["metadata"]["uid"]
    with open(rig.plugin.settings.kubelet_checkpoint, "w") as handle:
        json.dump({"Data": {"PodDeviceEntries": [{"PodUID": uid, "ContainerName": "main",
                   "ResourceName": "aliyun.com/gpu-mem", "DeviceIDs": admitted.device_ids}]}, "Checksum": 0}, handle)
    rig.kubelet.list_failures = [grpc.StatusCode.UNIMPLEMENTED]
    rig.kubelet.start_container("team", "p", "main")
    assert rig.api.pod("team", "p")["metadata"]["annotations"][ASSIGNED] == "true"


def test_preferred_allocation_keeps_required_devices_and_the_size(rig: Rig) -> None:
    from deviceplugin.api import deviceplugin_pb2 as pb

    (registered,) = rig.kubelet.wait_registrations(1)
    assert registered.request.options.get_preferred_allocation_available
    gpu0, gpu1 = (device_ids(g) for g in rig.inventory.gpus)
    request = pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=gpu1[:3] + gpu0[:3], must_include_deviceIDs=[gpu1[2]], allocation_size=3
        ),
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=gpu0[:2], allocation_size=2),
    ])
    answer = rig.kubelet.plugin().GetPreferredAllocation(request)
    first, second = (list(r.deviceIDs) for r in answer.container_responses)
    assert first[0] == gpu1[2] and len(first) == 3 and set(first) <= set(gpu1[:3] + gpu0[:3])
    assert sorted(second) == sorted(gpu0[:2])


def test_room_is_judged_on_a_fresh_list_before_refusing(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("old", {"main": 6})
    rig.pod("p", {"main": 4})
    rig.api.stale_cache = True
    rig.api.refresh_cache()  # the watch cache still lists "old" after it is deleted
    rig.api.delete("team", "old")
    rig.kubelet.admit("team", "p", [("main", 4)])
    rig.kubelet.start_container("team", "p", "main")
    assert rig.api.pod("team", "p")["metadata"]["annotations"][ASSIGNED] == "true"
    rig.pod("new", {"main": 5})  # 4 + 5 > 8 on GPU 0, in the cache and in a fresh list alike
    rig.api.refresh_cache()
    rig.kubelet.admit("team", "new", [("main", 5)])
    with pytest.raises(grpc.RpcError) as caught:
        rig.kubelet.start_container("team", "new", "main")
    assert "but 4 of its 8 GiB are already promised to team/p (4)" in (caught.value.details() or "")


@pytest.mark.parametrize(("content", "message"), [
    (b"\xff\xfe{}", "is not UTF-8 text"),
    (b'{"Data": {"PodDeviceEntries": 7}}', "PodDeviceEntries is not a list"),
    (b"[" * 100_000, "is not the device manager's JSON"),
])
def test_an_unreadable_checkpoint_is_refused_with_a_reason(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "checkpoint").write_bytes(content)
    reader = KubeletHoldings(str(tmp_path / "missing.sock"), str(tmp_path / "checkpoint"), "aliyun.com/gpu-mem", 1.0)
    with pytest.raises(KubeletUnavailable, match=message):
        reader.holdings()
