"""The annotation contract shared by the webhook and the device plugin: keys, records, parsing, rules."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

INTENT_VERSION: Final = 1
ALLOCATION_VERSION: Final = 1
UNITS: Final = ("GiB", "MiB")
DELIVERY_MODES: Final = ("env", "cdi")
# Who picks a pod's GPU: the gpushare scheduler extender before binding, or the device plugin on the node (cdi only).
PLACEMENTS: Final = ("extender", "node")
DEFAULT_RESOURCE: Final = "aliyun.com/gpu-mem"
DEFAULT_PREFIX: Final = "gpushare.io/"

# Compatible keys, written by the scheduler extender (or by the plugin in node-local placement).
IDX: Final = "ALIYUN_COM_GPU_MEM_IDX"
DEV: Final = "ALIYUN_COM_GPU_MEM_DEV"
POD: Final = "ALIYUN_COM_GPU_MEM_POD"
ASSUME_TIME: Final = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
ASSIGNED: Final = "ALIYUN_COM_GPU_MEM_ASSIGNED"
COMPAT_KEYS: Final = (IDX, DEV, POD, ASSUME_TIME, ASSIGNED)
# IDX/DEV/POD feed the containers' environment through the downward API, so they are frozen once bound.
PLACEMENT_KEYS: Final = (IDX, DEV, POD)

# Environment variables the webhook injects into GPU-share containers in `env` delivery mode.
ENV_VISIBLE: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_CUDA_VISIBLE: Final = "CUDA_VISIBLE_DEVICES"
ENV_IDX: Final = "ALIYUN_COM_GPU_MEM_IDX"
ENV_DEV: Final = "ALIYUN_COM_GPU_MEM_DEV"
ENV_CONTAINER: Final = "ALIYUN_COM_GPU_MEM_CONTAINER"
ENV_POD: Final = "ALIYUN_COM_GPU_MEM_POD"
RESERVED_ENV: Final = (ENV_VISIBLE, ENV_CUDA_VISIBLE, ENV_IDX, ENV_DEV, ENV_CONTAINER, ENV_POD)

# Patterns are matched whole (fullmatch: "$" would accept a trailing newline) and bounded in length, so no
# value reaches int() with thousands of digits (Python refuses more than 4300 with a ValueError). They name the ASCII
# digits [0-9]: int(), str.isdigit() and \d also take other scripts' digits (Arabic-Indic "٣", fullwidth U+FF13),
# and int() fails on superscripts ("²") that isdigit() accepts; the Go side (strconv, resource.Quantity) reads none.
_PREFIX_RE = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)/")
# 19 digits: an int64, which holds the largest value written (ALIYUN_COM_GPU_MEM_ASSUME_TIME, unix nanoseconds).
_INT_RE = re.compile(r"0|[1-9][0-9]{0,18}")
_QUANTITY_RE = re.compile(r"([0-9]{1,18})(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
_SUFFIX = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


class ProtocolError(ValueError):
    """An annotation or resource value that breaks the contract; the text names the key and the fix."""


def _shown(value: object) -> str:
    """A value for a message, cut short: a message must not repeat a 5000-digit number."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "... (" + str(len(str(value))) + " characters)"


@dataclass(frozen=True)
class Contract:
    """The cluster-wide settings both sides must agree on."""

    resource: str = DEFAULT_RESOURCE
    unit: str = "GiB"
    prefix: str = DEFAULT_PREFIX
    delivery: str = "env"
    placement: str = "extender"

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ProtocolError(f"unit {self.unit!r} is not supported; use one of {', '.join(UNITS)}")
        if self.delivery not in DELIVERY_MODES:
            raise ProtocolError(f"delivery mode {self.delivery!r} is unknown; use one of env, cdi")
        if self.placement not in PLACEMENTS:
            raise ProtocolError(f"placement {self.placement!r} is unknown; use one of extender, node")
        if self.placement == "node" and self.delivery != "cdi":
            raise ProtocolError(
                "node placement needs cdi delivery: in env delivery the GPU index must be in the pod's annotations "
                "before the kubelet admits it, so only the scheduler extender can place pods; set "
                "GPUSHARE_DELIVERY=cdi or GPUSHARE_PLACEMENT=extender in the shared settings (the gpushare-config "
                "ConfigMap), so the webhook and every plugin agree"
            )
        if not _PREFIX_RE.fullmatch(self.prefix) or len(self.prefix) > 254:
            raise ProtocolError(
                f"annotation prefix {self.prefix!r} is not a DNS subdomain followed by '/', e.g. gpushare.io/"
            )
        if "/" not in self.resource:
            raise ProtocolError(f"resource name {self.resource!r} must be a domain-prefixed extended resource")

    @property
    def intent_key(self) -> str:
        return self.prefix + "intent"

    @property
    def signature_key(self) -> str:
        return self.prefix + "intent-signature"

    @property
    def allocation_key(self) -> str:
        return self.prefix + "allocation"

    @property
    def own_keys(self) -> tuple[str, str, str]:
        return (self.intent_key, self.signature_key, self.allocation_key)

    @property
    def reserved_keys(self) -> tuple[str, ...]:
        return (*COMPAT_KEYS, *self.own_keys)


