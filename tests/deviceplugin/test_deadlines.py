"""Hung API calls cannot fill the plugin's workers: each kubelet call has a deadline, every request it makes is cut
to what is left of it, and the pool outlasts a burst of hung calls, so healthy calls are still answered."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc
from deviceplugin.devices import UnitInventory
from deviceplugin.kubelet import KubeletHoldings
from deviceplugin.server import DevicePluginServicer, serve
from deviceplugin.service import Service
from node import deadline

pytestmark = pytest.mark.timeout(60)
FAR = 10_000.0  # seconds: a deadline that never comes during a test


@pytest.mark.parametrize(
    ("until", "ceiling", "expected"),
    [
        (None, 5.0, 5.0),  # outside a kubelet call (the pod watch): the adapter's own bound
        (FAR, 5.0, 5.0),  # more time left than a request may take
        (-1.0, 5.0, 0.0),  # the call has been answered already: nothing left
    ],
)
def test_left(until: float | None, ceiling: float, expected: float) -> None:
    if until is None:
        assert deadline.left(ceiling) == expected
    else:
        assert deadline.run_until(time.monotonic() + until, lambda: deadline.left(ceiling)) == expected
    assert deadline.left(ceiling) == ceiling  # the deadline ends with its call


def test_pod_resources_list_is_cut_to_the_call(tmp_path: Path) -> None:
    socket = tmp_path / "pr.sock"
    socket.touch()
    holdings = KubeletHoldings(str(socket), str(tmp_path / "checkpoint"), "aliyun.com/gpu-mem", timeout=5)
    seen: list[float] = []

    class Stub:
        def List(self, request: Any, timeout: float) -> Any:
            seen.append(timeout)
            return type("Response", (), {"pod_resources": []})()

    holdings._stub = Stub  # type: ignore[assignment,method-assign]
    assert deadline.run_until(time.monotonic() + 2, holdings.from_pod_resources) == []
    assert 0 < seen[0] <= 2


class HangingService:
    """PreStartContainer for the device "hung-N" waits on an API server that never answers."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.hung = threading.Semaphore(0)
        self.left: list[float] = []

    def prestart(self, device_ids: Sequence[str]) -> None:
        if device_ids[0].startswith("hung"):
            self.left.append(deadline.left(FAR))
            self.hung.release()
            self.release.wait(30)


@pytest.fixture
def plugin(
    tmp_path: Path, inventory: UnitInventory
) -> Iterator[tuple[HangingService, deviceplugin_pb2_grpc.DevicePluginStub]]:
    service = HangingService()
    servicer = DevicePluginServicer(cast(Service, service), inventory, threading.Event(), timeout=20)
    server = serve(servicer, str(tmp_path / "dp.sock"))
    channel = grpc.insecure_channel(f"unix://{tmp_path}/dp.sock")
    try:
        yield service, deviceplugin_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
    finally:
        service.release.set()
        channel.close()
        server.stop(grace=None)
        servicer.close()


def test_ten_hung_calls_leave_room_for_healthy_ones(
    plugin: tuple[HangingService, deviceplugin_pb2_grpc.DevicePluginStub],
) -> None:
    service, stub = plugin
    hung = [stub.PreStartContainer.future(pb.PreStartContainerRequest(devices_ids=[f"hung-{n}"])) for n in range(10)]
    for _ in hung:
        assert service.hung.acquire(timeout=30)  # all ten are holding a worker now
    for n in range(20):  # answered while the ten still hang: none waits for a worker
        stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=[f"healthy-{n}"]), timeout=15)
    assert not any(call.done() for call in hung)
    assert all(0 < left <= 20 for left in service.left)  # the hung work runs under its call's deadline


def test_a_hung_call_is_answered_at_its_deadline(tmp_path: Path, inventory: UnitInventory) -> None:
    service = HangingService()
    servicer = DevicePluginServicer(cast(Service, service), inventory, threading.Event(), timeout=0.2)
    server = serve(servicer, str(tmp_path / "dp.sock"))
    try:
        with grpc.insecure_channel(f"unix://{tmp_path}/dp.sock") as channel:
            stub = deviceplugin_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as caught:
                stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["hung-0"]), timeout=15)
    finally:
        service.release.set()
        server.stop(grace=None)
        servicer.close()
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "could not answer PreStartContainer within 0.2 s" in (caught.value.details() or "")
    assert 0 < service.left[0] <= 0.2
