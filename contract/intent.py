"""The intent: stamped by the mutating webhook at CREATE, signed, immutable afterwards."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from contract.demand import Demand, demand_of
from contract.errors import ProtocolError, json_object
from contract.keys import DEFAULT_PREFIX
from contract.settings import Contract

INTENT_VERSION: Final = 1


@dataclass(frozen=True)
class Intent:
    allocation_id: str
    resource: str
    unit: str
    containers: Mapping[str, int]
    init_containers: Mapping[str, int]
    sidecars: tuple[str, ...] = ()
    total: int = 0
    version: int = INTENT_VERSION

    def to_json(self) -> str:
        """Canonical bytes: the signature covers exactly this text."""
        doc = {
            "version": self.version,
            "allocationId": self.allocation_id,
            "resource": self.resource,
            "unit": self.unit,
            "containers": dict(self.containers),
            "initContainers": dict(self.init_containers),
            "sidecars": list(self.sidecars),
            "total": self.total,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    def units_of(self, name: str) -> int:
        return self.containers.get(name, self.init_containers.get(name, 0))

    @property
    def largest(self) -> int:
        return max([*self.containers.values(), *self.init_containers.values(), 0])


def intent_for(demand: Demand, contract: Contract, allocation_id: str) -> Intent:
    """The intent of a GPU-share pod: only containers that request units are listed."""
    return Intent(
        allocation_id=allocation_id,
        resource=contract.resource,
        unit=contract.unit,
        containers={name: units for name, units in demand.containers if units},
        init_containers={i.name: i.units for i in demand.init_containers if i.units},
        sidecars=tuple(i.name for i in demand.init_containers if i.units and i.restartable),
        total=demand.total,
    )


def _units_map(value: object, key: str, what: str) -> dict[str, int]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0 for k, v in value.items()
    ):
        raise ProtocolError(f"annotation {key}: {what} must map container names to positive integers")
    return dict(value)


def parse_intent(text: str, key: str = DEFAULT_PREFIX + "intent") -> Intent:
    doc = json_object(text, key)
    if doc.get("version") != INTENT_VERSION:
        raise ProtocolError(f"annotation {key} has version {doc.get('version')!r}; this release reads version 1")
    fields = {"allocationId": str, "resource": str, "unit": str, "total": int}
    for name, kind in fields.items():
        if not isinstance(doc.get(name), kind) or isinstance(doc.get(name), bool):
            raise ProtocolError(f"annotation {key} lacks a valid {name!r}; it is written by gpushare only")
    sidecars = doc.get("sidecars", [])
    if not isinstance(sidecars, list) or not all(isinstance(s, str) for s in sidecars):
        raise ProtocolError(f"annotation {key}: 'sidecars' must be a list of init-container names")
    return Intent(
        allocation_id=doc["allocationId"],
        resource=doc["resource"],
        unit=doc["unit"],
        containers=_units_map(doc.get("containers"), key, "'containers'"),
        init_containers=_units_map(doc.get("initContainers"), key, "'initContainers'"),
        sidecars=tuple(sidecars),
        total=doc["total"],
        version=doc["version"],
    )


def intent_mismatch(
    intent: Intent, pod: Mapping[str, Any], contract: Contract, demand: Demand | None = None
) -> str | None:
    """Why the intent does not describe this pod's spec, or None when it does (`demand`: the pod's, when the caller
    has parsed it already)."""
    if intent.resource != contract.resource or intent.unit != contract.unit:
        return (
            f"the intent is for {intent.resource} in {intent.unit} but this cluster shares "
            f"{contract.resource} in {contract.unit}"
        )
    try:
        expected = intent_for(demand or demand_of(pod, contract.resource), contract, intent.allocation_id)
    except ProtocolError as exc:
        return str(exc)
    if expected.to_json() != intent.to_json():
        return (
            f"the intent says {dict(intent.containers)} / init {dict(intent.init_containers)} "
            f"(total {intent.total}) but the pod spec asks for {dict(expected.containers)} / init "
            f"{dict(expected.init_containers)} (total {expected.total})"
        )
    return None
