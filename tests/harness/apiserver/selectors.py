"""Label selectors (string and LabelSelector forms) and the field selectors the test API server supports."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tests.harness.apiserver.status import bad_request

Labels = Mapping[str, str]
Matcher = Callable[[Labels], bool]

_SET_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ_RE = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside `in (...)` value lists."""
    terms, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current)
    return terms


def _term(text: str) -> Matcher:
    eq = _EQ_RE.match(text)
    if eq:
        key, op, value = eq.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    match = _SET_RE.match(text)
    if not match:
        raise bad_request(f"unable to parse requirement: {text.strip()!r} is not a valid label selector term")
    negate, key, op, values = match.groups()
    if op:
        if negate:
            raise bad_request(f"unable to parse requirement: {text.strip()!r} mixes '!' with a set operator")
        allowed = {v.strip() for v in values.split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in allowed
        return lambda labels: labels.get(key) not in allowed
    if negate:
        return lambda labels: key not in labels
    return lambda labels: key in labels


def parse_label_selector(text: str | None) -> Matcher:
    """A matcher for `a=b,c!=d,e in (x,y),!f`; an empty selector matches everything."""
    if not text or not text.strip():
        return lambda labels: True
    terms = [_term(t) for t in _split_terms(text)]
    return lambda labels: all(term(labels) for term in terms)


def selector_matches(selector: Mapping[str, Any] | None, labels: Labels) -> bool:
    """A metav1.LabelSelector (matchLabels, matchExpressions); None or {} matches everything."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), set(expr.get("values") or [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise bad_request(f"label selector operator {op!r} is not valid; use In, NotIn, Exists or DoesNotExist")
    return True


# Field paths the real server indexes for pods, plus metadata fields every kind supports.
_FIELDS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "metadata.name": lambda o: str((o.get("metadata") or {}).get("name", "")),
    "metadata.namespace": lambda o: str((o.get("metadata") or {}).get("namespace", "")),
    "spec.nodeName": lambda o: str((o.get("spec") or {}).get("nodeName", "") or ""),
    "spec.schedulerName": lambda o: str((o.get("spec") or {}).get("schedulerName", "") or ""),
    "status.phase": lambda o: str((o.get("status") or {}).get("phase", "") or ""),
    "involvedObject.name": lambda o: str((o.get("involvedObject") or {}).get("name", "")),
    "involvedObject.uid": lambda o: str((o.get("involvedObject") or {}).get("uid", "")),
    "regarding.name": lambda o: str((o.get("regarding") or {}).get("name", "")),
    "type": lambda o: str(o.get("type", "")),
    "reason": lambda o: str(o.get("reason", "")),
}

ObjMatcher = Callable[[Mapping[str, Any]], bool]


def _field_check(getter: Callable[[Mapping[str, Any]], str], value: str, negate: bool) -> ObjMatcher:
    return lambda obj: (getter(obj) == value) != negate


def parse_field_selector(text: str | None) -> ObjMatcher:
    """A matcher for `spec.nodeName=n1,metadata.name!=x`; unknown fields are a 400 like the real server."""
    if not text or not text.strip():
        return lambda obj: True
    checks: list[ObjMatcher] = []
    for raw in text.split(","):
        eq = _EQ_RE.match(raw)
        if not eq:
            raise bad_request(f"invalid field selector term {raw.strip()!r}; write field=value or field!=value")
        field, op, value = eq.groups()
        getter = _FIELDS.get(field)
        if getter is None:
            raise bad_request(
                f'field label not supported: "{field}"; the test API server supports {", ".join(sorted(_FIELDS))}'
            )
        checks.append(_field_check(getter, value, negate=op == "!="))
    return lambda obj: all(check(obj) for check in checks)
