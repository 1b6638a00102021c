"""What a container receives in Allocate for a slot, and the env-mode check (its CDI spec: node/cdiedits.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contract import RESERVED_ENV
from contract.env import expected_env, normal_env
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


def find_container(pod: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    spec = pod.get("spec") or {}
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or []:
            if isinstance(container, Mapping) and container.get("name") == name:
                return container
    return None


def env_problems(container: Mapping[str, Any], container_units: int, pod_units: int) -> list[str]:
    """Where the container's env differs from what the webhook injects in env mode (empty when it matches)."""
    env = [e for e in container.get("env") or [] if isinstance(e, Mapping)]
    problems: list[str] = []
    for wanted in expected_env(container_units, pod_units):
        name = wanted["name"]
        found = [e for e in env if e.get("name") == name]
        if not found:
            problems.append(f"{name} is missing")
        elif len(found) > 1:
            problems.append(f"{name} is defined {len(found)} times")
        elif normal_env(found[0]) != normal_env(wanted):
            problems.append(f"{name} is not the webhook's definition")
    expected_names = {e["name"] for e in expected_env(container_units, pod_units)}
    for name in RESERVED_ENV:
        if name not in expected_names and any(e.get("name") == name for e in env):
            problems.append(f"{name} is set, which gpushare reserves")
    return problems
