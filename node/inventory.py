"""This node's GPUs and their health: from NVML, or a fake inventory for machines without GPUs."""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

_FAKE_RE = re.compile(r"^([1-9][0-9]*)x([1-9][0-9]*)(GiB|MiB)$")
_UNIT_BYTES = {"GiB": 2**30, "MiB": 2**20}
_FAKE_NAMESPACE = uuid.UUID("5b0c6f2e-6d3a-4b8e-9a52-8f3c1a3e7d10")


class InventoryError(ValueError):
    """A GPU inventory the node programs cannot serve; the text says which setting or GPU and what to do."""


@dataclass(frozen=True)
class Gpu:
    index: int  # the NVML index: what NVIDIA_VISIBLE_DEVICES and ALIYUN_COM_GPU_MEM_IDX mean
    uuid: str
    memory_units: int
    minor: int | None = None  # /dev/nvidia<minor>; None: no device node (a fake GPU, or NVML names none)


class Inventory:
    """The GPUs and their health; thread-safe, with a version counter that changes with health."""

    def __init__(self, gpus: Sequence[Gpu], unit: str, real: bool = False) -> None:
        if len({g.index for g in gpus}) != len(gpus) or len({g.uuid for g in gpus}) != len(gpus):
            raise InventoryError("two GPUs share an index or a UUID; the inventory cannot tell them apart")
        self.gpus: tuple[Gpu, ...] = tuple(sorted(gpus, key=lambda g: g.index))
        self.unit = unit
        self.real = real
        self._by_index = {g.index: g for g in self.gpus}
        self._unhealthy: set[int] = set()
        self._version = 0
        self._changed = threading.Condition()

    def gpu(self, index: int) -> Gpu | None:
        return self._by_index.get(index)

    def healthy(self, index: int) -> bool:
        with self._changed:
            return index not in self._unhealthy

    def unhealthy(self) -> set[int]:
        """The indexes of the GPUs marked Unhealthy, at one moment."""
        with self._changed:
            return set(self._unhealthy)

    @property
    def version(self) -> int:
        with self._changed:
            return self._version

    def set_health(self, index: int, healthy: bool) -> None:
        """Mark a GPU (un)healthy; waiters in wait_change wake up (the device plugin's ListAndWatch streams)."""
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


def nvml_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpus(unit: str) -> list[Gpu]:
    """The node's GPUs from NVML; the caller keeps NVML initialised for the XID watcher."""
    import pynvml

    try:
        pynvml.nvmlInit()
        log.info("NVML %s, driver %s", nvml_text(pynvml.nvmlSystemGetNVMLVersion()),
                 nvml_text(pynvml.nvmlSystemGetDriverVersion()))
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            gpu = Gpu(index=index, uuid=nvml_text(pynvml.nvmlDeviceGetUUID(handle)),
                      memory_units=units_of_bytes(memory, unit), minor=_minor(pynvml, handle))
            log.info("GPU %s: %s (%s), %s MiB, device node %s", index, gpu.uuid,
                     nvml_text(pynvml.nvmlDeviceGetName(handle)), memory >> 20,
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


def load_inventory(fake_spec: str, node_name: str, unit: str) -> Inventory:
    if fake_spec:
        return Inventory(fake_gpus(fake_spec, node_name, unit), unit)
    return Inventory(nvml_gpus(unit), unit, real=True)
