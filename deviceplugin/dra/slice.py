"""The node's ResourceSlice (resource.k8s.io/v1): one device per healthy GPU, its memory consumable capacity (pure)."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from contract.keys import DRA_DRIVER
from contract.modes import Unit
from deviceplugin.dra.quantity import QuantityError, quantity_bytes, units_quantity
from deviceplugin.inventory import Gpu, Inventory

API_VERSION = "resource.k8s.io/v1"
# The capacity name claims request (`capacity.requests.memory`) and results consume (`consumedCapacity.memory`).
MEMORY = "memory"
DEVICE_PREFIX = "gpu-"
# resource.k8s.io/v1 ResourceSliceMaxDevices: a node with more GPUs would need a pool of several slices.
MAX_DEVICES = 128
_NAME_MAX = 253  # metadata.name: a DNS subdomain
_NOT_NAME_RE = re.compile(r"[^a-z0-9.-]+")


class SliceError(ValueError):
    """The node's ResourceSlice cannot be published; the text says why and what to do."""


def device_name(gpu: Gpu) -> str:
    return f"{DEVICE_PREFIX}{gpu.index}"


def gpu_index(name: str) -> int | None:
    """The GPU index a device name of ours stands for (None: not one of our names)."""
    number = name.removeprefix(DEVICE_PREFIX)
    if name == number or not number.isdigit() or str(int(number)) != number:
        return None
    return int(number)


def slice_name(node: str) -> str:
    """`<node>-<driver>` as a DNS subdomain: lower case, other characters replaced, cut to 253 characters."""
    name = _NOT_NAME_RE.sub("-", f"{node}-{DRA_DRIVER}".lower())[:_NAME_MAX]
    return name.strip(".-") or DRA_DRIVER


def gpu_device(gpu: Gpu, unit: Unit) -> dict[str, Any]:
    one = units_quantity(1, unit)
    return {
        "name": device_name(gpu),
        "attributes": {"index": {"int": gpu.index}, "uuid": {"string": gpu.uuid}},
        # requestPolicy.default matters: a claim that omits the memory request would otherwise consume the whole
        # GPU (k8s.io/dynamic-resource-allocation structured/internal/experimental/consumable_capacity.go).
        "capacity": {
            MEMORY: {
                "value": units_quantity(gpu.memory_units, unit),
                "requestPolicy": {"default": one, "validRange": {"min": one, "step": one}},
            }
        },
        # A requestPolicy is valid only with allowMultipleAllocations (DRAConsumableCapacity, alpha in 1.34: the
        # API server drops both fields unless the gate is on there).
        "allowMultipleAllocations": True,
    }


def resource_slice(
    node: str, gpus: Sequence[Gpu], unhealthy: Collection[int], unit: Unit, generation: int = 1
) -> dict[str, Any]:
    """The slice of this node's pool. Unhealthy GPUs are left out rather than tainted: Device.taints in
    resource.k8s.io/v1 needs the DRADeviceTaints gate, alpha and off in Kubernetes 1.34, and the API server
    silently drops the field without it, so a taint would not keep claims off the GPU."""
    devices = [gpu_device(gpu, unit) for gpu in gpus if gpu.index not in unhealthy]
    if len(devices) > MAX_DEVICES:
        raise SliceError(
            f"node {node} has {len(devices)} healthy GPUs, more than the {MAX_DEVICES} devices one ResourceSlice "
            "may hold; this driver publishes a single slice per node, so serve fewer GPUs on this node"
        )
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def inventory_slice(node: str, inventory: Inventory, unit: Unit, generation: int = 1) -> dict[str, Any]:
    unhealthy = {gpu.index for gpu in inventory.gpus if not inventory.healthy(gpu.index)}
    return resource_slice(node, inventory.gpus, unhealthy, unit, generation)


def _amounts(value: Any) -> Any:
    """Capacity quantities by value: the API server writes them back canonical (16384Mi reads as 16Gi)."""
    if isinstance(value, Mapping):
        return {k: _amounts(v) for k, v in value.items()}
    try:
        return quantity_bytes(value) if isinstance(value, str) else value
    except QuantityError:
        return value


def _published(spec: Mapping[str, Any]) -> tuple[Any, ...]:
    pool = spec.get("pool") or {}
    devices = [
        {**device, "capacity": _amounts(device.get("capacity") or {})} if isinstance(device, Mapping) else device
        for device in spec.get("devices") or []
    ]
    return spec.get("driver"), spec.get("nodeName"), pool.get("name"), devices


def slice_update(existing: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> dict[str, Any] | None:
    """What to write so the API server holds `wanted`: None when `existing` already says the same; else `wanted`
    with the pool generation above the existing one (consumers use only a pool's highest generation) and the
    existing resourceVersion (so a concurrent writer makes the update fail with 409 instead of being overwritten)."""
    if existing is None:
        return dict(wanted)
    old_spec = existing.get("spec") or {}
    if _published(old_spec) == _published(wanted["spec"]):
        return None
    old_generation = (old_spec.get("pool") or {}).get("generation")
    generation = old_generation + 1 if isinstance(old_generation, int) else 1
    spec = dict(wanted["spec"])
    spec["pool"] = {**spec["pool"], "generation": generation}
    metadata = {**wanted["metadata"], "resourceVersion": (existing.get("metadata") or {}).get("resourceVersion")}
    return {**wanted, "metadata": metadata, "spec": spec}
