"""The allocation record: written by the device plugin at PreStartContainer, checked by the webhook."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from contract.assignment import Assignment
from contract.errors import ProtocolError, json_object
from contract.intent import Intent
from contract.keys import DEFAULT_PREFIX, IDX

ALLOCATION_VERSION: Final = 1


@dataclass(frozen=True)
class ContainerSlot:
    units: int
    slot: str


@dataclass(frozen=True)
class Allocation:
    allocation_id: str
    node: str
    gpu_index: int
    gpu_uuid: str
    containers: Mapping[str, ContainerSlot] = field(default_factory=dict)
    version: int = ALLOCATION_VERSION

    def to_json(self) -> str:
        doc = {
            "version": self.version,
            "allocationId": self.allocation_id,
            "node": self.node,
            "gpu": {"index": self.gpu_index, "uuid": self.gpu_uuid},
            "containers": {n: {"units": c.units, "slot": c.slot} for n, c in sorted(self.containers.items())},
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def parse_allocation(text: str, key: str = DEFAULT_PREFIX + "allocation") -> Allocation:
    doc = json_object(text, key)
    if doc.get("version") != ALLOCATION_VERSION:
        raise ProtocolError(f"annotation {key} has version {doc.get('version')!r}; this release reads version 1")
    gpu = doc.get("gpu")
    containers = doc.get("containers")
    if (
        not isinstance(doc.get("allocationId"), str)
        or not isinstance(doc.get("node"), str)
        or not isinstance(gpu, dict)
        or not isinstance(gpu.get("index"), int)
        or isinstance(gpu.get("index"), bool)
        or not isinstance(gpu.get("uuid"), str)
        or not isinstance(containers, dict)
    ):
        raise ProtocolError(
            f"annotation {key} lacks allocationId, node, gpu.index, gpu.uuid or containers; "
            "it is written by the gpushare device plugin only"
        )
    slots: dict[str, ContainerSlot] = {}
    for name, entry in containers.items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("units"), int)
            or isinstance(entry.get("units"), bool)
            or not isinstance(entry.get("slot"), str)
        ):
            raise ProtocolError(f"annotation {key}: container {name!r} needs integer 'units' and string 'slot'")
        slots[name] = ContainerSlot(entry["units"], entry["slot"])
    return Allocation(doc["allocationId"], doc["node"], gpu["index"], gpu["uuid"], slots)


def allocation_problems(
    intent: Intent, assignment: Assignment, allocation: Allocation, node_name: str | None
) -> list[str]:
    """The rules an allocation record must pass against the intent, the IDX and spec.nodeName."""
    problems: list[str] = []
    if allocation.allocation_id != intent.allocation_id:
        problems.append(
            f"the allocation record is for allocation {allocation.allocation_id} but the pod's intent is "
            f"{intent.allocation_id}"
        )
    if node_name is None or allocation.node != node_name:
        problems.append(
            f"the allocation record names node {allocation.node!r} but the pod is bound to {node_name!r}"
        )
    if assignment.index is None or allocation.gpu_index != assignment.index:
        problems.append(
            f"the allocation record names GPU {allocation.gpu_index} but {IDX} is {assignment.index}"
        )
    for name, slot in allocation.containers.items():
        wanted = intent.units_of(name)
        if slot.units != wanted:
            problems.append(
                f"the allocation record gives container {name!r} {slot.units} {intent.unit} but its intent "
                f"is {wanted} {intent.unit}"
            )
    return problems
