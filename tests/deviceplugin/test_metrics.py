"""The plugin's /metrics, scraped over HTTP while the test kubelet drives known calls over the real gRPC socket."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from common.settings import SettingsError
from deviceplugin.main import Plugin
from deviceplugin.metrics import CALLS, OUTCOMES, REASONS
from node.metrics import MetricsServer
from tests.harness.plugin.fakes import FakeApiServer, plugin_settings
from tests.harness.plugin.rig import Rig, make_rig
from tests.harness.pods import assigned

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(rig: Rig) -> Samples:
    assert rig.plugin.metrics_server is not None
    host, port = rig.plugin.metrics_server.address
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        res = conn.getresponse()
        assert res.status == 200
        text = res.read().decode()
    finally:
        conn.close()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(s: Samples, name: str, **labels: str) -> float | None:
    return s.get((name, tuple(sorted(labels.items()))))


def calls(s: Samples) -> dict[tuple[str, str], float]:
    return {(m, o): v for m in CALLS for o in OUTCOMES
            if (v := value(s, "gpushare_deviceplugin_calls_total", method=m, outcome=o))}


def refusals(s: Samples) -> dict[tuple[str, str], float]:
    return {(m, r): v for m in CALLS for r in REASONS
            if (v := value(s, "gpushare_deviceplugin_refusals_total", method=m, reason=r))}


def gpus(s: Samples, name: str) -> dict[str, float | None]:
    """The metric per GPU index, each series labelled with its GPU's UUID."""
    out = {}
    for (metric, labels), v in s.items():
        if metric == name:
            tags = dict(labels)
            out[tags["gpu"]] = v
            assert tags["uuid"].startswith("GPU-")
    return {index: out.get(index) for index in ("0", "1")}


def settles(rig: Rig, what: str, check: Callable[[Samples], bool]) -> Samples:
    deadline = time.monotonic() + 20
    while not check(s := scrape(rig)):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return s


