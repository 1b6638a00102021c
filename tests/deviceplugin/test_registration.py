"""Registration across plugin instances and kubelet versions: a socket of its own for every serve, stale sockets
removed, and a new registration when the kubelet drops the endpoint while it keeps running; against the test
kubelet as v1.34 and v1.37 keep their plugin clients (tests/harness/kubelet/wire.py RegistrationServer)."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from deviceplugin.api import deviceplugin_pb2 as pb
from deviceplugin.api import deviceplugin_pb2_grpc
from deviceplugin.devices import UnitInventory, slot_of
from deviceplugin.kubelet import RegistrationError, register
from deviceplugin.main import Plugin
from deviceplugin.server import OPTIONS
from deviceplugin.settings import PluginSettings
from deviceplugin.sockets import clear_stale
from node.inventory import fake_gpus
from tests.harness.kubelet.scripted import TestKubelet
from tests.harness.plugin.fakes import NODE, FakeApiServer, plugin_settings
from tests.harness.pods import admitted, assigned, unit_pod

pytestmark = pytest.mark.timeout(60)

RESOURCE = "aliyun.com/gpu-mem"


@dataclass
class Node:
    """The test kubelet, an API server, and the plugin instances a test starts on one node."""

    kubelet: TestKubelet
    settings: PluginSettings
    api: FakeApiServer
    signer: Ed25519PrivateKey
    minor: int  # the kubelet release whose registration the test kubelet models
    plugins: list[Plugin] = field(default_factory=list)

    def start_plugin(self, **changes: Any) -> Plugin:
        inventory = UnitInventory(fake_gpus("2x8GiB", NODE, "GiB"), "GiB", 4096)
        plugin = Plugin(dataclasses.replace(self.settings, **changes), api=self.api, inventory=inventory,
                        public_key=self.signer.public_key())
        self.plugins.append(plugin)
        plugin.start()
        return plugin

    def stop_plugin(self, plugin: Plugin) -> None:
        self.plugins.remove(plugin)
        plugin.stop()

    def admit_one(self, name: str) -> None:
        """A pod of 2 units through the kubelet's current endpoint: Allocate and PreStartContainer answer."""
        self.api.add(assigned(admitted(unit_pod(name, {"main": 2}), self.settings.contract, self.signer), 0, 8))
        (done,) = self.kubelet.admit("team", name, [("main", 2)])
        assert done.response.envs["GPUSHARE_SLOT"] == slot_of(done.device_ids)
        self.kubelet.start_container("team", name, "main")

    def wait_endpoint(self, path: str | None, timeout: float = 20) -> None:
        """Until the kubelet calls the endpoint at `path` and has its device list."""
        assert path is not None

        def calling() -> bool:
            conn = self.kubelet.registration.conn
            return conn is not None and conn.endpoint == os.path.basename(path) and conn.lists > 0

        with self.kubelet.changed:
            assert self.kubelet.changed.wait_for(calling, timeout), (
                f"the kubelet does not call {path}: {self.kubelet.registered}")


@pytest.fixture(params=[34, 37], ids=["kubelet-v1.34", "kubelet-v1.37"])
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("r")  # short: a unix socket path holds 107 bytes
    # A poll of an hour: what registers again must be the directory watch or the end of the ListAndWatch stream.
    settings = dataclasses.replace(plugin_settings(str(tmp)), watch_interval_seconds=3600.0)
    api = FakeApiServer()
    kubelet = TestKubelet(settings.device_plugin_dir, settings.pod_resources_socket,
                          lambda namespace, name: str(api.pod(namespace, name)["metadata"]["uid"]), request.param)
    kubelet.start()
    node = Node(kubelet, settings, api, Ed25519PrivateKey.generate(), minor=request.param)
    try:
        yield node
    finally:
        for plugin in reversed(node.plugins):
            plugin.stop()
        kubelet.stop()


def refusals(node: Node) -> list[str]:
    return [r.refused for r in node.kubelet.registered if r.refused]


