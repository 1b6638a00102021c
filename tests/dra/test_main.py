"""The DRA driver's program: start-up refusals, both sockets served to a real gRPC client, the slice kept published,
and a stop that removes only its own sockets."""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from contract.keys import DRA_DRIVER
from dra.api import dra_pb2 as pb
from dra.api import dra_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from dra.checkpoint import FILE_NAME
from dra.keeper import SliceKeeper
from dra.main import DraPlugin, main, run
from node.apiclient import ApiServerError
from node.inventory import Inventory
from tests.harness.dra.claims import GPUS, NODE, REF, UID, claim, result
from tests.harness.dra.fakes import FakeDraApi
from tests.harness.dra.plugin import dra_settings

pytestmark = pytest.mark.timeout(60)

DEVICES = ["gpu-0", "gpu-1"]
DEVICE = DEVICES[0]
POOL = f"the ResourceSlices of node {NODE}"
DRIVER = str(Path(sys.executable).parent / "gpushare-dra-plugin")


@pytest.fixture
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dra")


@pytest.fixture
def api() -> FakeDraApi:
    return FakeDraApi(claim(result("gpu-0", "4Gi", request="gpu")))


@pytest.fixture
def started(tmp: Path, api: FakeDraApi) -> Iterator[DraPlugin]:
    plugin = DraPlugin(dra_settings(tmp, GPUSHARE_METRICS_BIND="127.0.0.1:0"), kube=api)
    try:
        plugin.start()
        yield plugin
    finally:
        plugin.stop()


def test_serves_registration_and_prepare_over_the_sockets(started: DraPlugin, api: FakeDraApi) -> None:
    s = started.settings
    with grpc.insecure_channel(f"unix://{s.registration_path}") as channel:
        stub = pluginregistration_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=30)
        registry = started.metrics_registry()
        for registered in (True, False):
            stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(plugin_registered=registered),
                                          timeout=30)
            assert registry.get_sample_value("gpushare_dra_registered") == int(registered)
    assert info == pluginregistration_pb2.PluginInfo(
        type="DRAPlugin", name=DRA_DRIVER, endpoint=s.socket_path, supported_versions=["v1.DRAPlugin"]
    )
    with grpc.insecure_channel(f"unix://{s.socket_path}") as channel:
        dra = dra_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
        claims = [pb.Claim(namespace=REF.namespace, name=REF.name, uid=UID)]
        prepared = dra.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims), timeout=30)
        unprepared = dra.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=claims), timeout=30)
    assert prepared.claims[UID].error == ""
    assert list(prepared.claims[UID].devices) == [
        pb.Device(request_names=["gpu"], pool_name=NODE, device_name="gpu-0",
                  cdi_device_ids=[f"gpushare.io/gpu=dra-{UID}-0"])
    ]
    assert dict(unprepared.claims) == {UID: pb.NodeUnprepareResourceResponse()}
    assert api.reads == 1
    assert (Path(s.state_dir) / FILE_NAME).exists()


def test_start_publishes_the_slice_and_counts_it(started: DraPlugin, api: FakeDraApi) -> None:
    assert sorted(api.by_device()) == DEVICES
    published = [api.by_device()[name]["spec"] for name in DEVICES]
    assert [(p["nodeName"], [d["name"] for d in p["devices"]]) for p in published] == [(NODE, ["gpu-0"]),
                                                                                      (NODE, ["gpu-1"])]
    assert published[0]["devices"][0]["capacity"]["memory"]["value"] == "16Gi"
    registry = started.metrics_registry()
    assert registry.get_sample_value("gpushare_dra_slice_writes_total") == 1
    assert registry.get_sample_value("gpushare_dra_prepared_claims") == 0
    assert registry.get_sample_value("gpushare_dra_slices_published") == 1
    assert registry.get_sample_value("gpushare_dra_registered") == 0  # the kubelet has not said so yet
    assert [s.labels["program"] for f in registry.collect() for s in f.samples if s.name == "gpushare_build_info"] \
        == ["dra-plugin"]
    assert started.metrics_server is not None and started.metrics_server.address[1] > 0


