"""The device plugin's fake per-unit devices over the node's GPUs: their IDs, the slot of a set of them, the kubelet's
limits and health."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from node.inventory import Gpu, Inventory, InventoryError

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
ID_SEPARATOR = "-_-"
MAX_ID_LENGTH = 63  # the kubelet rejects longer device IDs


def device_ids(gpu: Gpu) -> list[str]:
    """One device per unit of the GPU's memory: what the kubelet counts and assigns."""
    return [f"{gpu.uuid}{ID_SEPARATOR}{n}" for n in range(gpu.memory_units)]


def slot_of(device_ids: Iterable[str]) -> str:
    """The slot of a device-ID set: stable whatever the order the kubelet lists the IDs in."""
    return hashlib.sha256("\n".join(sorted(device_ids)).encode()).hexdigest()[:16]


class UnitInventory(Inventory):
    """The node's inventory with one device per unit; refused when the GPUs make more than `max_devices`."""

    def __init__(self, gpus: Sequence[Gpu], unit: str, max_devices: int, real: bool = False) -> None:
        total = sum(g.memory_units for g in gpus)
        if total > max_devices:
            raise InventoryError(
                f"this node's GPUs make {total} devices of 1 {unit}, more than GPUSHARE_MAX_DEVICES={max_devices} "
                f"(the kubelet and gRPC choke on huge device lists); use GPUSHARE_UNIT=GiB or raise "
                f"GPUSHARE_MAX_DEVICES"
            )
        super().__init__(gpus, unit, real)
        self._by_device: dict[str, Gpu] = {}
        for gpu in self.gpus:
            for device_id in device_ids(gpu):
                if len(device_id) > MAX_ID_LENGTH:
                    raise InventoryError(
                        f"device ID {device_id!r} is longer than the kubelet's {MAX_ID_LENGTH} characters; "
                        f"GPU {gpu.index} has an unusual UUID"
                    )
                self._by_device[device_id] = gpu

    @classmethod
    def of(cls, inventory: Inventory, max_devices: int) -> UnitInventory:
        """The node's inventory (node.inventory.load_inventory) with its devices."""
        return cls(inventory.gpus, inventory.unit, max_devices, inventory.real)

    def gpu_of(self, device_id: str) -> Gpu | None:
        return self._by_device.get(device_id)

    def unknown(self, ids: Iterable[str]) -> list[str]:
        return [d for d in ids if d not in self._by_device]

    def devices(self) -> list[tuple[str, str]]:
        """(device ID, health) for every device, in a stable order; ListAndWatch resends it when health changes."""
        unhealthy = self.unhealthy()
        return [(d, UNHEALTHY if gpu.index in unhealthy else HEALTHY) for gpu in self.gpus for d in device_ids(gpu)]
