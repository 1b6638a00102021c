"""The node's ResourceSlice (resource.k8s.io/v1): one device per healthy GPU, its memory consumable capacity (pure)."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from contract.dra import DEVICE_PREFIX, MEMORY, device_name
from contract.keys import DRA_DRIVER
from contract.modes import Unit
from contract.quantity import QuantityError, quantity_bytes, units_quantity
from node.inventory import Gpu, Inventory

API_VERSION = "resource.k8s.io/v1"
_NAME_MAX = 253  # metadata.name: a DNS subdomain
_NOT_NAME_RE = re.compile(r"[^a-z0-9.-]+")


def slice_prefix(node: str, index: int) -> str:
    """The generateName of the slice of GPU `index`: `<node>-<driver>-gpu-<index>-` as a DNS subdomain (lower case,
    other characters replaced, cut to 253). The API server keeps its first 58 characters and appends five random
    ones (k8s.io/apiserver pkg/storage/names/generate.go, MaxGeneratedNameLength), and retries another name when that
    one is taken (pkg/registry/generic/registry/store.go, createWithGenerateNameRetry): no other writer can hold the
    name a slice of this node needs. The slices policy (manifests/dra/slice-policy.yaml) lets the driver on a node
    create only names that begin as this prefix does."""
    name = _NOT_NAME_RE.sub("-", f"{node}-{DRA_DRIVER}".lower())[:_NAME_MAX - 13].strip(".-") or DRA_DRIVER
    return f"{name}-{DEVICE_PREFIX}{index}-"


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
        # A requestPolicy is valid only with allowMultipleAllocations (DRAConsumableCapacity: alpha and off in 1.35,
        # beta and on from 1.36; an API server without it drops both fields: capacity_dropped tells).
        "allowMultipleAllocations": True,
    }


def node_owner(node: str, uid: str) -> list[dict[str, Any]]:
    """The ownerReferences of a slice of `node`: its Node object, as the controller, so that the garbage collector
    deletes the slices when the Node is deleted (what upstream's resourceslice controller sets on a node's slices:
    k8s.io/dynamic-resource-allocation resourceslice/resourceslicecontroller.go, Owner with Controller: true)."""
    return [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": True}]


def pool_slices(
    node: str, gpus: Sequence[Gpu], unhealthy: Collection[int], unit: Unit, generation: int = 1, *,
    node_uid: str | None = None,
) -> list[dict[str, Any]]:
    """This node's pool: one ResourceSlice per healthy GPU, each holding that GPU's device.

    One device per slice because the Kubernetes 1.34 scheduler checked the remaining capacity of a device by its
    position in the request, not in the slice (k8s.io/dynamic-resource-allocation v0.34.4
    structured/internal/experimental/allocator_experimental.go:1141-1149 and :1295, `r.deviceIndex`;
    kubernetes/kubernetes#133705): with several devices in a slice, once the first GPU was full no claim got any
    other. Fixed in 1.35 (#133706, CHANGELOG-1.35): from v0.35.4 on, every allocator that supports consumable
    capacity (experimental in 1.35; incubating and experimental in 1.36 and 1.37) passes the device itself
    (`CmpRequestOverCapacity(..., device.slice, *device.Device)`: v0.35.4 experimental :1335, v0.36.3 incubating
    :1415, v0.37.2 incubating :1436 and experimental :1706). The layout stays because it is valid and correct on
    every supported release (each slice names the pool's resourceSliceCount) and the real-cluster tier proves it;
    its one cost since 1.35 is that an ExactCount request skips a pool while it is incomplete (v0.37.2 incubating
    :1090), so while pool_plan's writes land one by one the node offers nothing for a few requests' time, and the
    scheduler retries the pod on the slice event that completes the pool.

    Unhealthy GPUs are left out rather than tainted: Device.taints needs the DRADeviceTaints gate, alpha and off
    in 1.35 (beta from 1.36, GA in 1.37), and without it the API server drops the field, so a taint would not keep
    claims off the GPU.

    With `node_uid` (the Node object's metadata.uid) each slice is owned by the Node (node_owner)."""
    healthy = [gpu for gpu in gpus if gpu.index not in unhealthy]
    owner = {} if node_uid is None else {"ownerReferences": node_owner(node, node_uid)}
    return [{
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"generateName": slice_prefix(node, gpu.index), **owner},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": len(healthy)},
            "devices": [gpu_device(gpu, unit)],
        },
    } for gpu in healthy]


def inventory_slices(node: str, inventory: Inventory, unit: Unit, node_uid: str | None = None) -> list[dict[str, Any]]:
    unhealthy = {gpu.index for gpu in inventory.gpus if not inventory.healthy(gpu.index)}
    return pool_slices(node, inventory.gpus, unhealthy, unit, node_uid=node_uid)


def _amounts(value: Any) -> Any:
    """Capacity quantities by value: the API server writes them back canonical (16384Mi reads as 16Gi)."""
    if isinstance(value, Mapping):
        return {k: _amounts(v) for k, v in value.items()}
    try:
        return quantity_bytes(value) if isinstance(value, str) else value
    except QuantityError:
        return value


def without_consumable_capacity(device: Mapping[str, Any]) -> dict[str, Any]:
    """`device` as an API server with DRAConsumableCapacity off stores it: no allowMultipleAllocations, no capacity
    requestPolicy, the capacity's value kept (k8s.io/kubernetes v1.35.4
    pkg/registry/resource/resourceslice/strategy.go:308-326, dropDisabledDRAConsumableCapacityFields; an update
    keeps them when the stored slice already has them)."""
    capacity = {name: {k: v for k, v in c.items() if k != "requestPolicy"} if isinstance(c, Mapping) else c
                for name, c in (device.get("capacity") or {}).items()}
    return {**{k: v for k, v in device.items() if k != "allowMultipleAllocations"},
            **({"capacity": capacity} if "capacity" in device else {})}


def capacity_dropped(written: Mapping[str, Any], stored: Mapping[str, Any] | None) -> bool:
    """Whether the API server stored the slice `written` (as it answered the write: `stored`) without a device's
    allowMultipleAllocations or a capacity's requestPolicy: its DRAConsumableCapacity gate is off."""
    kept = {d.get("name"): d for d in ((stored or {}).get("spec") or {}).get("devices") or [] if isinstance(d, Mapping)}
    for device in written["spec"]["devices"]:
        got = kept.get(device["name"])
        if got is None:
            continue
        if device.get("allowMultipleAllocations") and not got.get("allowMultipleAllocations"):
            return True
        got_capacity = got.get("capacity") or {}
        if any("requestPolicy" in c and "requestPolicy" not in (got_capacity.get(name) or {})
               for name, c in (device.get("capacity") or {}).items()):
            return True
    return False


def _published_device(device: Any, consumable_capacity: bool) -> Any:
    if not isinstance(device, Mapping):
        return device
    if not consumable_capacity:
        device = without_consumable_capacity(device)
    return {**device, "capacity": _amounts(device.get("capacity") or {})}


def _published(spec: Mapping[str, Any], consumable_capacity: bool = True) -> tuple[Any, ...]:
    pool = spec.get("pool") or {}
    devices = [_published_device(device, consumable_capacity) for device in spec.get("devices") or []]
    return spec.get("driver"), spec.get("nodeName"), pool.get("name"), devices


def _generation(item: Mapping[str, Any]) -> int:
    generation = ((item.get("spec") or {}).get("pool") or {}).get("generation")
    return generation if isinstance(generation, int) else 0


def _name(item: Mapping[str, Any]) -> str:
    return str((item.get("metadata") or {}).get("name"))


def _owners(item: Mapping[str, Any]) -> list[Any]:
    return list((item.get("metadata") or {}).get("ownerReferences") or [])


def _owned_by(item: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """The owners as compared: the fields the keeper sets (the API server may add blockOwnerDeletion: false)."""
    return [tuple(o.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller"))
            for o in _owners(item) if isinstance(o, Mapping)]


def _device(item: Mapping[str, Any]) -> str | None:
    """The name of the one device a slice of this driver holds (None for any other shape)."""
    devices = (item.get("spec") or {}).get("devices") or []
    return str(devices[0].get("name")) if len(devices) == 1 and isinstance(devices[0], Mapping) else None


def pool_plan(
    existing: Sequence[Mapping[str, Any]], wanted: Sequence[Mapping[str, Any]], *, consumable_capacity: bool = True
) -> tuple[list[dict[str, Any]], list[str]]:
    """What to write and which slices to delete so the API server holds `wanted` (from pool_slices): nothing when
    every slice already says the same at one generation; else every wanted slice at the next generation (consumers
    use only a pool's highest generation, so all its slices move together), and the others deleted.

    A stored slice stands for the wanted one that holds the same device, whatever its name (the API server names
    them: slice_prefix): it is replaced with its resourceVersion (a concurrent writer then gets 409 instead of being
    overwritten), and a wanted slice that none stands for is created by generateName. Of two stored slices holding
    one device (two writers created it at once) the first by name stands, so both writers keep the same one.
    With `consumable_capacity` False (the API server drops it), a slice stored as such a server stores the wanted
    one counts as the same, so the pool is not written again and again. A stored slice whose ownerReferences are
    not the wanted ones (none yet, or a Node of an earlier UID) is written again with them."""
    standing: dict[str, Mapping[str, Any]] = {}
    for item in sorted(existing, key=_name):
        device = _device(item)
        if device is not None:
            standing.setdefault(device, item)
    matched = {_device(w): standing[d] for w in wanted if (d := _device(w)) is not None and d in standing}
    kept = {id(item) for item in matched.values()}
    deletes = sorted(_name(e) for e in existing if id(e) not in kept)
    generations = {_generation(e) for e in existing}
    if (not deletes and len(matched) == len(wanted) and len(generations) <= 1
            and all(_published(matched[_device(w)].get("spec") or {}) == _published(w["spec"], consumable_capacity)
                    and _owned_by(matched[_device(w)]) == _owned_by(w)
                    and ((matched[_device(w)].get("spec") or {}).get("pool") or {}).get("resourceSliceCount")
                    == len(wanted) for w in wanted)):
        return [], []
    generation = max(generations, default=0) + 1
    writes = []
    for slice_ in wanted:
        stored = matched.get(_device(slice_))
        owners = {"ownerReferences": _owners(slice_)} if _owners(slice_) else {}
        metadata = dict(slice_["metadata"]) if stored is None else {
            "name": _name(stored), "resourceVersion": (stored.get("metadata") or {}).get("resourceVersion"), **owners}
        spec = {**slice_["spec"], "pool": {**slice_["spec"]["pool"], "generation": generation}}
        writes.append({**slice_, "metadata": metadata, "spec": spec})
    return writes, deletes
