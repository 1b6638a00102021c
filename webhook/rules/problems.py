"""What the admission rules share: the pod and policy types, and a problem tagged with the reason it is counted
under (webhook/server/metrics.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from contract import Contract

Pod = Mapping[str, Any]


class Policy(Protocol):
    """What the rules need from the settings (webhook.server.settings.Settings satisfies it)."""

    @property
    def contract(self) -> Contract: ...

    @property
    def extender_identities(self) -> tuple[str, ...]: ...

    @property
    def plugin_identities(self) -> tuple[str, ...]: ...

    @property
    def max_gpu_units(self) -> int: ...

    @property
    def other_gpu_resources(self) -> tuple[str, ...]: ...


# What a denial is counted under (webhook/server/metrics.py): a small, fixed set, each problem tagged with one.
REASONS = (
    "reserved_annotation", "no_intent", "forged_intent", "intent_changed", "not_authorized", "placement_frozen",
    "bad_assignment", "container_env", "too_large", "unbookable", "bad_spec",
)


@dataclass(frozen=True)
class Problem:
    """One denial sentence and the reason it is counted under (one of REASONS)."""

    text: str
    reason: str


def tagged(reason: str, problems: Iterable[str]) -> list[Problem]:
    return [Problem(p, reason) for p in problems]


def verb(key: str, old: Mapping[str, str], new: Mapping[str, str]) -> str:
    return "added" if key not in old else "removed" if key not in new else "changed"
