"""How many units each container of a pod spec asks for, and the pod's effective total."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract.errors import ProtocolError, shown

# Patterns are matched whole (fullmatch: "$" would accept a trailing newline) and bounded in length, so no
# value reaches int() with thousands of digits (Python refuses more than 4300 with a ValueError). They name the ASCII
# digits [0-9]: int(), str.isdigit() and \d also take other scripts' digits (Arabic-Indic "٣", fullwidth U+FF13),
# and int() fails on superscripts ("²") that isdigit() accepts; the Go side (strconv, resource.Quantity) reads none.
_QUANTITY_RE = re.compile(r"([0-9]{1,18})(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_SUFFIX = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


def parse_units(value: object, where: str) -> int:
    """An extended-resource quantity as a whole number of units (extended resources cannot be fractional)."""
    text = str(value).strip()
    match = _QUANTITY_RE.fullmatch(text)
    if not match:
        raise ProtocolError(
            f"{where} is {shown(text)}, which is not a whole number of units; write an integer such as 8"
        )
    return int(match.group(1)) * _SUFFIX[match.group(2) or ""]


def container_units(container: Mapping[str, Any], resource: str, where: str) -> int:
    limits = (container.get("resources") or {}).get("limits") or {}
    if resource not in limits:
        return 0
    return parse_units(limits[resource], f"{where} limits[{resource!r}]")


@dataclass(frozen=True)
class InitUnits:
    name: str
    units: int
    restartable: bool = False


@dataclass(frozen=True)
class Demand:
    """What a pod spec asks for: units per app container and per init container, in spec order."""

    containers: tuple[tuple[str, int], ...]
    init_containers: tuple[InitUnits, ...]

    @property
    def total(self) -> int:
        """Kubernetes' effective pod request, sidecars (restartable init containers) included.

        Init containers run one at a time, each beside the sidecars started before it; app containers
        run together beside all sidecars. The pod needs the larger of the two peaks.
        """
        sidecars = 0
        init_peak = 0
        for init in self.init_containers:
            if init.restartable:
                sidecars += init.units
                init_peak = max(init_peak, sidecars)
            else:
                init_peak = max(init_peak, sidecars + init.units)
        return max(sum(units for _, units in self.containers) + sidecars, init_peak)

    @property
    def wants_gpu(self) -> bool:
        return any(u for _, u in self.containers) or any(i.units for i in self.init_containers)

    def units_of(self, name: str) -> int | None:
        for cname, units in self.containers:
            if cname == name:
                return units
        for init in self.init_containers:
            if init.name == name:
                return init.units
        return None

    @property
    def largest(self) -> int:
        return max([u for _, u in self.containers] + [i.units for i in self.init_containers] + [0])


def demand_of(pod: Mapping[str, Any], resource: str) -> Demand:
    spec = pod.get("spec") or {}
    apps = tuple(
        (str(c.get("name")), container_units(c, resource, f"container {c.get('name')!r}"))
        for c in spec.get("containers") or []
    )
    inits = tuple(
        InitUnits(
            str(c.get("name")),
            container_units(c, resource, f"init container {c.get('name')!r}"),
            c.get("restartPolicy") == "Always",
        )
        for c in spec.get("initContainers") or []
    )
    return Demand(apps, inits)
