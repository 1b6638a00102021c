"""What a ResourceClaim allocates to this node's GPUs: its results for our driver and pool, checked (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contract.dra import MEMORY, consumed_memory, driver_results, gpu_index
from contract.modes import Unit
from contract.quantity import QuantityError, quantity_units
from node.inventory import Gpu


class ClaimError(Exception):
    """A claim this driver cannot prepare or unprepare; the text names the claim, what happened and what to do."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources and NodeUnprepareResources."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} (UID {self.uid})"


# What the API defines: a UID is the RFC 4122 text the API server generates (k8s.io/apimachinery pkg/types UID,
# util/uuid NewUUID: lowercase); a namespace is a DNS-1123 label, a claim's name a DNS-1123 subdomain
# (k8s.io/apimachinery pkg/util/validation: IsDNS1123Label, IsDNS1123Subdomain). The UID names files under the CDI
# and state directories, so nothing else may reach a path.
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def checked(ref: ClaimRef) -> ClaimRef:
    """`ref` where its UID, namespace and name are what the API allows, else ClaimError naming the field."""
    problems = [f"{what} {value!r} is not {form}" for what, value, form, ok in (
        ("UID", ref.uid, "a UID the API server generates", _UID.fullmatch(ref.uid)),
        ("namespace", ref.namespace, "a DNS-1123 label", _LABEL.fullmatch(ref.namespace)),
        ("name", ref.name, "a DNS-1123 subdomain",
         len(ref.name) <= 253 and _SUBDOMAIN.fullmatch(ref.name)),
    ) if not ok]
    if problems:
        raise ClaimError(f"the kubelet named a ResourceClaim this driver will not touch: {'; '.join(problems)}; "
                         "only the kubelet may call the driver's socket, with claims the API server stores")
    return ref


@dataclass(frozen=True)
class Share:
    """One allocation result for our driver: `units` of GPU `gpu_index`'s memory for request `request`."""

    request: str
    pool: str
    device: str
    gpu_index: int
    units: int
    share_id: str


def _results(claim: Mapping[str, Any], ref: ClaimRef) -> list[Mapping[str, Any]]:
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"ResourceClaim {ref.namespace}/{ref.name} now has UID {uid}, not the {ref.uid} the kubelet asked to "
            "prepare: the claim was deleted and created again; the kubelet retries with the pod's current claim"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError(
            f"ResourceClaim {ref} is not allocated (status.allocation is empty), so there is nothing to prepare; "
            "the scheduler allocates it before the pod is bound, so check the pod's scheduling events"
        )
    return driver_results(claim)


def _share(result: Mapping[str, Any], ref: ClaimRef, node: str, gpus: Mapping[int, Gpu], unit: Unit) -> Share:
    pool, device, request = str(result.get("pool")), str(result.get("device")), str(result.get("request"))
    if pool != node:
        raise ClaimError(
            f"ResourceClaim {ref} is allocated device {device} of pool {pool}, not of this node's pool {node}: the "
            "pod was bound to another node than the allocation's; delete the pod so it is scheduled again"
        )
    index = gpu_index(device)
    if index is None or index not in gpus:
        raise ClaimError(
            f"ResourceClaim {ref} is allocated device {device}, which node {node} does not have (its devices are "
            f"{', '.join(f'gpu-{i}' for i in sorted(gpus)) or 'none'}); the node's ResourceSlice is stale, so "
            "delete the pod to have it scheduled on a current one"
        )
    consumed = consumed_memory(result)
    if not isinstance(consumed, str):
        raise ClaimError(
            f"ResourceClaim {ref} is allocated device {device} without consumedCapacity.{MEMORY}: the "
            "DRAConsumableCapacity feature gate is off in kube-apiserver or kube-scheduler; turn it on in both "
            "and recreate the claim"
        )
    try:
        units = quantity_units(consumed, unit)
    except QuantityError as exc:
        raise ClaimError(
            f"ResourceClaim {ref} consumes {MEMORY} {consumed!r} of device {device}, which this driver cannot give: "
            f"{exc}; request {MEMORY} in whole {unit} (the device's requestPolicy step)"
        ) from exc
    return Share(request=request, pool=pool, device=device, gpu_index=index, units=units,
                 share_id=str(result.get("shareID") or ""))


def claim_shares(
    claim: Mapping[str, Any], ref: ClaimRef, node: str, gpus: Sequence[Gpu], unit: Unit
) -> list[Share]:
    """The claim's allocation results for our driver, in the claim's order; other drivers' results are left out."""
    by_index = {gpu.index: gpu for gpu in gpus}
    return [_share(result, ref, node, by_index, unit) for result in _results(claim, ref)]