def test_keeper_recreates_a_deleted_slice_and_logs_once_per_change(
    started: DraPlugin, api: FakeDraApi, caplog: pytest.LogCaptureFixture
) -> None:
    keeper = started.keeper
    assert keeper is not None
    caplog.set_level(logging.INFO, logger="dra.keeper")
    assert not keeper.step()  # current: one read, no write, nothing to say (start said it)
    api.slices.clear()  # what the kubelet does at its start, and 30 s after the driver disconnects
    assert keeper.step() and keeper.step() is False
    assert {api.by_device()[n]["spec"]["pool"]["generation"] for n in DEVICES} == {1}
    api.by_device()[DEVICE]["spec"]["devices"][0]["attributes"] = {}  # someone else's edit
    assert keeper.step()
    assert {api.by_device()[n]["spec"]["pool"]["generation"] for n in DEVICES} == {2}
    assert api.by_device()[DEVICE]["spec"]["devices"][0]["attributes"]["index"] == {"int": 0}
    published = started.metrics_registry()
    assert published.get_sample_value("gpushare_dra_slices_published") == 1
    api.slice_failure = ApiServerError(f"could not list {POOL}: Connection refused")
    assert not keeper.step() and not keeper.step()
    assert published.get_sample_value("gpushare_dra_slices_published") == 0
    api.slice_failure = None
    assert not keeper.step() and not keeper.step()
    assert published.get_sample_value("gpushare_dra_slices_published") == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "dra.keeper"]
    assert lines == [
        f"The ResourceSlices of node {NODE} were missing (the kubelet deletes a driver's slices when it starts and "
        "when the driver disconnects); published 2, deleted 0.",
        f"The ResourceSlices of node {NODE} differed from this node's GPUs; published 2, deleted 0.",
        f"Could not publish {POOL}: could not list {POOL}: Connection refused; the scheduler allocates no claim to "
        "a GPU whose slice is missing. Trying again every 3600 s (GPUSHARE_DRA_RESYNC_SECONDS); check the driver's "
        "API server access.",
        f"The ResourceSlices of node {NODE} are published and current.",
    ]
    assert (keeper.writes, keeper.failures, api.slice_writes) == (3, 2, 6)


def test_keeper_thread_steps_until_stopped_and_outlives_a_bug(caplog: pytest.LogCaptureFixture) -> None:
    stepped = threading.Event()

    class Api(FakeDraApi):
        calls = 0

        def list_slices(self, node: str) -> list[dict[str, Any]]:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("a bug")
            stepped.set()
            return super().list_slices(node)

    api = Api()
    keeper = SliceKeeper(api, NODE, Inventory(GPUS, "GiB"), "GiB", interval=0.001)
    keeper.start()
    try:
        assert stepped.wait(timeout=30)
    finally:
        keeper.stop()
    assert "Keeping the ResourceSlices of node node-a failed unexpectedly" in caplog.text
    assert DEVICE in api.by_device()


def test_stop_removes_its_sockets_but_not_another_process(tmp: Path, api: FakeDraApi) -> None:
    plugin = DraPlugin(dra_settings(tmp), kube=api)
    try:
        plugin.start()
        s = plugin.settings
        assert os.path.exists(s.socket_path) and os.path.exists(s.registration_path)
        os.unlink(s.registration_path)  # a newer driver process took the registration path over
        Path(s.registration_path).write_bytes(b"")
    finally:
        plugin.stop()
    assert not os.path.exists(s.socket_path)
    assert os.path.exists(s.registration_path)


def test_two_pods_of_one_node_serve_side_by_side_and_each_removes_only_its_own_sockets(
        tmp: Path, api: FakeDraApi) -> None:
    """A rolling update (maxSurge 1): the new pod starts while the old one serves, on the same node directories."""
    old = DraPlugin(dra_settings(tmp, GPUSHARE_POD_UID="0ld00000-0000-4000-8000-000000000001"), kube=api)
    new = DraPlugin(dra_settings(tmp, GPUSHARE_POD_UID="0ew00000-0000-4000-8000-000000000002"), kube=api)
    paths = [(p.settings.socket_path, p.settings.registration_path) for p in (old, new)]
    try:
        old.start()
        new.start()
        for socket_path, registration_path in paths:
            with grpc.insecure_channel(f"unix://{registration_path}") as channel:
                stub = pluginregistration_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                assert stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=30).endpoint == socket_path
    finally:
        old.stop()
    assert not any(os.path.exists(path) for path in paths[0])
    assert all(os.path.exists(path) for path in paths[1]), "the old pod leaves the new one's sockets"
    new.stop()
    assert not any(os.path.exists(path) for path in paths[1])


