"""The plugin's Events: every refusal and allocation, on the right pod, rate limited per pod and reason."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract import Contract
from deviceplugin.devices import UnitInventory
from deviceplugin.errors import PluginError
from deviceplugin.events import BURST, EVERY, TokenBuckets
from deviceplugin.kubelet import Holding
from deviceplugin.service import Service
from node.apiclient import ApiServerError
from tests.harness.plugin.fakes import FakeApiServer, FakeHoldings, plugin_settings
from tests.harness.pods import admitted, assigned, unit_pod


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("steps", "expected"), [
    # (seconds to wait before each take) -> (taken?, held back since the last one taken)
    ([0, 0, 0, 0, 0], [(True, 0), (True, 0), (True, 0), (False, 1), (False, 2)]),
    ([0, 0, 0, 0, EVERY], [(True, 0), (True, 0), (True, 0), (False, 1), (True, 1)]),
    ([0, 0, 0, EVERY / 2, EVERY / 2], [(True, 0), (True, 0), (True, 0), (False, 1), (True, 1)]),
    ([0, 10 * EVERY, 0, 0, 0], [(True, 0), (True, 0), (True, 0), (True, 0), (False, 1)]),  # never above the burst
])
def test_token_bucket(steps: list[float], expected: list[tuple[bool, int]]) -> None:
    clock = Clock()
    buckets = TokenBuckets(clock=clock)
    got = []
    for wait in steps:
        clock.now += wait
        got.append(buckets.take(("uid", "GpuShareNoRoom")))
    assert got == expected


def test_buckets_are_per_pod_and_reason_and_bounded() -> None:
    clock = Clock()
    buckets = TokenBuckets(size=100, clock=clock)
    for _ in range(BURST):
        assert buckets.take(("a", "GpuShareNoRoom"))[0]
    assert not buckets.take(("a", "GpuShareNoRoom"))[0]
    assert buckets.take(("a", "GpuShareMoved"))[0]
    assert buckets.take(("b", "GpuShareNoRoom"))[0]
    for n in range(10_000):
        buckets.take((f"pod-{n}", "GpuShareNoRoom"))
    assert len(buckets) == 100


@pytest.fixture
def node(tmp_path: Path, inventory: UnitInventory, signer: Ed25519PrivateKey,
         contract: Contract) -> Iterator[tuple[FakeApiServer, Service, Clock, list[str]]]:
    api = FakeApiServer()
    ids = [device for device, _ in inventory.devices()[:2]]
    clock = Clock()
    service = Service(plugin_settings(str(tmp_path)), inventory, api, FakeHoldings([Holding("team", "p", "main",
                      tuple(ids))]), signer.public_key(), clock=clock)
    api.settle = service.events.flush  # Events are posted from a queue: api.events waits for it
    yield api, service, clock, ids
    service.close()


def refuse(service: Service, ids: list[str]) -> PluginError:
    with pytest.raises(PluginError) as caught:
        service.prestart(ids)
    return caught.value


def test_a_hundred_refusals_in_a_minute_post_a_bounded_number_of_events(
    node: tuple[FakeApiServer, Service, Clock, list[str]], signer: Ed25519PrivateKey, contract: Contract,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api, service, clock, ids = node
    api.add(assigned(admitted(unit_pod("p", {"main": 2}), contract, signer), 7, 8))  # a GPU this node does not have
    caplog.set_level(logging.INFO)
    for _ in range(100):  # a container the kubelet keeps starting, 0.6 s apart
        assert refuse(service, ids).reason == "GpuShareBadAssignment"
        clock.now += 0.6
    assert len(api.events) == BURST
    for ref, kind, reason, message in api.events:
        assert (ref, kind, reason) == ("team/p", "Warning", "GpuShareBadAssignment")
        assert "pod team/p (container 'main') is assigned GPU index 7" in message  # what happened, to which pod
        assert message.endswith("check the scheduler extender's view of this node and recreate the pod")  # the fix
    refusals = [r for r in caplog.records if r.levelname == "WARNING" and "refused pod team/p" in r.getMessage()]
    assert len(refusals) == 100  # every one in the log, with the pod, the reason and the message
    assert all("(GpuShareBadAssignment)" in r.getMessage() and "recreate the pod" in r.getMessage()
               for r in refusals)
    metrics = service.metrics.registry
    assert metrics.get_sample_value("gpushare_deviceplugin_events_suppressed_total",
                                    {"reason": "GpuShareBadAssignment"}) == 100 - BURST
    assert metrics.get_sample_value("gpushare_deviceplugin_events_total",
                                    {"type": "Warning", "reason": "GpuShareBadAssignment"}) == BURST

    clock.now += EVERY  # a token is back: the next Event says how many were only logged
    refuse(service, ids)
    assert len(api.events) == BURST + 1
    assert api.events[-1][3].endswith(f"({100 - BURST} more like this since the previous Event were only logged.)")


def test_allocations_post_one_normal_event_each(
    node: tuple[FakeApiServer, Service, Clock, list[str]], signer: Ed25519PrivateKey, contract: Contract,
) -> None:
    api, service, _, ids = node
    api.add(assigned(admitted(unit_pod("p", {"main": 2}), contract, signer), 1, 8))
    for _ in range(3):
        service.prestart(ids)  # the first start records the allocation; restarts change nothing
    [(ref, kind, reason, message)] = api.events
    assert (ref, kind, reason) == ("team/p", "Normal", "GpuShareAllocated")
    assert message.startswith("Pod team/p runs on GPU 1 (")


def allocate_refused(service: Service, units: int) -> PluginError:
    with pytest.raises(PluginError) as caught:
        service.allocate([[device for device, _ in service.inventory.devices()[:units]]])
    return caught.value


@pytest.mark.parametrize(("pods", "reason", "fragment"), [
    ([("unplaced", True, None)], "GpuShareNotPlaced",
     "for pod team/unplaced on node node-a was refused, so the pod is not admitted: it has no ALIYUN_COM_GPU_MEM_IDX "
     "annotation, so no scheduler extender placed it on a GPU; configure the gpushare scheduler extender"),
    ([("raw", False, 0)], "GpuShareNoIntent",
     "for pod team/raw on node node-a was refused, so the pod is not admitted: pod team/raw has no "
     "gpushare.io/intent annotation: it was created before the gpushare webhook was installed"),
], ids=["not placed", "not stamped"])
def test_an_allocate_refusal_is_an_event_on_the_one_pod_that_waits(
    node: tuple[FakeApiServer, Service, Clock, list[str]], signer: Ed25519PrivateKey, contract: Contract,
    pods: list[tuple[str, bool, int | None]], reason: str, fragment: str,
) -> None:
    api, service, _, _ = node
    for name, stamp, index in pods:
        pod: dict[str, Any] = unit_pod(name, {"main": 2})
        pod = admitted(pod, contract, signer) if stamp else pod
        api.add(assigned(pod, index, 8) if index is not None else pod)
    api.add(unit_pod("running", {"main": 2}), phase="Running")  # admitted long ago: not the one
    error = allocate_refused(service, 2)
    assert (error.code, error.reason, error.attributed) == ("FAILED_PRECONDITION", reason, True)
    [(ref, kind, got, message)] = api.events
    assert (ref, kind, got) == (f"team/{pods[0][0]}", "Warning", reason)
    assert fragment in message
    assert service.metrics.registry.get_sample_value("gpushare_deviceplugin_unattributed_refusals_total",
                                                     {"method": "Allocate"}) == 0


def test_an_allocate_refusal_that_fits_several_pods_is_logged_and_counted(
    node: tuple[FakeApiServer, Service, Clock, list[str]], caplog: pytest.LogCaptureFixture,
) -> None:
    api, service, _, _ = node
    api.add(unit_pod("one", {"main": 2}))
    api.add(unit_pod("two", {"main": 2}))
    error = allocate_refused(service, 2)
    assert (error.reason, error.attributed) == ("GpuShareNoCandidate", False)
    assert "(2 pods on this node wait for 2 GiB, so the refused one is not known)" in error.message
    assert api.events == []
    assert service.metrics.registry.get_sample_value("gpushare_deviceplugin_unattributed_refusals_total",
                                                     {"method": "Allocate"}) == 1
    assert "Allocate refused devices (GpuShareNoCandidate) without knowing their pod, so no Event was posted" \
        in caplog.text


def test_devices_nobody_holds_are_refused_without_an_event(
    tmp_path: Path, inventory: UnitInventory, signer: Ed25519PrivateKey,
) -> None:
    api = FakeApiServer()
    service = Service(plugin_settings(str(tmp_path)), inventory, api, FakeHoldings([]), signer.public_key())
    with pytest.raises(PluginError) as caught:
        service.prestart([device for device, _ in inventory.devices()[:2]])
    assert caught.value.reason == "GpuShareUnknownDevices"
    assert api.events == []
    assert service.metrics.registry.get_sample_value("gpushare_deviceplugin_unattributed_refusals_total",
                                                     {"method": "PreStartContainer"}) == 1


class NoEvents(FakeApiServer):
    def create_event(self, pod: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        raise ApiServerError("could not post an Event on pod team: HTTP 403 Forbidden")


def test_an_event_the_api_server_refuses_is_logged_and_the_answer_stands(
    tmp_path: Path, inventory: UnitInventory, signer: Ed25519PrivateKey, contract: Contract,
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = NoEvents()
    ids = [device for device, _ in inventory.devices()[:2]]
    service = Service(plugin_settings(str(tmp_path)), inventory, api, FakeHoldings([Holding("team", "p", "main",
                      tuple(ids))]), signer.public_key())
    try:
        api.add(assigned(admitted(unit_pod("p", {"main": 2}), contract, signer), 7, 8))
        assert refuse(service, ids).reason == "GpuShareBadAssignment"
        assert service.events.flush()
    finally:
        service.close()
    assert "could not post Event GpuShareBadAssignment on pod team/p: could not post an Event" in caplog.text
    assert service.metrics.registry.get_sample_value("gpushare_deviceplugin_events_total",
                                                     {"type": "Warning", "reason": "GpuShareBadAssignment"}) is None


@pytest.mark.parametrize(("reason", "kind", "level"), [
    ("GpuSharePodDeleting", "Normal", logging.INFO),  # the normal course of a deletion: nothing to act on
    ("GpuShareNoRoom", "Warning", logging.WARNING),
    ("GpuShareBadAssignment", "Warning", logging.WARNING),
])
def test_a_refusal_of_a_pod_being_deleted_is_a_normal_event(
    node: tuple[FakeApiServer, Service, Clock, list[str]], caplog: pytest.LogCaptureFixture, reason: str, kind: str,
    level: int,
) -> None:
    api, service, _, _ = node
    pod = api.add(unit_pod("p", {"main": 2}))
    with caplog.at_level(logging.INFO, logger="deviceplugin"):
        service.recorder.refused("PreStartContainer", pod, reason, "why")
    assert [e[1:3] for e in api.events] == [(kind, reason)]
    assert [r.levelno for r in caplog.records if "refused pod team/p" in r.getMessage()] == [level]
