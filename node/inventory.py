"""This node's GPUs and their fake per-unit devices: from NVML, or a fake inventory for machines without GPUs."""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
ID_SEPARATOR = "-_-"
MAX_ID_LENGTH = 63  # the kubelet rejects longer device IDs
_FAKE_RE = re.compile(r"^([1-9][0-9]*)x([1-9][0-9]*)(GiB|MiB)$")
_UNIT_BYTES = {"GiB": 2**30, "MiB": 2**20}
# XIDs caused by the application (not the GPU), which the NVIDIA device plugin also ignores.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
_FAKE_NAMESPACE = uuid.UUID("5b0c6f2e-6d3a-4b8e-9a52-8f3c1a3e7d10")


class InventoryError(ValueError):
    """A GPU inventory the plugin cannot serve; the text says which setting or GPU and what to do."""


@dataclass(frozen=True)
class Gpu:
    index: int  # the NVML index: what NVIDIA_VISIBLE_DEVICES and ALIYUN_COM_GPU_MEM_IDX mean
    uuid: str
    memory_units: int
    minor: int | None = None  # /dev/nvidia<minor>; None: no device node (a fake GPU, or NVML names none)

    def device_ids(self) -> list[str]:
        return [f"{self.uuid}{ID_SEPARATOR}{n}" for n in range(self.memory_units)]


class Inventory:
    """The GPUs, their devices and health; thread-safe, with a version counter that changes with health."""

    def __init__(self, gpus: Sequence[Gpu], unit: str, max_devices: int, real: bool = False) -> None:
        total = sum(g.memory_units for g in gpus)
        if total > max_devices:
            raise InventoryError(
                f"this node's GPUs make {total} devices of 1 {unit}, more than GPUSHARE_MAX_DEVICES={max_devices} "
                f"(the kubelet and gRPC choke on huge device lists); use GPUSHARE_UNIT=GiB or raise "
                f"GPUSHARE_MAX_DEVICES"
            )
        if len({g.index for g in gpus}) != len(gpus) or len({g.uuid for g in gpus}) != len(gpus):
            raise InventoryError("two GPUs share an index or a UUID; the inventory cannot tell them apart")
        self.gpus: tuple[Gpu, ...] = tuple(sorted(gpus, key=lambda g: g.index))
        self.unit = unit
        self.real = real
        self._by_index = {g.index: g for g in self.gpus}
        self._by_device: dict[str, Gpu] = {}
        for gpu in self.gpus:
            for device_id in gpu.device_ids():
                if len(device_id) > MAX_ID_LENGTH:
                    raise InventoryError(
                        f"device ID {device_id!r} is longer than the kubelet's {MAX_ID_LENGTH} characters; "
                        f"GPU {gpu.index} has an unusual UUID"
                    )
                self._by_device[device_id] = gpu
        self._unhealthy: set[int] = set()
        self._version = 0
        self._changed = threading.Condition()

    def gpu(self, index: int) -> Gpu | None:
        return self._by_index.get(index)

    def gpu_of(self, device_id: str) -> Gpu | None:
        return self._by_device.get(device_id)

    def unknown(self, device_ids: Iterable[str]) -> list[str]:
        return [d for d in device_ids if d not in self._by_device]

    def healthy(self, index: int) -> bool:
        with self._changed:
            return index not in self._unhealthy

    def devices(self) -> list[tuple[str, str]]:
        """(device ID, health) for every device, in a stable order."""
        with self._changed:
            unhealthy = set(self._unhealthy)
        return [
            (d, UNHEALTHY if gpu.index in unhealthy else HEALTHY) for gpu in self.gpus for d in gpu.device_ids()
        ]

    @property
    def version(self) -> int:
        with self._changed:
            return self._version

    def set_health(self, index: int, healthy: bool) -> None:
        """Mark a GPU's units (un)healthy; ListAndWatch streams wake up and resend the full list."""
        with self._changed:
            before = index in self._unhealthy
            if healthy:
                self._unhealthy.discard(index)
            else:
                self._unhealthy.add(index)
            if before != (index in self._unhealthy):
                self._version += 1
                self._changed.notify_all()

    def wake(self) -> None:
        """Wake every waiter without a change (used at shutdown)."""
        with self._changed:
            self._changed.notify_all()

    def wait_change(self, seen: int, timeout: float) -> int:
        with self._changed:
            if self._version == seen:
                self._changed.wait(timeout)
            return self._version


def units_of_bytes(size: int, unit: str) -> int:
    return size // _UNIT_BYTES[unit]


def fake_gpus(spec: str, node_name: str, unit: str) -> list[Gpu]:
    """GPUs from GPUSHARE_FAKE_GPUS such as `4x64GiB`; UUIDs are stable for a node name and an index."""
    match = _FAKE_RE.match(spec.strip())
    if not match:
        raise InventoryError(
            f"GPUSHARE_FAKE_GPUS={spec!r} is not COUNTxMEMORY such as 2x24GiB or 4x16384MiB; "
            "fix it, or leave it empty to read the GPUs from NVML"
        )
    count, size, size_unit = int(match.group(1)), int(match.group(2)), match.group(3)
    memory = units_of_bytes(size * _UNIT_BYTES[size_unit], unit)
    if memory < 1:
        raise InventoryError(f"GPUSHARE_FAKE_GPUS={spec!r} gives GPUs of less than 1 {unit}; give more memory")
    return [
        Gpu(index=i, uuid="GPU-" + str(uuid.uuid5(_FAKE_NAMESPACE, f"{node_name}/{i}")), memory_units=memory)
        for i in range(count)
    ]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpus(unit: str) -> list[Gpu]:
    """The node's GPUs from NVML; the caller keeps NVML initialised for the XID watcher."""
    import pynvml

    try:
        pynvml.nvmlInit()
        log.info("NVML %s, driver %s", _text(pynvml.nvmlSystemGetNVMLVersion()),
                 _text(pynvml.nvmlSystemGetDriverVersion()))
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            gpu = Gpu(index=index, uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                      memory_units=units_of_bytes(memory, unit), minor=_minor(pynvml, handle))
            log.info("GPU %s: %s (%s), %s MiB, device node %s", index, gpu.uuid,
                     _text(pynvml.nvmlDeviceGetName(handle)), memory >> 20,
                     "none" if gpu.minor is None else f"/dev/nvidia{gpu.minor}")
            gpus.append(gpu)
    except pynvml.NVMLError as exc:
        raise InventoryError(
            f"NVML could not list this node's GPUs ({exc}); run the plugin with the NVIDIA runtime and driver, "
            "or set GPUSHARE_FAKE_GPUS (e.g. 2x24GiB) on machines without GPUs"
        ) from exc
    if not gpus:
        raise InventoryError("NVML found no GPU on this node; schedule the plugin only on GPU nodes")
    return gpus


def _minor(pynvml: Any, handle: Any) -> int | None:
    # nvml.h: nvmlDeviceGetMinorNumber may answer NOT_SUPPORTED (a GPU without a /dev/nvidiaN node of its own).
    try:
        return int(pynvml.nvmlDeviceGetMinorNumber(handle))
    except pynvml.NVMLError_NotSupported:
        return None


def load_inventory(fake_spec: str, node_name: str, unit: str, max_devices: int) -> Inventory:
    if fake_spec:
        return Inventory(fake_gpus(fake_spec, node_name, unit), unit, max_devices)
    return Inventory(nvml_gpus(unit), unit, max_devices, real=True)


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
            uuid_text = _text(pynvml.nvmlDeviceGetUUID(data.device))
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