# -- the test kubelet's two registration models --------------------------------------------------------------------


class Minimal(deviceplugin_pb2_grpc.DevicePluginServicer):
    """A device plugin with one device that keeps its ListAndWatch stream open, on a socket path a test fixes."""

    def __init__(self, path: str) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        deviceplugin_pb2_grpc.add_DevicePluginServicer_to_server(self, self.server)  # type: ignore[no-untyped-call]
        self.server.add_insecure_port("unix://" + path)
        self.server.start()
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()
        self.server.stop(0).wait(5)

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return OPTIONS

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID="d0", health="Healthy")])
        while context.is_active() and not self.stopped.wait(0.05):
            pass


@pytest.mark.parametrize(("minor", "refused"), [(34, False), (37, True)])
def test_a_fixed_socket_path_registered_twice(tmp_path_factory: pytest.TempPathFactory, minor: int,
                                              refused: bool) -> None:
    """Why every serve has a name of its own. v1.37 refuses a path it holds a connection to and, having dropped
    that connection's client, never notices it end: the path stays refused after its server is gone and a new one
    serves there (manager.go PluginConnected, handler.go connectClient and runClient, v1.37.2). v1.34 takes both."""
    plugin_dir = str(tmp_path_factory.mktemp("f"))
    kubelet = TestKubelet(plugin_dir, os.path.join(plugin_dir, "pr.sock"), minor=minor)
    kubelet.start()
    path = os.path.join(plugin_dir, "fixed.sock")
    servers = [Minimal(path)]
    outcomes = []
    try:
        register(os.path.join(plugin_dir, "kubelet.sock"), "fixed.sock", RESOURCE, OPTIONS, 5)
        for replace in (False, True):
            if replace:  # the old server goes (its connection ends), a new one serves at the same path
                servers[0].stop()
                servers.append(Minimal(path))
            try:
                register(os.path.join(plugin_dir, "kubelet.sock"), "fixed.sock", RESOURCE, OPTIONS, 5)
                outcomes.append("")
            except RegistrationError as exc:
                outcomes.append(str(exc))
    finally:
        for server in servers:
            server.stop()
        kubelet.stop()
    if refused:
        expected = f"refused the registration: UNKNOWN device plugin already connected: {path}"
        assert all(expected in outcome for outcome in outcomes), outcomes
    else:
        assert outcomes == ["", ""]


@pytest.mark.parametrize(("minor", "calls"), [(34, None), (37, "b.sock")])
def test_an_older_connection_ending_after_a_newer_registration(tmp_path_factory: pytest.TempPathFactory, minor: int,
                                                               calls: str | None) -> None:
    """Why a newer instance registers again once the older has gone: v1.34 then stops the newer endpoint (runClient
    finds the resource's current client; PluginDisconnected marks the devices unhealthy), v1.37 keeps calling it
    (PluginDisconnected removes the older endpoint and promotes the newer)."""
    plugin_dir = str(tmp_path_factory.mktemp("o"))
    kubelet = TestKubelet(plugin_dir, os.path.join(plugin_dir, "pr.sock"), minor=minor)
    kubelet.start()
    older, newer = Minimal(os.path.join(plugin_dir, "a.sock")), Minimal(os.path.join(plugin_dir, "b.sock"))
    try:
        for name in ("a.sock", "b.sock"):
            register(os.path.join(plugin_dir, "kubelet.sock"), name, RESOURCE, OPTIONS, 5)
        older.stop()
        registration = kubelet.registration

        def settled() -> bool:  # v1.34: the current endpoint stopped; v1.37: the older endpoint removed
            if calls is None:
                return registration.conn is None
            return os.path.join(plugin_dir, "a.sock") not in registration.endpoints

        with kubelet.changed:
            assert kubelet.changed.wait_for(settled, 20)
            assert (registration.conn.endpoint if registration.conn else None) == calls
    finally:
        older.stop()
        newer.stop()
        kubelet.stop()


# -- the plugin ------------------------------------------------------------------------------------------------------


