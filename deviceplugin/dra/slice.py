"""The node's ResourceSlice (resource.k8s.io/v1): one device per healthy GPU, its memory consumable capacity (pure)."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from contract.dra import DEVICE_PREFIX, MEMORY, device_name
from contract.keys import DRA_DRIVER
from contract.modes import Unit
from contract.quantity import QuantityError, quantity_bytes, units_quantity
from deviceplugin.inventory import Gpu, Inventory

API_VERSION = "resource.k8s.io/v1"
_NAME_MAX = 253  # metadata.name: a DNS subdomain
_NOT_NAME_RE = re.compile(r"[^a-z0-9.-]+")


def slice_name(node: str, index: int) -> str:
    """`<node>-<driver>-gpu-<index>` as a DNS subdomain: lower case, other characters replaced, cut to 253."""
    name = _NOT_NAME_RE.sub("-", f"{node}-{DRA_DRIVER}".lower())[:_NAME_MAX - 12].strip(".-") or DRA_DRIVER
    return f"{name}-{DEVICE_PREFIX}{index}"


def gpu_device(gpu: Gpu, unit: Unit) -> dict[str, Any]:
    one = units_quantity(1, unit)
    return {
        "name": device_name(gpu.index),
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


def pool_slices(
    node: str, gpus: Sequence[Gpu], unhealthy: Collection[int], unit: Unit, generation: int = 1
) -> list[dict[str, Any]]:
    """This node's pool: one ResourceSlice per healthy GPU, each holding that GPU's device.

    One device per slice because the Kubernetes 1.34 scheduler checks the remaining capacity of a device by its
    position in the request, not in the slice (k8s.io/dynamic-resource-allocation v0.34.4
    structured/internal/experimental/allocator_experimental.go:1295, `r.deviceIndex`; kubernetes/kubernetes#133705,
    fixed in 1.35): with several devices in a slice, once the first GPU is full no claim gets any other. With one
    device per slice, the first device of its slice is the device itself. Unhealthy GPUs are left out rather than
    tainted: Device.taints needs the DRADeviceTaints gate, alpha and off in 1.34, and without it the API server
    drops the field, so a taint would not keep claims off the GPU."""
    healthy = [gpu for gpu in gpus if gpu.index not in unhealthy]
    return [{
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, gpu.index)},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": len(healthy)},
            "devices": [gpu_device(gpu, unit)],
        },
    } for gpu in healthy]


def inventory_slices(node: str, inventory: Inventory, unit: Unit) -> list[dict[str, Any]]:
    unhealthy = {gpu.index for gpu in inventory.gpus if not inventory.healthy(gpu.index)}
    return pool_slices(node, inventory.gpus, unhealthy, unit)


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


def _generation(item: Mapping[str, Any]) -> int:
    generation = ((item.get("spec") or {}).get("pool") or {}).get("generation")
    return generation if isinstance(generation, int) else 0


def pool_plan(
    existing: Sequence[Mapping[str, Any]], wanted: Sequence[Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """What to write and which slices to delete so the API server holds `wanted` (from pool_slices): nothing when
    every slice already says the same at one generation; else every wanted slice at the next generation (consumers
    use only a pool's highest generation, so all its slices move together), each with its existing
    resourceVersion (a concurrent writer then gets 409 instead of being overwritten), and the others deleted."""
    by_name = {str((e.get("metadata") or {}).get("name")): e for e in existing}
    names = [str(w["metadata"]["name"]) for w in wanted]
    generations = {_generation(e) for e in existing}
    if (set(by_name) == set(names) and len(generations) <= 1
            and all(_published(by_name[n].get("spec") or {}) == _published(w["spec"]) for n, w in zip(
                names, wanted, strict=True))
            and all(((by_name[n].get("spec") or {}).get("pool") or {}).get("resourceSliceCount") == len(wanted)
                    for n in names)):
        return [], []
    generation = max(generations, default=0) + 1
    writes = []
    for name, slice_ in zip(names, wanted, strict=True):
        metadata = dict(slice_["metadata"])
        if name in by_name:
            metadata["resourceVersion"] = (by_name[name].get("metadata") or {}).get("resourceVersion")
        spec = {**slice_["spec"], "pool": {**slice_["spec"]["pool"], "generation": generation}}
        writes.append({**slice_, "metadata": metadata, "spec": spec})
    return writes, sorted(set(by_name) - set(names))
