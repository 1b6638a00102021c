"""The DRA services over real gRPC on unix sockets, called with stubs built from the generated code."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from contract.keys import DRA_DRIVER
from dra.api import dra_pb2 as pb
from dra.api import dra_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from dra.checkpoint import Checkpoint
from dra.driver import Driver
from dra.servicer import (
    DEADLINE_MARGIN,
    DRAPluginServicer,
    RegistrationServicer,
    serve_plugin,
    serve_registration,
)
from node.cdi import CdiStore
from node.inventory import Inventory
from tests.harness.dra.claims import GPUS, NODE, REF, UID, claim, result
from tests.harness.dra.fakes import FakeClaims

# A read that hangs is cut at this bound; the test only checks the message, never the time taken.
TIMEOUT = 0.5


@dataclass
class Served:
    stub: dra_pb2_grpc.DRAPluginStub
    source: FakeClaims
    cdi_dir: Path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    source = FakeClaims(claim(result("gpu-0", "4Gi", request="a"), result("gpu-1", "2Gi", request="b")))
    driver = Driver(NODE, Inventory(GPUS, "GiB"), "GiB", source=source,
                    checkpoint=Checkpoint(str(tmp_path / "state")), cdi=CdiStore(str(tmp_path / "cdi")),
                    fake_gpu_dir=str(tmp_path / "fake"))
    servicer = DRAPluginServicer(driver, timeout=TIMEOUT)
    server = serve_plugin(servicer, str(tmp_path / "dra.sock"))
    channel = grpc.insecure_channel(f"unix://{tmp_path / 'dra.sock'}")
    try:
        yield Served(dra_pb2_grpc.DRAPluginStub(channel), source, tmp_path / "cdi")  # type: ignore[no-untyped-call]
    finally:
        if source.hang is not None:
            source.failure = RuntimeError("the test is over")
            source.hang.set()  # let a hung worker finish, writing nothing
        channel.close()
        server.stop(None).wait()
        servicer.close()


def _claim(uid: str = UID, name: str = REF.name) -> pb.Claim:
    return pb.Claim(namespace=REF.namespace, uid=uid, name=name)


def _prepare(served: Served, *claims: pb.Claim) -> pb.NodePrepareResourcesResponse:
    response: pb.NodePrepareResourcesResponse = served.stub.NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=list(claims)), timeout=30
    )
    return response


def _unprepare(served: Served, *claims: pb.Claim) -> pb.NodeUnprepareResourcesResponse:
    response: pb.NodeUnprepareResourcesResponse = served.stub.NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=list(claims)), timeout=30
    )
    return response


EXPECTED = [
    pb.Device(request_names=[request], pool_name=NODE, device_name=f"gpu-{n}",
              cdi_device_ids=[f"gpushare.io/gpu=dra-{UID}-{n}"])
    for n, request in enumerate(["a", "b"])
]


def test_prepare_repeat_unprepare(served: Served) -> None:
    first = _prepare(served, _claim())
    assert first.claims[UID].error == ""
    assert list(first.claims[UID].devices) == EXPECTED
    assert _prepare(served, _claim()) == first
    assert served.source.reads == 1
    assert [p.name for p in served.cdi_dir.iterdir()] == [f"gpushare-dra-{UID}.json"]
    unprepared = _unprepare(served, _claim())
    assert dict(unprepared.claims) == {UID: pb.NodeUnprepareResourceResponse()}
    assert list(served.cdi_dir.iterdir()) == []


NEVER_PREPARED = "00000000-0000-4000-8000-000000000001"
STALE = "00000000-0000-4000-8000-000000000002"


def test_unknown_unprepare_succeeds(served: Served) -> None:
    assert dict(_unprepare(served, _claim(NEVER_PREPARED)).claims) == {
        NEVER_PREPARED: pb.NodeUnprepareResourceResponse()
    }


@pytest.mark.parametrize(("uid", "namespace", "name", "fragment"), [
    ("../../etc/x", "team", "gpu-claim", "UID '../../etc/x' is not a UID the API server generates"),
    ("0B5E2A4C-1D9E-4F2A-8C3B-6A7D9E0F1A2B", "team", "gpu-claim", "is not a UID"),
    (UID, "../team", "gpu-claim", "namespace '../team' is not a DNS-1123 label"),
    (UID, "team", "a/b", "name 'a/b' is not a DNS-1123 subdomain"),
])
def test_a_claim_the_api_could_not_store_is_refused_before_any_path(
    served: Served, uid: str, namespace: str, name: str, fragment: str,
) -> None:
    claim = pb.Claim(namespace=namespace, uid=uid, name=name)
    for call in (_prepare, _unprepare):
        error = call(served, claim).claims[uid].error
        assert fragment in error and "will not touch" in error, error
    assert not served.cdi_dir.exists() or list(served.cdi_dir.iterdir()) == []


def test_errors_are_per_claim(served: Served) -> None:
    response = _prepare(served, _claim(), _claim(STALE))
    assert response.claims[UID].error == ""
    assert "now has UID" in response.claims[STALE].error
    assert list(response.claims[STALE].devices) == []


@pytest.mark.parametrize("failure", [RuntimeError("HTTP 403 Forbidden"), KeyError("no such claim")])
def test_failed_read_is_a_claim_error(served: Served, failure: Exception) -> None:
    served.source.failure = failure
    error = _prepare(served, _claim()).claims[UID].error
    assert f"ResourceClaim {REF.namespace}/{REF.name} (UID {UID}) could not be read" in error


def test_hung_read_is_cut_at_the_deadline(served: Served) -> None:
    served.source.hang = threading.Event()
    error = _prepare(served, _claim()).claims[UID].error
    assert error == (f"the gpushare DRA driver could not prepare ResourceClaim {REF} within {TIMEOUT:g} s; check "
                     "its API server access in its log (the kubelet retries)")


def test_a_call_is_answered_within_its_own_deadline(tmp_path: Path) -> None:
    """The kubelet's deadline, not only the driver's timeout, bounds a call: the answer comes before it passes."""
    source = FakeClaims(claim(result("gpu-0", "4Gi", request="a")))
    source.hang = threading.Event()
    driver = Driver(NODE, Inventory(GPUS, "GiB"), "GiB", source=source,
                    checkpoint=Checkpoint(str(tmp_path / "state")), cdi=CdiStore(str(tmp_path / "cdi")),
                    fake_gpu_dir=str(tmp_path / "fake"))
    servicer = DRAPluginServicer(driver, timeout=30)
    server = serve_plugin(servicer, str(tmp_path / "dra.sock"), handlers=1)
    try:
        with grpc.insecure_channel(f"unix://{tmp_path / 'dra.sock'}") as channel:
            stub = dra_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
            request = pb.NodePrepareResourcesRequest(claims=[_claim()])
            answer = stub.NodePrepareResources(request, timeout=1 + DEADLINE_MARGIN)  # no DEADLINE_EXCEEDED
            assert "could not prepare ResourceClaim" in answer.claims[UID].error, answer
            # One call in flight holds the only handler: the next is refused at once, not queued past its deadline.
            held = threading.Thread(target=lambda: stub.NodePrepareResources(request, timeout=5))
            held.start()
            time.sleep(0.3)
            with pytest.raises(grpc.RpcError) as refused:
                stub.NodePrepareResources(request, timeout=5)
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            source.failure = RuntimeError("the test is over")
            source.hang.set()
            held.join(timeout=10)
    finally:
        server.stop(None).wait()
        servicer.close()


def test_unexpected_failure_is_a_claim_error_not_a_status(tmp_path: Path) -> None:
    class Broken:
        def prepare(self, ref: object) -> list[object]:
            raise AssertionError("a bug")

        def unprepare(self, ref: object) -> None:
            raise AssertionError("a bug")

    servicer = DRAPluginServicer(Broken(), timeout=5)  # type: ignore[arg-type]
    server = serve_plugin(servicer, str(tmp_path / "dra.sock"))
    try:
        with grpc.insecure_channel(f"unix://{tmp_path / 'dra.sock'}") as channel:
            stub = dra_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
            response = stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=[_claim()]), timeout=30)
    finally:
        server.stop(None).wait()
        servicer.close()
    assert response.claims[UID].error.startswith("the gpushare DRA driver failed unexpectedly to unprepare")


def test_registration(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    servicer = RegistrationServicer("/var/lib/kubelet/plugins/gpushare.io/dra.sock")
    server = serve_registration(servicer, str(tmp_path / "reg.sock"))
    try:
        with grpc.insecure_channel(f"unix://{tmp_path / 'reg.sock'}") as channel:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=30)
            stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=30)
            registered = servicer.registered.is_set()
            stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=False, error="no DRA handler"), timeout=30
            )
    finally:
        server.stop(None).wait()
    assert info == pluginregistration_pb2.PluginInfo(
        type="DRAPlugin", name=DRA_DRIVER, endpoint="/var/lib/kubelet/plugins/gpushare.io/dra.sock",
        supported_versions=["v1.DRAPlugin"],
    )
    assert registered and not servicer.registered.is_set()
    assert "refused to register DRA driver gpushare.io (no DRA handler)" in caplog.text


def test_method_paths_are_the_kubelets() -> None:
    assert pb.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    registration = pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert registration.full_name == "pluginregistration.Registration"
