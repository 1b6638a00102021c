"""A stand-in `pynvml` module: the calls the node's NVML inventory and XID watcher make, answered from lists."""

from __future__ import annotations

import queue
import types
from dataclasses import dataclass

GiB = 2**30


class NVMLError(Exception):
    pass


class NVMLErrorTimeout(NVMLError):
    pass


class NVMLErrorNotSupported(NVMLError):
    pass


@dataclass
class Memory:
    total: int


XID, DBE = 8, 2


@dataclass
class Event:
    device: int
    eventData: int  # pynvml's field names
    eventType: int = XID


def fake_pynvml(
    memories: list[int], events: queue.Queue[Event | NVMLError], fail_init: bool = False,
    no_minor: frozenset[int] = frozenset(), refuse_events: frozenset[int] = frozenset(),
) -> types.ModuleType:
    """The calls the inventory and the watcher make; `events` holds what the next waits return or raise."""
    module = types.ModuleType("pynvml")

    def init() -> None:
        if fail_init:
            raise NVMLError("Driver Not Loaded")

    def wait(event_set: object, timeout_ms: int) -> Event:
        try:
            item = events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NVMLErrorTimeout("Timeout") from None
        if isinstance(item, NVMLError):
            raise item
        return item

    def minor(h: int) -> int:
        if h in no_minor:
            raise NVMLErrorNotSupported("Not Supported")
        return h + 4

    def register(h: int, kinds: int, event_set: object) -> None:
        if h in refuse_events:
            raise NVMLError("Unknown Error")

    functions: dict[str, object] = {
        "NVMLError": NVMLError,
        "NVMLError_Timeout": NVMLErrorTimeout,
        "NVMLError_NotSupported": NVMLErrorNotSupported,
        "nvmlEventTypeXidCriticalError": XID,
        "nvmlEventTypeDoubleBitEccError": DBE,
        "nvmlEventTypeSingleBitEccError": 1,
        "nvmlInit": init,
        "nvmlSystemGetNVMLVersion": lambda: b"12.550.127.05",
        "nvmlSystemGetDriverVersion": lambda: "550.127.05",
        "nvmlDeviceGetName": lambda h: "NVIDIA H200",
        "nvmlDeviceGetCount": lambda: len(memories),
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetMemoryInfo": lambda h: Memory(memories[h]),
        "nvmlDeviceGetUUID": lambda h: f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd".encode(),
        "nvmlDeviceGetMinorNumber": minor,
        "nvmlEventSetCreate": object,
        "nvmlDeviceGetSupportedEventTypes": lambda h: 0x1F,
        "nvmlDeviceRegisterEvents": register,
        "nvmlEventSetWait_v2": wait,
        "nvmlEventSetFree": lambda s: None,
    }
    for name, value in functions.items():
        setattr(module, name, value)
    return module
