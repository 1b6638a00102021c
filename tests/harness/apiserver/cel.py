"""Webhook `matchConditions` evaluated with cel-python, with the variables kube-apiserver declares.

Gaps of cel-python 0.5 against the Kubernetes CEL environment (found by tests/sim/test_admission_cel.py):
optional syntax (`a.?b`, `orValue`), the string extension library (`lowerAscii`, `split`, `replace`, ...),
the Kubernetes libraries (`quantity`, `isSorted`, `url`, `authorizer`) are missing; `has()`, `in`,
`exists`, `all`, `exists_one`, `map`, `filter`, `size`, `startsWith`, `endsWith`, `contains` and
`matches` work. The `authorizer` variable is not provided. Expressions are not type-checked at
configuration time as the real server does; a type error surfaces at evaluation instead.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import celpy
from celpy.celtypes import BoolType
from celpy.evaluation import CELEvalError

_ENV = celpy.Environment()


class ConditionError(Exception):
    """A match condition that does not compile or does not evaluate to a bool; failurePolicy decides."""


@dataclass(frozen=True)
class Verdict:
    matches: bool
    error: str | None = None


@functools.lru_cache(maxsize=512)
def _program(expression: str) -> Any:
    try:
        return _ENV.program(_ENV.compile(expression))
    except Exception as exc:  # celpy raises its own parse error types and occasionally plain ones
        raise ConditionError(f"expression {expression!r} does not compile: {str(exc).strip()}") from exc


def evaluate(expression: str, variables: Mapping[str, Any]) -> bool:
    """One expression over plain JSON variables; raises ConditionError unless it yields a bool."""
    program = _program(expression)
    activation = {name: celpy.adapter.json_to_cel(value) for name, value in variables.items()}
    try:
        result = program.evaluate(activation)
    except Exception as exc:
        reason = exc.args[0] if exc.args else exc
        raise ConditionError(f"expression {expression!r} failed to evaluate: {reason}") from exc
    if isinstance(result, CELEvalError):
        reason = result.args[0] if result.args else result
        raise ConditionError(f"expression {expression!r} failed to evaluate: {reason}")
    if not isinstance(result, bool | BoolType):
        raise ConditionError(f"expression {expression!r} returned {type(result).__name__}, not a bool")
    return bool(result)


def match_conditions(conditions: Sequence[Mapping[str, Any]], variables: Mapping[str, Any]) -> Verdict:
    """kube-apiserver's rule: any condition false -> skip the webhook; else any error -> failurePolicy."""
    errors: list[str] = []
    for condition in conditions:
        name = str(condition.get("name", ""))
        try:
            if not evaluate(str(condition.get("expression", "")), variables):
                return Verdict(False)
        except ConditionError as exc:
            errors.append(f"match condition {name!r}: {exc}")
    if errors:
        return Verdict(False, "; ".join(errors))
    return Verdict(True)
