"""The XID watcher: marks a GPU Unhealthy when NVML reports a critical error for it, as NVIDIA's plugin does."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from node.inventory import Gpu, Inventory, nvml_text

log = logging.getLogger(__name__)

# XIDs caused by the application (not the GPU), which the NVIDIA device plugin also ignores.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# What the NVIDIA device plugin registers for health (internal/rm/health.go); only XID critical errors change it.
_HEALTH_EVENTS = ("nvmlEventTypeXidCriticalError", "nvmlEventTypeDoubleBitEccError", "nvmlEventTypeSingleBitEccError")
_WAIT_MS = 1000  # how long one event-set wait lasts: also how soon stop() is noticed


class XidWatcher:
    """Marks a GPU Unhealthy when NVML reports a critical XID for it, as the NVIDIA device plugin does
    (internal/rm/health.go): application XIDs are ignored; a GPU whose events cannot be registered, and every GPU
    after a failed wait, are marked Unhealthy. Health comes back only with a plugin restart, as there."""

    def __init__(self, inventory: Inventory, on_event: Callable[[Gpu, int], None] | None = None,
                 retry_seconds: float = 5.0) -> None:
        self.inventory = inventory
        self.on_event = on_event
        self.retry_seconds = retry_seconds
        self._stop = threading.Event()
        self._watching = threading.Event()  # the event set exists: an XID from now on is seen
        self._thread = threading.Thread(target=self._run, name="xid-watcher", daemon=True)

    def start(self, ready_seconds: float = 5.0) -> None:
        """Start watching; return once NVML's event set is registered (an NVML event set sees only what happens
        after it exists), or after `ready_seconds` at most."""
        self._thread.start()
        self._watching.wait(ready_seconds)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _all_unhealthy(self, why: str) -> None:
        log.error("%s; marking every GPU's units Unhealthy", why)
        for gpu in self.inventory.gpus:
            self.inventory.set_health(gpu.index, False)

    def _run(self) -> None:
        try:
            self._watch()
        finally:
            self._watching.set()  # also when NVML refused: start() must not wait for nothing

    def _watch(self) -> None:
        import pynvml

        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self._all_unhealthy(f"NVML could not create an event set for XID errors ({exc})")
            return
        try:
            self._register(pynvml, event_set)
            self._watching.set()
            by_uuid = {g.uuid: g for g in self.inventory.gpus}
            while not self._stop.is_set():
                self._wait_once(pynvml, event_set, by_uuid)
        finally:
            try:
                pynvml.nvmlEventSetFree(event_set)
            except pynvml.NVMLError as exc:
                log.info("freeing the NVML event set failed: %s", exc)

    def _register(self, pynvml: Any, event_set: Any) -> None:
        wanted = 0
        for name in _HEALTH_EVENTS:
            wanted |= int(getattr(pynvml, name))
        for gpu in self.inventory.gpus:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
                supported = int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
                pynvml.nvmlDeviceRegisterEvents(handle, wanted & supported, event_set)
            except pynvml.NVMLError_NotSupported:
                # The NVIDIA plugin marks such a GPU Unhealthy for good; a GPU too old for events still works.
                log.warning("GPU %s (%s) cannot report XID events; its health is not watched", gpu.index, gpu.uuid)
            except pynvml.NVMLError as exc:
                log.error("GPU %s (%s): NVML refused to watch its XID events (%s); marking its units Unhealthy",
                          gpu.index, gpu.uuid, exc)
                self.inventory.set_health(gpu.index, False)

    def _wait_once(self, pynvml: Any, event_set: Any, by_uuid: dict[str, Gpu]) -> None:
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, _WAIT_MS)
        except pynvml.NVMLError_Timeout:
            return
        except pynvml.NVMLError as exc:
            self._all_unhealthy(f"waiting for NVML events failed ({exc})")
            self._stop.wait(self.retry_seconds)
            return
        xid = int(data.eventData)
        if int(data.eventType) != int(pynvml.nvmlEventTypeXidCriticalError) or xid in APPLICATION_XIDS:
            log.info("NVML event of type %#x (data %s) does not change GPU health", int(data.eventType), xid)
            return
        try:
            uuid_text = nvml_text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError as exc:
            self._all_unhealthy(f"XID {xid} came from a GPU whose UUID NVML cannot tell ({exc})")
            return
        hit = by_uuid.get(uuid_text)
        if hit is None:
            log.info("XID %s on GPU %s, which this plugin does not serve; ignored", xid, uuid_text)
            return
        log.error("GPU %s (%s) reported critical XID %s; marking its units Unhealthy", hit.index, hit.uuid, xid)
        self.inventory.set_health(hit.index, False)
        if self.on_event is not None:
            self.on_event(hit, xid)
