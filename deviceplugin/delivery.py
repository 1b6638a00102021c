"""What a container receives in Allocate for a slot (at PreStartContainer: deviceplugin/deliver.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from contract.modes import Delivery
from node.cdiedits import cdi_device_name

SLOT_ENV = "GPUSHARE_SLOT"


@dataclass(frozen=True)
class ContainerDelivery:
    """One ContainerAllocateResponse, as plain data: it depends on the slot only, never on a guessed pod."""

    envs: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


def allocate_delivery(slot: str, delivery: Delivery) -> ContainerDelivery:
    """env mode: only GPUSHARE_SLOT (the GPU arrives through the webhook's downward-API env, and the
    plugin never sets a name the webhook injects); cdi mode: the slot's CDI device, written at PreStart."""
    if delivery == "cdi":
        return ContainerDelivery(envs={SLOT_ENV: slot}, cdi_devices=(cdi_device_name(slot),))
    return ContainerDelivery(envs={SLOT_ENV: slot})
