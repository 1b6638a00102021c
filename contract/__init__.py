"""The contract the webhook and the device plugin share: the reserved names, the cluster-wide settings, and the
intent, assignment and allocation records with their rules (pure).

Submodules import their siblings, never this package; everyone else imports the names from here, or `signing`,
`holding` and `env` as modules of their own."""

from __future__ import annotations

from contract.allocation import ALLOCATION_VERSION, Allocation, ContainerSlot, allocation_problems, parse_allocation
from contract.assignment import Assignment, assignment_problems, int_annotation, parse_assigned, parse_assignment
from contract.demand import Demand, InitUnits, container_units, demand_of, parse_units
from contract.errors import ProtocolError
from contract.intent import INTENT_VERSION, Intent, intent_for, intent_mismatch, parse_intent
from contract.keys import (
    ASSIGNED,
    ASSUME_TIME,
    COMPAT_KEYS,
    COMPAT_PREFIX,
    DEFAULT_PREFIX,
    DEFAULT_RESOURCE,
    DEV,
    ENV_CONTAINER,
    ENV_CUDA_VISIBLE,
    ENV_DEV,
    ENV_IDX,
    ENV_POD,
    ENV_VISIBLE,
    IDX,
    PLACEMENT_KEYS,
    POD,
    RESERVED_ENV,
    is_reserved_annotation,
)
from contract.modes import DELIVERY_MODES, PLACEMENTS, UNITS
from contract.pods import gpu_containers, pod_ref, read_annotations
from contract.settings import CONTRACT_VARIABLES, Contract, contract_from

__all__ = [
    "ALLOCATION_VERSION",
    "ASSIGNED",
    "ASSUME_TIME",
    "COMPAT_KEYS",
    "COMPAT_PREFIX",
    "CONTRACT_VARIABLES",
    "DEFAULT_PREFIX",
    "DEFAULT_RESOURCE",
    "DELIVERY_MODES",
    "DEV",
    "ENV_CONTAINER",
    "ENV_CUDA_VISIBLE",
    "ENV_DEV",
    "ENV_IDX",
    "ENV_POD",
    "ENV_VISIBLE",
    "IDX",
    "INTENT_VERSION",
    "PLACEMENTS",
    "PLACEMENT_KEYS",
    "POD",
    "RESERVED_ENV",
    "UNITS",
    "Allocation",
    "Assignment",
    "ContainerSlot",
    "Contract",
    "Demand",
    "InitUnits",
    "Intent",
    "ProtocolError",
    "allocation_problems",
    "assignment_problems",
    "container_units",
    "contract_from",
    "demand_of",
    "gpu_containers",
    "int_annotation",
    "intent_for",
    "intent_mismatch",
    "is_reserved_annotation",
    "parse_allocation",
    "parse_assigned",
    "parse_assignment",
    "parse_intent",
    "parse_units",
    "pod_ref",
    "read_annotations",
]
