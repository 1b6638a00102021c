"""GPU memory shared through DRA: the gpushare driver's allocated ResourceClaims as rows beside the annotation-based
pods, each on the GPU and with the memory its allocation names (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from contract.dra import consumed_memory, driver_results, gpu_index
from contract.modes import Unit
from contract.quantity import QuantityError, quantity_units
from kubectlplugin.model import ContainerRow, PodRow

Obj = Mapping[str, Any]


def _pods_by_name(pods: Iterable[Obj]) -> dict[tuple[str, str], Obj]:
    out = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        out[str(meta.get("namespace", "")), str(meta.get("name", ""))] = pod
    return out


def _containers(pod: Obj | None, claim: str, units: int) -> tuple[ContainerRow, ...]:
    """The pod's containers that list the claim (by the pod's own name for it, which its status maps to the
    claim's name)."""
    if pod is None:
        return ()
    status = pod.get("status") or {}
    names = {s.get("name") for s in status.get("resourceClaimStatuses") or [] if s.get("resourceClaimName") == claim}
    names |= {c.get("name") for c in (pod.get("spec") or {}).get("resourceClaims") or []
              if c.get("resourceClaimName") == claim}
    out = []
    for kind in ("initContainers", "containers"):
        for container in (pod.get("spec") or {}).get(kind) or []:
            listed = {c.get("name") for c in (container.get("resources") or {}).get("claims") or []}
            if listed & names:
                out.append(ContainerRow(str(container.get("name", "")), units, kind == "initContainers"))
    return tuple(out)


def claim_rows(claims: Iterable[Obj], pods: Iterable[Obj], unit: Unit) -> list[PodRow]:
    """One row per pod (or claim, while no pod reserves it) and GPU share of the gpushare driver."""
    by_name = _pods_by_name(pods)
    rows = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        status = claim.get("status") or {}
        users = [str(r.get("name", "")) for r in status.get("reservedFor") or [] if r.get("resource") == "pods"]
        for result in driver_results(claim):
            index = gpu_index(str(result.get("device", "")))
            try:
                units = quantity_units(str(consumed_memory(result) or ""), unit)
                reason, state = f"DRA claim {name}", "allocated"
            except QuantityError as exc:
                units, reason, state = 0, f"DRA claim {name}: {exc}", "invalid"
            deleting = bool(meta.get("deletionTimestamp"))
            for user in users or [f"<claim {name}>"]:
                pod = by_name.get((namespace, user))
                rows.append(PodRow(namespace, user, str(result.get("pool", "")) or None, index, units,
                                   _containers(pod, name, units), "deleting" if deleting else state, reason))
    return rows
