"""A bounded fuzz run of the device plugin's input surface: 0 crashes (no INTERNAL status, no unhandled exception),
0 hangs (every call bounded), and every answer either valid or a clear error status.

The kubelet's calls (Allocate, PreStartContainer, GetPreferredAllocation) go to the real servicer over its unix
socket, as messages and as mutated bytes; PodResources listings (as messages and as mutated bytes, over a socket)
and checkpoint contents go through the real readers in deviceplugin/kubelet.py and owners.py.
GPUSHARE_FUZZ_CASES (tests/harness/fuzzing.py) sets the cases per property.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import podresources_pb2 as pr
from deviceplugin.checkpoint import checkpoint_entries, visible_gpu
from deviceplugin.devices import UnitInventory
from deviceplugin.errors import PluginError, Refusal
from deviceplugin.holders import held
from deviceplugin.kubelet import Holding, KubeletHoldings, KubeletUnavailable, holdings_from_checkpoint
from deviceplugin.owners import Owners, find_owner, other_holders
from node.inventory import fake_gpus
from tests.harness.fuzzing import CASES, anything, mutated_bytes
from tests.harness.kubelet.devices import reference_answer
from tests.harness.kubelet.scripted import RESOURCE, TestKubelet
from tests.harness.plugin.fakes import NODE, FakeApiServer
from tests.harness.plugin.rig import Rig, make_rig

pytestmark = pytest.mark.timeout(300)
FUZZ = settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
CALL_TIMEOUT_S = 15.0  # a hang is an answer that does not come within this bound (the plugin's own is 5 s)
# A clear refusal: the plugin's own statuses, and gRPC's for a message over its 4 MiB limit.
CLEAR = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE,
         grpc.StatusCode.RESOURCE_EXHAUSTED}
# grpcio's answer to bytes that are not the method's message (grpc/_server.py); it comes before any plugin code runs.
UNDECODABLE = "Exception deserializing request!"
MESSAGES: dict[str, Any] = {"Allocate": pb.AllocateRequest, "PreStartContainer": pb.PreStartContainerRequest,
            "GetPreferredAllocation": pb.PreferredAllocationRequest}
IDS = [device for device, _ in UnitInventory(fake_gpus("2x8GiB", NODE, "GiB"), "GiB", 4096).devices()]  # the rig's

# Device IDs as a kubelet might name them: real ones, unknown, empty, very long, odd Unicode.
device_ids = st.one_of(
    st.sampled_from(IDS), st.sampled_from(IDS), st.text(max_size=24), st.just(""),
    st.integers(1_000, 200_000).map(lambda n: "x" * n), st.text(alphabet=st.characters(codec="utf-8"), max_size=8),
)
id_lists = st.one_of(
    st.lists(device_ids, max_size=8),
    st.lists(device_ids, min_size=1, max_size=4).map(lambda ids: ids * 3),  # duplicated
    st.integers(0, 16).map(lambda n: IDS[:n]),  # a whole count of real IDs
    st.integers(100, 20_000).map(lambda n: [IDS[i % len(IDS)] for i in range(n)]),  # huge counts
    st.integers(100, 5_000).map(lambda n: [f"unknown-{i}" for i in range(n)]),
)


@st.composite
def device_calls(draw: st.DrawFn) -> tuple[str, Any]:
    call = draw(st.sampled_from(["Allocate", "PreStartContainer", "GetPreferredAllocation"]))
    if call == "Allocate":
        requests = [pb.ContainerAllocateRequest(devices_ids=ids) for ids in draw(st.lists(id_lists, max_size=3))]
        return call, pb.AllocateRequest(container_requests=requests)
    if call == "PreStartContainer":
        return call, pb.PreStartContainerRequest(devices_ids=draw(id_lists))
    wanted = [pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=draw(id_lists), must_include_deviceIDs=draw(id_lists),
        allocation_size=draw(st.integers(-(2**31), 2**31 - 1) | st.integers(-2, 20)),
    ) for _ in range(draw(st.integers(0, 3)))]
    return call, pb.PreferredAllocationRequest(container_requests=wanted)


# The same calls as bytes on the wire: mutated, or with a string field that is not UTF-8.
INVALID_UTF8 = b"\x0a\x04\xff\xfe\xc3\x28"  # field 1 (the device IDs), 4 bytes that are no UTF-8
raw_calls = st.tuples(
    st.sampled_from(["Allocate", "PreStartContainer", "GetPreferredAllocation"]),
    st.one_of(mutated_bytes(device_calls().map(lambda c: bytes(c[1].SerializeToString()))),
              st.binary(max_size=64), st.just(INVALID_UTF8), st.just(b"\x0a\x06" + INVALID_UTF8)),
)


class FuzzKubelet(TestKubelet):
    """The test kubelet whose PodResources List answers what a property sets, when it sets something."""

    __test__ = False
    listed: pr.ListPodResourcesResponse | None = None

    def listing(self) -> pr.ListPodResourcesResponse:
        return self.listed if self.listed is not None else super().listing()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """The real plugin with a few admitted pods, so that some fuzzed calls name IDs a pod really holds."""
    for running in make_rig(tmp_path_factory.mktemp("f"), kubelet_class=FuzzKubelet, GPUSHARE_LOG_LEVEL="ERROR"):
        running.pod("one", {"main": 2}, index=0)
        running.pod("two", {"main": 1, "side": 1}, index=1, init={"load": 3})
        running.kubelet.admit("team", "one", [("main", 2)])
        running.kubelet.admit("team", "two", [("main", 1), ("side", 1)], init=[("load", 3)])
        yield running


class Tally:
    """What the calls answered: counts by status, and every crash, hang or invalid answer."""

    def __init__(self) -> None:
        self.statuses: dict[str, int] = {}
        self.problems: list[str] = []

    def call(self, name: str, send: Callable[[], Any], check: Callable[[Any], str | None],
             undecodable: bool = False) -> None:
        try:
            answer = send()
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()
            if undecodable and code == grpc.StatusCode.INTERNAL and exc.details() == UNDECODABLE:
                code_name = "UNDECODABLE"  # refused by gRPC's own decoding; the plugin never saw the call
                self.statuses[code_name] = self.statuses.get(code_name, 0) + 1
                return
            self.statuses[code.name] = self.statuses.get(code.name, 0) + 1
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                self.problems.append(f"{name} hung: {exc.details()}")
            elif code not in CLEAR or not exc.details():
                self.problems.append(f"{name} answered {code.name}: {exc.details()}")
            return
        self.statuses["OK"] = self.statuses.get("OK", 0) + 1
        problem = check(answer)
        if problem:
            self.problems.append(f"{name} answered {problem}")


def _valid(call: str, request: Any) -> Callable[[Any], str | None]:
    def check(answer: Any) -> str | None:
        if call == "Allocate":
            if len(answer.container_responses) != len(request.container_requests):
                return f"{len(answer.container_responses)} answers to {len(request.container_requests)} requests"
            named = [a for a in answer.container_responses if not (a.envs or a.cdi_devices)]
            return "an answer that gives the container nothing" if named else None
        if call == "GetPreferredAllocation":
            for wanted, got in zip(request.container_requests, answer.container_responses, strict=True):
                offered = set(wanted.available_deviceIDs) | set(wanted.must_include_deviceIDs)
                if not set(got.deviceIDs) <= offered:
                    return "IDs that were neither available nor required"
        return None
    return check


def test_grpc_requests_never_crash_or_hang_the_plugin(rig: Rig) -> None:
    stub = rig.kubelet.plugin()
    tally = Tally()

    @FUZZ
    @given(call=device_calls())
    def send(call: tuple[str, Any]) -> None:
        name, request = call
        tally.call(name, lambda: getattr(stub, name)(request, timeout=CALL_TIMEOUT_S), _valid(name, request))

    send()
    assert not tally.problems, tally.problems[:5]
    assert sum(tally.statuses.values()) >= CASES // 2
    assert tally.statuses.get("OK", 0) > 0 and tally.statuses.get("INVALID_ARGUMENT", 0) > 0, tally.statuses


def test_request_bytes_never_crash_or_hang_the_plugin(rig: Rig) -> None:
    endpoint = rig.kubelet.registered[-1].request.endpoint
    channel = grpc.insecure_channel("unix://" + str(Path(rig.kubelet.plugin_dir) / endpoint))
    tally = Tally()

    @FUZZ
    @given(call=raw_calls)
    def send(call: tuple[str, bytes]) -> None:
        name, body = call
        method = channel.unary_unary(f"/v1beta1.DevicePlugin/{name}", None, None)  # bytes in, bytes out
        tally.call(name, lambda: method(body, timeout=CALL_TIMEOUT_S), lambda answer: None, _undecodable(name, body))

    try:
        send()
    finally:
        channel.close()
    assert not tally.problems, tally.problems[:5]
    assert tally.statuses.get("UNDECODABLE", 0) > 0 and sum(tally.statuses.values()) >= CASES // 2, tally.statuses


def _undecodable(name: str, body: bytes) -> bool:
    try:
        MESSAGES[name].FromString(body)
    except DecodeError:
        return True
    return False


# -- PodResources listings and checkpoint contents ---------------------------------------------------------------

listing_ids = st.one_of(device_ids, st.sampled_from(IDS), st.sampled_from(IDS))
listings = st.builds(
    lambda pods: pr.ListPodResourcesResponse(pod_resources=pods),
    st.lists(st.builds(
        lambda name, namespace, containers: pr.PodResources(name=name, namespace=namespace, containers=containers),
        st.text(max_size=6), st.sampled_from(["team", "", "other"]),
        st.lists(st.builds(
            lambda name, devices: pr.ContainerResources(name=name, devices=devices),
            st.text(max_size=6),
            st.lists(st.builds(lambda resource, ids: pr.ContainerDevices(resource_name=resource, device_ids=ids),
                               st.sampled_from([RESOURCE, "nvidia.com/gpu", ""]), st.lists(listing_ids, max_size=4)),
                     max_size=2)),
            max_size=3)),
        max_size=4),
)
listing_bytes = st.one_of(listings.map(lambda r: bytes(r.SerializeToString())),
                          mutated_bytes(listings.map(lambda r: bytes(r.SerializeToString()))), st.binary(max_size=64))


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(strategy, strategy, anything)


entries = st.fixed_dictionaries({}, optional={
    "PodUID": _maybe(st.sampled_from(["uid-team-one", "uid-team-two", ""])),
    "ContainerName": _maybe(st.sampled_from(["main", "side", "load"])),
    "ResourceName": _maybe(st.just(RESOURCE)),
    "DeviceIDs": _maybe(st.one_of(  # by NUMA node (v1.34) or a plain list (older kubelets)
        st.dictionaries(st.sampled_from(["-1", "0"]), _maybe(st.lists(listing_ids, max_size=4)), max_size=2),
        st.lists(listing_ids, max_size=4))),
    # The stored answer: none, random bytes, or a reference-plugin answer naming a GPU, several or none.
    "AllocResp": _maybe(st.one_of(st.just(b""), st.binary(max_size=40), st.builds(
        reference_answer, st.sampled_from(["0", "1", "7", "no-gpu-has-8GiB-to-run", "0,1", "all", ""]),
        st.integers(1, 8)).map(lambda answer: answer.SerializeToString()), mutated_bytes(st.just(
            reference_answer("1", 2).SerializeToString()))).map(lambda raw: base64.b64encode(raw).decode())),
})
checkpoints = st.fixed_dictionaries({"Data": _maybe(st.fixed_dictionaries({}, optional={
    "PodDeviceEntries": _maybe(st.lists(_maybe(entries), max_size=4)), "RegisteredDevices": anything})),
    "Checksum": _maybe(st.integers(0, 2**32))})
checkpoint_bytes = st.one_of(
    checkpoints.map(lambda doc: json.dumps(doc).encode()),
    mutated_bytes(checkpoints.map(lambda doc: json.dumps(doc).encode())),
    anything.map(lambda doc: json.dumps(doc).encode()),
    st.sampled_from([b"", b"[" * 5_000 + b"]" * 5_000, b'{"Data": {"PodDeviceEntries": 7}}', b"\xff\xfe{}",
                     json.dumps({"Data": {"PodDeviceEntries": [{"ResourceName": RESOURCE, "DeviceIDs": 1}]}}).encode(),
                     b"9" * 5_000]),
)


class ListingServer:
    """A PodResources server that answers List with whatever bytes are set (a kubelet gone wrong)."""

    def __init__(self, socket: str) -> None:
        self.answer = b""
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(lambda request, context: self.answer)})
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((handler,))
        self.server.add_insecure_port("unix://" + socket)
        self.server.start()


@pytest.fixture(scope="module")
def listing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ListingServer, Path]]:
    tmp = tmp_path_factory.mktemp("pr")
    server = ListingServer(str(tmp / "pr.sock"))
    try:
        yield server, tmp
    finally:
        server.server.stop(grace=None).wait()


def test_listings_and_checkpoints_are_read_or_refused(listing_server: tuple[ListingServer, Path]) -> None:
    server, tmp = listing_server
    reader = KubeletHoldings(str(tmp / "pr.sock"), str(tmp / "checkpoint"), RESOURCE, timeout=CALL_TIMEOUT_S)
    api = FakeApiServer()
    owners = Owners(api, NODE)
    problems: list[str] = []
    read = [0, 0]

    @FUZZ
    @given(listing=listing_bytes, checkpoint=checkpoint_bytes, wanted=id_lists.filter(lambda ids: len(ids) < 100))
    def feed(listing: bytes, checkpoint: bytes, wanted: list[str]) -> None:
        server.answer = listing
        (tmp / "checkpoint").write_bytes(checkpoint)
        for name, source in (("PodResources or checkpoint", reader.holdings), ("checkpoint", reader.from_checkpoint)):
            try:
                holdings = source()
                read[name == "checkpoint"] += 1
            except KubeletUnavailable as exc:
                if not str(exc):
                    problems.append(f"the {name} was refused without a message")
                continue
            except Exception as exc:  # a crash: every kubelet answer is read or refused with KubeletUnavailable
                problems.append(f"reading the {name} raised {exc!r}")
                continue
            _resolve(holdings, wanted, problems)
        try:
            owners.owner(wanted, held(reader, wanted, None), None)
        except PluginError as exc:
            if not exc.message or exc.code not in {c.name for c in CLEAR}:
                problems.append(f"the owner's search refused with {exc.code}: {exc.message!r}")
        except Exception as exc:
            problems.append(f"the owner's search raised {exc!r}")

    try:
        feed()
    finally:
        reader.close()
    assert not problems, problems[:5]
    assert read[0] > 0 and read[1] > 0


def _resolve(holdings: list[Holding], wanted: list[str], problems: list[str]) -> None:
    try:
        owner = find_owner(holdings, wanted)
        other_holders(holdings, wanted, owner)
    except Refusal as refusal:
        if not refusal.message:
            problems.append("find_owner refused without a message")
    except Exception as exc:
        problems.append(f"find_owner raised {exc!r}")


@FUZZ
@given(checkpoint=checkpoint_bytes)
def test_checkpoint_text_is_parsed_or_refused_with_a_value_error(checkpoint: bytes) -> None:
    text = checkpoint.decode("utf-8", "replace")
    try:
        holdings = holdings_from_checkpoint(text, RESOURCE)
    except ValueError as exc:
        assert str(exc)
        return
    assert all(isinstance(h, Holding) and h.device_ids for h in holdings)
    gpus = {g.index: g for g in fake_gpus("2x8GiB", NODE, "GiB")}
    for entry in checkpoint_entries(text, RESOURCE):
        assert entry.visible is None or isinstance(entry.visible, str)
        gpu = visible_gpu(entry.visible or "", gpus)
        assert gpu is None or entry.visible in (str(gpu.index), gpu.uuid)


def test_listings_through_the_real_plugin(rig: Rig) -> None:
    """PreStartContainer over the socket while the kubelet's List answers random listings and its checkpoint holds
    random contents: each call is answered, valid or with a clear status."""
    stub = rig.kubelet.plugin()
    kubelet = rig.kubelet
    assert isinstance(kubelet, FuzzKubelet)
    tally = Tally()

    @settings(FUZZ, max_examples=max(CASES // 3, 20))
    # Known IDs, so the plugin goes past its inventory check and reads the listing and the checkpoint.
    @given(listing=listings, checkpoint=checkpoint_bytes, wanted=st.lists(st.sampled_from(IDS), min_size=1, max_size=3))
    def feed(listing: pr.ListPodResourcesResponse, checkpoint: bytes, wanted: list[str]) -> None:
        kubelet.listed = listing
        Path(kubelet.checkpoint_path).write_bytes(checkpoint)
        request = pb.PreStartContainerRequest(devices_ids=wanted)
        tally.call("PreStartContainer", lambda: stub.PreStartContainer(request, timeout=CALL_TIMEOUT_S), lambda a: None)

    try:
        feed()
    finally:
        kubelet.listed = None
        kubelet.write_checkpoint()
    assert not tally.problems, tally.problems[:5]