def test_a_second_instance_registers_while_the_first_still_serves(node: Node) -> None:
    first = node.start_plugin()
    second = node.start_plugin()
    registered = node.kubelet.wait_registrations(2)
    assert not refusals(node)
    assert [r.request.endpoint for r in registered] == [os.path.basename(p.socket_path or "") for p in (first,
                                                                                                         second)]
    assert first.socket_path != second.socket_path
    assert first.socket_path is not None and os.path.exists(first.socket_path)  # left to the first instance
    node.wait_endpoint(second.socket_path)
    node.admit_one("p")


def test_the_newer_instance_is_called_after_the_older_has_gone(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    """v1.34-v1.36 drop the newer endpoint when the older connection ends (its runClient disconnects the resource's
    current client): the newer instance's ListAndWatch stream ends, and it serves and registers again. v1.37 keeps
    the newer endpoint and promotes it: nothing is registered again, which would stop it for a moment."""
    caplog.set_level(logging.INFO)
    first = node.start_plugin()
    second = node.start_plugin()
    node.kubelet.wait_registrations(2)
    serving = second.socket_path
    node.stop_plugin(first)
    if node.minor < 37:
        assert len(node.kubelet.wait_registrations(3)) == 3
        assert second.socket_path != serving and "ended this plugin's ListAndWatch stream" in caplog.text
    else:
        time.sleep(1.5)  # what v1.34 took to drop and register again
        assert len(node.kubelet.registered) == 2 and second.socket_path == serving
        assert "ended this plugin's ListAndWatch stream" not in caplog.text
    assert not refusals(node)
    node.wait_endpoint(second.socket_path)
    node.admit_one("p")


def listening(path: str) -> socket.socket:
    """A socket that accepts connections at `path`, as an older instance's does (also when it is frozen)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(8)
    return sock


def dead(path: str) -> None:
    """A socket file nobody listens on, as a killed instance leaves it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(path)


def test_a_socket_that_accepts_is_left_to_its_instance_and_the_plugin_registers_beside_it(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    older = listening(os.path.join(node.settings.device_plugin_dir, node.settings.socket_name("0123abcd")))
    try:
        plugin = node.start_plugin()
        node.kubelet.wait_registrations(1)
        assert "left the socket" in caplog.text and "0123abcd" in caplog.text
        assert os.path.exists(os.path.join(node.settings.device_plugin_dir, node.settings.socket_name("0123abcd")))
    finally:
        older.close()  # that process is killed: the kubelet never held it, so nothing changes for ours
    time.sleep(1.0)
    assert len(node.kubelet.registered) == 1 and not refusals(node)
    node.wait_endpoint(plugin.socket_path)


def test_registers_again_under_a_new_name_when_its_socket_goes_while_the_kubelet_holds_it(node: Node) -> None:
    plugin = node.start_plugin()
    (first,) = node.kubelet.wait_registrations(1)
    assert plugin.socket_path is not None
    os.unlink(plugin.socket_path)  # the kubelet still holds the connection
    registered = node.kubelet.wait_registrations(2)
    assert registered[1].request.endpoint != first.request.endpoint and not refusals(node)
    node.wait_endpoint(plugin.socket_path)
    node.admit_one("p")


def test_registers_again_after_a_kubelet_restart(node: Node) -> None:
    plugin = node.start_plugin()
    (first,) = node.kubelet.wait_registrations(1)
    node.kubelet.restart()  # every socket in the directory is removed, then a new kubelet.sock
    registered = node.kubelet.wait_registrations(2)
    assert registered[-1].request.endpoint != first.request.endpoint and not refusals(node)
    assert plugin.socket_path is not None and os.path.exists(plugin.socket_path)
    node.wait_endpoint(plugin.socket_path)
    node.admit_one("p")


def test_a_stopped_kubelet_is_not_registered_with_and_its_successor_is_at_once(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """The plugin's stream ends when the kubelet stops too, and kubelet.sock stays behind until the next kubelet
    replaces it. Registering there would wait out the call's timeout and hold back the registration with the next
    kubelet, which meanwhile admits pods without the plugin's devices (seen on the real kubelet v1.35.4 and
    v1.36.3: a running pod rejected, 'no healthy devices present')."""
    caplog.set_level(logging.INFO)
    plugin = node.start_plugin()
    node.kubelet.wait_registrations(1)
    node.wait_endpoint(plugin.socket_path)
    kubelet_socket = os.path.join(node.settings.device_plugin_dir, "kubelet.sock")
    node.kubelet.registration.stop()  # the kubelet process ends: our stream with it
    if not os.path.exists(kubelet_socket):
        dead(kubelet_socket)  # the file it leaves behind, nobody listening
    time.sleep(1.5)  # the stream's end seen, and what the plugin does about it done
    node.kubelet.restart()  # the next kubelet: the directory cleaned, a new kubelet.sock
    started = time.monotonic()
    node.kubelet.wait_registrations(2)
    assert time.monotonic() - started < 3  # not after a registration's timeout (the settings' 5 s)
    assert "did not answer within" not in caplog.text and not refusals(node)

    def called() -> bool:  # the plugin's socket of now: it may serve once more if it met the directory mid-clean
        conn = node.kubelet.registration.conn
        return (conn is not None and plugin.socket_path is not None
                and conn.endpoint == os.path.basename(plugin.socket_path) and conn.lists > 0)

    with node.kubelet.changed:
        assert node.kubelet.changed.wait_for(called, 20), node.kubelet.registered
    node.admit_one("p")


def test_serves_and_registers_on_a_socket_path_of_107_bytes(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The longest path the settings accept (a directory of 65 bytes and the longest name) is one gRPC serves on."""
    base = str(tmp_path_factory.mktemp("l"))
    plugin_dir = base + "/" + "d" * (65 - len(base) - 1)
    settings = dataclasses.replace(plugin_settings(base, GPUSHARE_DEVICE_PLUGIN_DIR=plugin_dir),
                                   watch_interval_seconds=3600.0)
    kubelet = TestKubelet(plugin_dir, settings.pod_resources_socket, minor=37)
    kubelet.start()
    node = Node(kubelet, settings, FakeApiServer(), Ed25519PrivateKey.generate(), minor=37)
    try:
        plugin = node.start_plugin()
        assert plugin.socket_path is not None and len(os.fsencode(plugin.socket_path)) == 107
        node.wait_endpoint(plugin.socket_path)
    finally:
        for started in node.plugins:
            started.stop()
        kubelet.stop()


def test_stale_sockets_are_removed_and_live_ones_kept(tmp_path_factory: pytest.TempPathFactory,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    tmp = tmp_path_factory.mktemp("s")
    settings = plugin_settings(str(tmp))
    directory = Path(settings.device_plugin_dir)
    directory.mkdir()
    ours_dead = directory / settings.socket_name("0123abcd")
    legacy_dead = directory / "gpushare-aliyun-com-gpu-mem.sock"  # the fixed name of earlier versions
    kept = [directory / name for name in (
        "kubelet.sock", "nvidia-gpu.sock", "gpushare-aliyun-com-gpu-mem-x-0123abcd.sock",  # other plugins' sockets
    )]
    for path in (ours_dead, legacy_dead, *kept):
        dead(str(path))
    not_a_socket = directory / settings.socket_name("89abcdef")
    not_a_socket.write_text("")
    live = listening(str(directory / settings.socket_name("456789ab")))
    try:
        assert clear_stale(settings) == [str(directory / settings.socket_name("456789ab"))]
    finally:
        live.close()
    assert not ours_dead.exists() and not legacy_dead.exists()
    assert all(path.exists() for path in kept) and not_a_socket.exists()
    lines = [r.getMessage() for r in caplog.records if r.name == "deviceplugin.sockets"]
    assert len(lines) == 4, lines  # one per socket of ours: two removed, one live, one not a socket
    assert sum(line.startswith("removed the stale socket") for line in lines) == 2
