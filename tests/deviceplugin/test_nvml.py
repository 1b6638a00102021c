"""The NVML inventory and the XID watcher against a stand-in `pynvml` module (no GPU needed)."""

from __future__ import annotations

import queue
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from deviceplugin.inventory import Inventory, InventoryError, XidWatcher, load_inventory

pytestmark = pytest.mark.timeout(30)
GiB = 2**30


class NVMLError(Exception):
    pass


class NVMLErrorTimeout(NVMLError):
    pass


@dataclass
class Memory:
    total: int


@dataclass
class Event:
    device: int
    eventData: int  # pynvml's field name


def fake_pynvml(memories: list[int], events: queue.Queue[Event], fail_init: bool = False) -> types.ModuleType:
    module = types.ModuleType("pynvml")

    def init() -> None:
        if fail_init:
            raise NVMLError("Driver Not Loaded")

    def wait(event_set: object, timeout_ms: int) -> Event:
        try:
            return events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLErrorTimeout("Timeout") from None

    functions: dict[str, object] = {
        "NVMLError": NVMLError,
        "NVMLError_Timeout": NVMLErrorTimeout,
        "nvmlEventTypeXidCriticalError": 8,
        "nvmlInit": init,
        "nvmlDeviceGetCount": lambda: len(memories),
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetMemoryInfo": lambda h: Memory(memories[h]),
        "nvmlDeviceGetUUID": lambda h: f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd".encode(),
        "nvmlDeviceGetMinorNumber": lambda h: h + 4,
        "nvmlEventSetCreate": object,
        "nvmlDeviceRegisterEvents": lambda h, kinds, s: None,
        "nvmlEventSetWait_v2": wait,
        "nvmlEventSetFree": lambda s: None,
    }
    for name, value in functions.items():
        setattr(module, name, value)
    return module


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[queue.Queue[Event]]:
    pending: queue.Queue[Event] = queue.Queue()
    # An H200 reports 143771 MiB: 140 whole GiB.
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([143771 * 2**20, 80 * GiB], pending))
    yield pending


def test_nvml_inventory(events: queue.Queue[Event]) -> None:
    inventory = load_inventory("", "node-a", "GiB", 4096)
    assert inventory.real
    assert [(g.index, g.memory_units, g.minor) for g in inventory.gpus] == [(0, 140, 4), (1, 80, 5)]
    assert inventory.gpus[0].uuid == "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
    assert len(inventory.devices()) == 220
    assert all(len(d) <= 63 for d, _ in inventory.devices())


def test_nvml_failure_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([GiB], queue.Queue(), fail_init=True))
    with pytest.raises(InventoryError, match="set GPUSHARE_FAKE_GPUS"):
        load_inventory("", "node-a", "GiB", 4096)


def test_no_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([], queue.Queue()))
    with pytest.raises(InventoryError, match="found no GPU"):
        load_inventory("", "node-a", "GiB", 4096)


def test_critical_xid_marks_the_gpu_unhealthy(events: queue.Queue[Event]) -> None:
    inventory: Inventory = load_inventory("", "node-a", "GiB", 4096)
    seen: list[tuple[int, int]] = []
    done = threading.Event()

    def on_event(gpu: object, xid: int) -> None:
        seen.append((getattr(gpu, "index", -1), xid))
        done.set()

    watcher = XidWatcher(inventory, on_event)
    watcher.start()
    try:
        events.put(Event(device=0, eventData=13))  # an application error: the GPU is fine
        events.put(Event(device=1, eventData=79))  # fallen off the bus
        assert done.wait(10)
    finally:
        watcher.stop()
    assert seen == [(1, 79)]
    assert inventory.healthy(0) and not inventory.healthy(1)
