"""The NVML inventory and the XID watcher against a stand-in `pynvml` module (no GPU needed)."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterator

import pytest

from node.inventory import Inventory, InventoryError, load_inventory
from node.xid import XidWatcher
from tests.harness.fakepynvml import DBE, Event, GiB, NVMLError, fake_pynvml

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[queue.Queue[Event | NVMLError]]:
    pending: queue.Queue[Event | NVMLError] = queue.Queue()
    # An H200 reports 143771 MiB: 140 whole GiB.
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([143771 * 2**20, 80 * GiB], pending))
    yield pending


def test_nvml_inventory(events: queue.Queue[Event | NVMLError]) -> None:
    inventory = load_inventory("", "node-a", "GiB")
    assert inventory.real
    assert [(g.index, g.memory_units, g.minor) for g in inventory.gpus] == [(0, 140, 4), (1, 80, 5)]
    assert inventory.gpus[0].uuid == "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
    assert sum(g.memory_units for g in inventory.gpus) == 220


def test_nvml_failure_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([GiB], queue.Queue(), fail_init=True))
    with pytest.raises(InventoryError, match="set GPUSHARE_FAKE_GPUS"):
        load_inventory("", "node-a", "GiB")


def test_no_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], queue.Queue()))
    with pytest.raises(InventoryError, match="found no GPU"):
        load_inventory("", "node-a", "GiB")


def test_critical_xid_marks_the_gpu_unhealthy(events: queue.Queue[Event | NVMLError]) -> None:
    inventory: Inventory = load_inventory("", "node-a", "GiB")
    seen: list[tuple[int, int]] = []
    done = threading.Event()

    def on_event(gpu: object, xid: int) -> None:
        seen.append((getattr(gpu, "index", -1), xid))
        done.set()

    watcher = XidWatcher(inventory, on_event)
    watcher.start()
    try:
        events.put(Event(device=0, eventData=13))  # an application error: the GPU is fine
        events.put(Event(device=0, eventData=0, eventType=DBE))  # registered as the NVIDIA plugin does; no change
        events.put(Event(device=1, eventData=79))  # fallen off the bus
        assert done.wait(10)
    finally:
        watcher.stop()
    assert seen == [(1, 79)]
    assert inventory.healthy(0) and not inventory.healthy(1)


def test_a_gpu_without_device_node_has_no_minor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([GiB, GiB], queue.Queue(), no_minor=frozenset({1})))
    inventory = load_inventory("", "node-a", "GiB")
    assert [g.minor for g in inventory.gpus] == [4, None]


def watch_until(inventory: Inventory, unhealthy: set[int]) -> None:
    watcher = XidWatcher(inventory, retry_seconds=0.05)
    watcher.start()
    try:
        version = 0
        while {g.index for g in inventory.gpus if not inventory.healthy(g.index)} != unhealthy:
            changed = inventory.wait_change(version, 10)
            assert changed != version, f"health never became {unhealthy}"
            version = changed
    finally:
        watcher.stop()


@pytest.mark.parametrize(
    ("refuse_events", "failure", "unhealthy"),
    [
        (frozenset({1}), None, {1}),  # NVML refuses to watch GPU 1: it cannot be trusted
        (frozenset(), NVMLError("GPU is lost"), {0, 1}),  # a failed wait: every GPU, as the NVIDIA plugin does
    ],
)
def test_what_nvml_cannot_watch_is_unhealthy(monkeypatch: pytest.MonkeyPatch, refuse_events: frozenset[int],
                                              failure: NVMLError | None, unhealthy: set[int]) -> None:
    pending: queue.Queue[Event | NVMLError] = queue.Queue()
    if failure is not None:
        pending.put(failure)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([GiB, GiB], pending, refuse_events=refuse_events))
    inventory = load_inventory("", "node-a", "GiB")
    watch_until(inventory, unhealthy)
