"""What the device plugin's identity may change: its own annotations, of pods bound to its own node (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from contract import ASSIGNED, COMPAT_KEYS, Contract

Pod = Mapping[str, Any]

# Every node's plugin shares one ServiceAccount, so a token alone does not say whose node it is; the parts of a pod
# that decide what runs and under whom (spec, labels that select it into Services and policies, finalizers and
# owners that steer its deletion) are compared whole. managedFields and resourceVersion change on every write.
_FIELDS: Final = (("spec",), ("metadata", "labels"), ("metadata", "finalizers"), ("metadata", "ownerReferences"))
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _step(path: str, key: str) -> str:
    return f"{path}.{key}" if _NAME.fullmatch(key) else f"{path}[{key!r}]"


def first_difference(old: object, new: object, path: str) -> str | None:
    """The path of the first field where `new` differs from `old` (keys in the old object's order), or None."""
    if old == new:
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        for key in (*old, *(k for k in new if k not in old)):
            found = first_difference(old.get(key), new.get(key), _step(path, str(key)))
            if found:
                return found
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
    return path


def _part(pod: Pod, names: tuple[str, ...]) -> object:
    here: object = pod
    for name in names:
        here = here.get(name) if isinstance(here, Mapping) else None
    return here or None  # absent, null and empty are the same to the API server (omitempty)


def changed_field(old: Pod, new: Pod) -> str | None:
    """The first field outside the annotations that the update changes, as a path (spec.containers[0].image)."""
    for names in _FIELDS:
        found = first_difference(_part(old, names), _part(new, names), ".".join(names))
        if found:
            return found
    return None


def own_keys(contract: Contract) -> tuple[str, ...]:
    """What the plugin writes: ASSIGNED and the allocation record; placement keys are judged apart (validate.py)."""
    return ASSIGNED, contract.allocation_key


def plugin_problems(
    old: Pod, new: Pod, token_node: str | None, subresource: str, contract: Contract
) -> list[str]:
    """Why an UPDATE by the plugin identity oversteps its job, as sentences without the pod's name.

    `token_node` is the node its token is bound to (None where the token names none: the node cannot be checked).
    Reserved keys are left to the annotation rules, which judge them for every identity.
    """
    if subresource:
        return [
            f"the gpushare device plugin's identity updated pods/{subresource}, which it never needs: it only "
            "records allocations in the pod's own annotations, through a pods patch; nothing may write a pod's "
            "subresources with its token"
        ]
    problems: list[str] = []
    before = (old.get("metadata") or {}).get("annotations") or {}
    after = (new.get("metadata") or {}).get("annotations") or {}
    reserved = {*COMPAT_KEYS, contract.intent_key, contract.signature_key, contract.allocation_key}
    keys = [k for k in (*before, *(k for k in after if k not in before)) if before.get(k) != after.get(k)]
    field = changed_field(old, new)
    bound_to = (old.get("spec") or {}).get("nodeName") or ""
    if token_node is not None and bound_to != token_node:
        what = field or (keys[0] if keys else "")
        did = f"changed {what} of" if what else "wrote to"
        where = f"bound to node {bound_to}" if bound_to else "not bound to any node"
        problems.append(
            f"the gpushare device plugin of node {token_node} {did} a pod {where}; a plugin may write only to "
            "pods bound to its own node (the node its ServiceAccount token is bound to)"
        )
    rule = (
        f"the plugin identity may change only its own annotations ({', '.join(own_keys(contract))}, and the "
        "placement keys where the pod has none)"
    )
    if field:
        problems.append(f"the gpushare device plugin changed {field}, but {rule}; leave {field} as it was")
    for key in keys:
        if key not in reserved:
            verb = "added" if key not in before else "removed" if key not in after else "changed"
            problems.append(f"the gpushare device plugin {verb} annotation {key}, but {rule}; leave it as it was")
    return problems