def test_run_starts_waits_and_stops(tmp: Path, api: FakeDraApi) -> None:
    settings = dra_settings(tmp)
    stop = threading.Event()
    stop.set()  # run() returns as soon as it has started
    try:
        assert run(settings, stop, DraPlugin(settings, kube=api)) == 0
    finally:
        gc.unfreeze()  # run() freezes what start-up made (common/heap.py)
    assert DEVICE in api.by_device()
    assert not os.path.exists(settings.socket_path) and not os.path.exists(settings.registration_path)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("corrupt checkpoint", "The DRA driver cannot start: the DRA driver's checkpoint {state}/"
                               f"{FILE_NAME} is corrupt: Expecting value: line 1 column 1 (char 0); delete the file"),
        ("no GPUs", "The DRA driver cannot start: node node-a has no GPU, so its ResourceSlice would offer nothing; "
                    "run the DRA driver only on GPU nodes."),
        ("bad fake GPUs", "The DRA driver cannot start: GPUSHARE_FAKE_GPUS='lots' is not COUNTxMEMORY"),
        ("no credentials", "The DRA driver cannot start: GPUSHARE_KUBECONFIG=/nonexistent/kubeconfig gives no API "
                           "server credentials"),
        ("state dir", "The DRA driver cannot start: GPUSHARE_DRA_STATE_DIR=/dev/null/state cannot be created"),
    ],
)
def test_start_refusals_exit_2_in_one_line_and_serve_nothing(
    tmp: Path, api: FakeDraApi, caplog: pytest.LogCaptureFixture, case: str, message: str
) -> None:
    env = {"bad fake GPUs": {"GPUSHARE_FAKE_GPUS": "lots"}, "state dir": {"GPUSHARE_DRA_STATE_DIR": "/dev/null/state"},
           "no credentials": {"GPUSHARE_KUBECONFIG": "/nonexistent/kubeconfig"}}.get(case, {})
    settings = dra_settings(tmp, **env)
    if case == "corrupt checkpoint":
        os.makedirs(settings.state_dir)
        Path(settings.state_dir, FILE_NAME).write_text("not json")
    plugin = DraPlugin(settings, kube=None if case == "no credentials" else api,
                       inventory=Inventory((), "GiB") if case == "no GPUs" else None)
    os.makedirs(settings.plugin_dir, exist_ok=True)
    Path(settings.socket_path).write_bytes(b"")  # another driver's socket: a failed start leaves it alone
    assert run(settings, threading.Event(), plugin) == 2
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert message.format(state=settings.state_dir) in line and line.endswith(".")
    assert os.path.exists(settings.socket_path) and not os.path.exists(settings.registration_path)
    assert api.slices == {}


def test_a_bad_setting_is_one_line_on_stderr(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUSHARE_DRA_REGISTRY_DIR", str(tmp / ("r" * 100)))
    assert main(["--node-name", NODE]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("The DRA driver cannot start: GPUSHARE_DRA_REGISTRY_DIR=") and "bytes long" in line


def test_the_process_serves_until_sigterm_then_removes_its_sockets(tmp: Path) -> None:
    """The installed command, with no API server (its kubeconfig names a port nothing listens on): it serves anyway,
    says once that the slice could not be published, and stops cleanly on SIGTERM."""
    (tmp / "kubeconfig").write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    settings = dra_settings(tmp)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
    env.update({"GPUSHARE_DRA_PLUGIN_DIR": settings.plugin_dir, "GPUSHARE_DRA_REGISTRY_DIR": settings.registry_dir,
                "GPUSHARE_DRA_STATE_DIR": settings.state_dir, "GPUSHARE_CDI_DIR": settings.node.cdi_dir,
                "GPUSHARE_METRICS_BIND": "", "GPUSHARE_DRA_TIMEOUT_SECONDS": "5"})
    process = subprocess.Popen(
        [DRIVER, "--node-name", NODE, "--fake-gpus", "1x4GiB", "--kubeconfig", str(tmp / "kubeconfig")],
        env=env, stderr=subprocess.PIPE, text=True,
    )
    lines: list[str] = []
    try:
        assert process.stderr is not None
        while not any("gpushare DRA driver serving" in line for line in lines):
            line = process.stderr.readline()
            assert line, f"the driver exited: {lines}"
            lines.append(line)
        assert os.path.exists(settings.socket_path) and os.path.exists(settings.registration_path)
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=30)
        lines += rest.splitlines()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = "\n".join(lines)
    assert process.returncode == 0, text
    assert sum("Could not publish the ResourceSlices of node" in line for line in lines) == 1
    assert "Received SIGTERM" in text and "Traceback" not in text
    assert not os.path.exists(settings.socket_path) and not os.path.exists(settings.registration_path)


def test_a_health_change_wakes_the_keeper_before_its_interval() -> None:
    """The XID watcher's callback: the keeper steps now, not an interval (an hour here) later, and the unhealthy
    GPU's slice is gone."""
    inventory = Inventory(GPUS, "GiB")
    api = FakeDraApi()
    keeper = SliceKeeper(api, NODE, inventory, "GiB", interval=3600)
    keeper.step()
    assert sorted(api.by_device()) == DEVICES
    keeper.start()
    try:
        inventory.set_health(1, False)
        keeper.wake()
        pause = threading.Event()  # never set: a bounded wait for the keeper's thread
        for _ in range(300):
            if sorted(api.by_device()) == [DEVICE]:
                break
            pause.wait(0.1)
    finally:
        keeper.stop()
    assert sorted(api.by_device()) == [DEVICE]
    assert api.by_device()[DEVICE]["spec"]["pool"]["resourceSliceCount"] == 1