@pytest.mark.timeout(60)
def test_every_counter_moves_exactly_as_driven(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    start = settles(rig, "the registration was not counted",
                    lambda s: value(s, "gpushare_deviceplugin_registrations_total", outcome="ok") == 1)
    assert calls(start) == {} and refusals(start) == {}
    assert gpus(start, "gpushare_deviceplugin_gpu_capacity_units") == {"0": 8, "1": 8}
    assert gpus(start, "gpushare_deviceplugin_gpu_units_promised") == {"0": 0, "1": 0}

    # Pod a: 3 units on GPU 0, admitted and started (and restarted twice). Pod b: 2 units on GPU 0, admitted only.
    rig.pod("a", {"main": 3}, index=0)
    rig.pod("b", {"main": 2}, index=0)
    rig.kubelet.admit("team", "a", [("main", 3)])
    rig.kubelet.admit("team", "b", [("main", 2)])
    for _ in range(3):
        rig.kubelet.start_container("team", "a", "main")
    # Pod c has no IDX (bound past the extender): Allocate is refused with an Event on it.
    rig.pod("c", {"main": 1}, index=None)
    with pytest.raises(grpc.RpcError):
        rig.kubelet.admit("team", "c", [("main", 1)])
    # Pod d names a GPU the extender thinks has 16 GiB: admitted, then its start is refused twice.
    rig.api.add(assigned(rig.pod("d", {"main": 1}, index=None), 1, 16))
    rig.kubelet.admit("team", "d", [("main", 1)])
    for _ in range(2):
        with pytest.raises(grpc.RpcError):
            rig.kubelet.start_container("team", "d", "main")
    # Devices this node never had, and a start while the API server is unreachable.
    with pytest.raises(grpc.RpcError):
        rig.kubelet.admit("team", "a", [("other", 1)], pick=["no-gpu-has-8MiB-to-run"])
    assert rig.plugin.service.events.flush()  # the Events of the refusals go out before the API server fails
    rig.api.fail = True
    with pytest.raises(grpc.RpcError):
        rig.kubelet.start_container("team", "a", "main")
    while_down = scrape(rig)  # the per-GPU units need the pods: left out while the API server is down
    rig.api.fail = False

    s = scrape(rig)
    assert calls(s) == {
        ("Allocate", "ok"): 3, ("Allocate", "failed_precondition"): 1, ("Allocate", "invalid_argument"): 1,
        ("PreStartContainer", "ok"): 3, ("PreStartContainer", "failed_precondition"): 2,
        ("PreStartContainer", "unavailable"): 1,
    }
    assert refusals(s) == {
        ("Allocate", "GpuShareNotPlaced"): 1, ("Allocate", "GpuShareUnknownDevices"): 1,
        ("PreStartContainer", "GpuShareBadAssignment"): 2, ("PreStartContainer", "GpuShareUnavailable"): 1,
    }
    for method, count in (("Allocate", 5), ("PreStartContainer", 6)):
        assert value(s, "gpushare_deviceplugin_call_duration_seconds_count", method=method) == count
        assert value(s, "gpushare_deviceplugin_call_duration_seconds_bucket", method=method, le="+Inf") == count
    assert value(s, "gpushare_deviceplugin_unattributed_refusals_total", method="Allocate") == 1  # unknown devices
    assert value(s, "gpushare_deviceplugin_unattributed_refusals_total", method="PreStartContainer") == 0
    assert value(s, "gpushare_deviceplugin_events_total", type="Normal", reason="GpuShareAllocated") == 1
    assert value(s, "gpushare_deviceplugin_events_total", type="Warning", reason="GpuShareNotPlaced") == 1
    assert value(s, "gpushare_deviceplugin_events_total", type="Warning", reason="GpuShareBadAssignment") == 2
    assert [e[:3] for e in rig.api.events] == [
        ("team/a", "Normal", "GpuShareAllocated"), ("team/c", "Warning", "GpuShareNotPlaced"),
        ("team/d", "Warning", "GpuShareBadAssignment"), ("team/d", "Warning", "GpuShareBadAssignment"),
    ]
    # The unreachable API server: the failed read of the start, and the scrape's own read of the pods.
    assert value(s, "gpushare_deviceplugin_api_errors_total", operation="get_pod") == 1
    assert value(s, "gpushare_deviceplugin_api_errors_total", operation="list_pods") == 1
    assert gpus(while_down, "gpushare_deviceplugin_gpu_units_promised") == {"0": None, "1": None}
    assert gpus(while_down, "gpushare_deviceplugin_gpu_capacity_units") == {"0": 8, "1": 8}

    # Promised: a (3) and b (2) on GPU 0, d (1) on GPU 1 where the extender put it; allocated: a only.
    assert gpus(s, "gpushare_deviceplugin_gpu_units_promised") == {"0": 5, "1": 1}
    assert gpus(s, "gpushare_deviceplugin_gpu_units_allocated") == {"0": 3, "1": 0}
    assert gpus(s, "gpushare_deviceplugin_gpu_healthy") == {"0": 1, "1": 1}

    rig.inventory.set_health(1, False)
    rig.kubelet.restart()
    after = settles(rig, "the registration after the kubelet restart was not counted",
                    lambda s: value(s, "gpushare_deviceplugin_registrations_total", outcome="ok") == 2)
    assert value(after, "gpushare_deviceplugin_registrations_total", outcome="failed") == 0
    assert gpus(after, "gpushare_deviceplugin_gpu_healthy") == {"0": 1, "1": 0}


def test_metrics_can_be_turned_off(tmp_path_factory: pytest.TempPathFactory) -> None:
    rigs = make_rig(tmp_path_factory.mktemp("off"), GPUSHARE_METRICS_BIND="")
    rig = next(rigs)
    try:
        assert rig.plugin.metrics_server is None
    finally:
        rigs.close()


def test_a_metrics_port_in_use_stops_the_start_with_the_variable_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = plugin_settings(str(tmp_path), GPUSHARE_METRICS_BIND=f"127.0.0.1:{port}")
        plugin = Plugin(settings, api=FakeApiServer(), public_key=Ed25519PrivateKey.generate().public_key())
        with pytest.raises(SettingsError, match=f"GPUSHARE_METRICS_BIND=127.0.0.1:{port} cannot be listened on"):
            plugin.start()
        plugin.stop()


def test_a_failed_registration_is_counted(tmp_path: Path) -> None:
    settings = plugin_settings(str(tmp_path))  # no kubelet: its socket does not exist
    plugin = Plugin(settings, api=FakeApiServer(), public_key=Ed25519PrivateKey.generate().public_key())
    plugin.start()
    try:
        registry = plugin.metrics.registry
        assert registry.get_sample_value("gpushare_deviceplugin_registrations_total", {"outcome": "failed"}) == 1
        assert registry.get_sample_value("gpushare_deviceplugin_registrations_total", {"outcome": "ok"}) == 0
    finally:
        plugin.stop()


def test_idle_connections_hold_no_thread_and_scrapes_go_on() -> None:
    registry = CollectorRegistry()
    Counter("gpushare_test_things", "Things.", registry=registry).inc()
    server = MetricsServer(("127.0.0.1", 0), registry)
    try:
        host, port = server.address

        def things() -> bytes:
            conn = http.client.HTTPConnection(host, port, timeout=10)
            try:
                conn.request("GET", "/metrics")
                return conn.getresponse().read()
            finally:
                conn.close()

        assert b"gpushare_test_things_total 1.0" in things()
        threads = threading.active_count()
        idle = [socket.create_connection((host, port), timeout=10) for _ in range(200)]
        try:
            assert b"gpushare_test_things_total 1.0" in things()
            assert threading.active_count() <= threads + 1  # at most the collector pool's second thread
        finally:
            for sock in idle:
                sock.close()
    finally:
        server.stop()


def test_the_registered_gauge_follows_the_last_registration(tmp_path: Path) -> None:
    settings = plugin_settings(str(tmp_path))  # no kubelet: its socket does not exist
    plugin = Plugin(settings, api=FakeApiServer(), public_key=Ed25519PrivateKey.generate().public_key())
    registry = plugin.metrics.registry
    assert registry.get_sample_value("gpushare_deviceplugin_registered") == 0
    plugin.start()
    try:
        assert registry.get_sample_value("gpushare_deviceplugin_registered") == 0
    finally:
        plugin.stop()


def test_a_registered_plugin_says_so_and_its_build(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    s = settles(rig, "the registration was not reported", lambda s: value(s, "gpushare_deviceplugin_registered") == 1)
    [(labels, one)] = [(dict(k[1]), v) for k, v in s.items() if k[0] == "gpushare_build_info"]
    assert one == 1 and labels["program"] == "device-plugin" and labels["version"] != "unknown"