# ---------------------------------------------------------------------------------------------------------
# Pod spec: how many units each container asks for, and the pod's effective total.


def parse_units(value: object, where: str) -> int:
    """An extended-resource quantity as a whole number of units (extended resources cannot be fractional)."""
    text = str(value).strip()
    match = _QUANTITY_RE.fullmatch(text)
    if not match:
        raise ProtocolError(
            f"{where} is {_shown(text)}, which is not a whole number of units; write an integer such as 8"
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


# ---------------------------------------------------------------------------------------------------------
# Intent: stamped by the mutating webhook at CREATE, signed, immutable afterwards.


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


def _json_object(text: str, key: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        raise ProtocolError(
            f"annotation {key} is not valid JSON ({str(exc)[:200]}); it is written by gpushare only"
        ) from exc
    if not isinstance(doc, dict):
        raise ProtocolError(f"annotation {key} must be a JSON object; it is written by gpushare only")
    return doc


def _units_map(value: object, key: str, what: str) -> dict[str, int]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0 for k, v in value.items()
    ):
        raise ProtocolError(f"annotation {key}: {what} must map container names to positive integers")
    return dict(value)


def parse_intent(text: str, key: str = DEFAULT_PREFIX + "intent") -> Intent:
    doc = _json_object(text, key)
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


# ---------------------------------------------------------------------------------------------------------
# Assignment: the compatible ALIYUN_COM_GPU_MEM_* keys.


@dataclass(frozen=True)
class Assignment:
    index: int | None = None
    device_units: int | None = None
    pod_units: int | None = None
    assume_time: int | None = None
    assigned: bool | None = None

    @property
    def placed(self) -> bool:
        return self.index is not None

    def annotations(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in ((IDX, self.index), (DEV, self.device_units), (POD, self.pod_units),
                           (ASSUME_TIME, self.assume_time)):
            if value is not None:
                out[key] = str(value)
        if self.assigned is not None:
            out[ASSIGNED] = "true" if self.assigned else "false"
        return out


def int_annotation(annotations: Mapping[str, str], key: str) -> int | None:
    """A compatible key's number (None when absent): ASCII digits only, no sign, no leading zero, at most 19."""
    if key not in annotations:
        return None
    value = annotations[key]
    if not isinstance(value, str) or not _INT_RE.fullmatch(value):
        raise ProtocolError(
            f"annotation {key} is {_shown(value)}, which is not a non-negative decimal integer of at most 19 "
            "digits; it is written by the scheduler extender and must be a plain number such as 1"
        )
    return int(value)


def parse_assigned(annotations: Mapping[str, str]) -> bool | None:
    if ASSIGNED not in annotations:
        return None
    value = annotations[ASSIGNED]
    if value not in ("true", "false"):
        raise ProtocolError(f'annotation {ASSIGNED} is {value!r}; it must be "true" or "false"')
    return value == "true"


def parse_assignment(annotations: Mapping[str, str]) -> Assignment:
    return Assignment(
        index=int_annotation(annotations, IDX),
        device_units=int_annotation(annotations, DEV),
        pod_units=int_annotation(annotations, POD),
        assume_time=int_annotation(annotations, ASSUME_TIME),
        assigned=parse_assigned(annotations),
    )


def assignment_problems(intent: Intent, assignment: Assignment) -> list[str]:
    """The rules an assignment must pass against the pod's intent (empty when it passes)."""
    problems: list[str] = []
    if assignment.pod_units is not None and assignment.pod_units != intent.total:
        problems.append(
            f"annotation {POD} is {assignment.pod_units} but the pod's stamped intent totals {intent.total} "
            f"{intent.unit}; the extender must write the pod's total request"
        )
    if assignment.device_units is not None and assignment.device_units < intent.largest:
        problems.append(
            f"annotation {DEV} is {assignment.device_units} {intent.unit}, smaller than the "
            f"{intent.largest} {intent.unit} one container of the pod needs; pick a GPU with enough memory"
        )
    if assignment.index is not None and (assignment.device_units is None or assignment.pod_units is None):
        problems.append(
            f"annotation {IDX} is set without {DEV} and {POD}; the extender must write all three together"
        )
    return problems


# ---------------------------------------------------------------------------------------------------------
# Allocation record: written by the device plugin at PreStartContainer.


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
    doc = _json_object(text, key)
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


def read_annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in annotations.items()}


def pod_ref(pod: Mapping[str, Any]) -> str:
    """namespace/name for messages; Deployment pods at admission have only generateName."""
    meta = pod.get("metadata") or {}
    name = meta.get("name") or (str(meta.get("generateName") or "") + "<generated>")
    return f"{meta.get('namespace') or '<namespace>'}/{name}"


def gpu_containers(pod: Mapping[str, Any], resource: str) -> Sequence[Mapping[str, Any]]:
    """App and init containers whose limits name the GPU-share resource with a positive count."""
    spec = pod.get("spec") or {}
    out = []
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            try:
                units = container_units(c, resource, "container")
            except ProtocolError:
                units = 1  # malformed but present: still a GPU-share container for env checks
            if units:
                out.append(c)
    return out
