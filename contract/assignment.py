"""The assignment: the compatible ALIYUN_COM_GPU_MEM_* keys the scheduler extender (or the node's plugin) writes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from contract.errors import ProtocolError, shown
from contract.intent import Intent
from contract.keys import ASSIGNED, ASSUME_TIME, DEV, IDX, POD

# Matched whole and ASCII digits only, like the quantities (contract/demand.py).
# 19 digits: an int64, which holds the largest value written (ALIYUN_COM_GPU_MEM_ASSUME_TIME, unix nanoseconds).
_INT_RE = re.compile(r"0|[1-9][0-9]{0,18}")


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
            f"annotation {key} is {shown(value)}, which is not a non-negative decimal integer of at most 19 "
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
