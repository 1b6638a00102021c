"""The rules of a pod's UPDATE: the intent never changes, only the extender and the device plugin write the
placement and allocation keys, consistently with the intent, and a bound pod's placement is frozen (pure)."""

from __future__ import annotations

from collections.abc import Mapping

from contract import (
    ASSIGNED,
    ASSUME_TIME,
    COMPAT_KEYS,
    PLACEMENT_KEYS,
    Assignment,
    Contract,
    Intent,
    ProtocolError,
    allocation_problems,
    assignment_problems,
    parse_allocation,
    parse_assignment,
    parse_intent,
    read_annotations,
)
from webhook.rules.envrules import container_problems, new_ephemeral
from webhook.rules.identity import plugin_problems
from webhook.rules.problems import Pod, Policy, Problem, tagged, verb


def update_problems(  # noqa: PLR0917 - the request's parts, in the order validate() receives them
    old: Pod, new: Pod, username: str, policy: Policy, token_node: str | None, subresource: str
) -> list[Problem]:
    contract = policy.contract
    before, after = read_annotations(old), read_annotations(new)
    # pods/ephemeralcontainers adds containers to a running pod; the others cannot change (spec is immutable).
    problems = tagged("container_env", container_problems(new_ephemeral(old, new), contract,
                                                           policy.other_gpu_resources))
    if username in policy.plugin_identities:
        problems += tagged("not_authorized", plugin_problems(old, new, token_node, subresource, contract))
    problems += tagged("intent_changed", (
        f"annotation {key} was {verb(key, before, after)}, but it is stamped once at creation by the gpushare "
        "mutating webhook and never changes; restore its original value"
        for key in (contract.intent_key, contract.signature_key)
        if before.get(key) != after.get(key)
    ))
    changed = [k for k in (*COMPAT_KEYS, contract.allocation_key) if before.get(k) != after.get(k)]
    if not changed:
        return problems
    if username not in (*policy.extender_identities, *policy.plugin_identities):
        trusted = ", ".join((*policy.extender_identities, *policy.plugin_identities)) or "none configured"
        problems.extend(tagged("not_authorized", (
            f"annotation {key} was {verb(key, before, after)} by {username or 'an anonymous user'}, but only the "
            f"scheduler extender and the gpushare device plugin ({trusted}) may write it; leave it alone, or list "
            "your extender's account in GPUSHARE_EXTENDER_IDENTITIES"
            for key in changed
        )))
        return problems

    try:
        assignment: Assignment | None = parse_assignment(after)
    except ProtocolError as exc:
        problems.append(Problem(str(exc), "bad_assignment"))
        assignment = None
    if before.get(ASSIGNED) == "true" and after.get(ASSIGNED) != "true":
        problems.append(Problem(
            f'annotation {ASSIGNED} went from "true" to {after.get(ASSIGNED)!r}; once the device plugin has '
            'allocated the pod it stays "true"; leave it', "bad_assignment",
        ))
    problems.extend(tagged("placement_frozen", _placement_problems(old, before, after, username, policy)))

    intent = _stored_intent(after, contract)
    if intent is not None and assignment is not None:
        problems.extend(tagged("bad_assignment", assignment_problems(intent, assignment)))
    allocation_text = after.get(contract.allocation_key)
    if allocation_text is not None:
        try:
            allocation = parse_allocation(allocation_text, contract.allocation_key)
        except ProtocolError as exc:
            problems.append(Problem(str(exc), "bad_assignment"))
        else:
            if intent is not None and assignment is not None:
                node_name = (new.get("spec") or {}).get("nodeName") or None
                problems.extend(tagged("bad_assignment", (
                    f"annotation {contract.allocation_key} is inconsistent: {p}; it is written by the gpushare "
                    "device plugin and must describe this pod's own allocation"
                    for p in allocation_problems(intent, assignment, allocation, node_name)
                )))
    return problems


def _placement_problems(
    old: Pod, before: Mapping[str, str], after: Mapping[str, str], username: str, policy: Policy
) -> list[str]:
    plugin = username in policy.plugin_identities
    # The plugin never moves a placement, bound or not: it only adds one where none was (node-local placement).
    moved = [k for k in (*PLACEMENT_KEYS, ASSUME_TIME) if before.get(k) != after.get(k)
             and (plugin or k in PLACEMENT_KEYS)]
    bound = bool((old.get("spec") or {}).get("nodeName")) or before.get(ASSIGNED) == "true"
    if not moved or not (bound or plugin):
        return []
    # Node-local placement (cdi mode): the plugin picks the GPU after binding, adding the keys where none were.
    if plugin and not any(k in before for k in PLACEMENT_KEYS):
        return []
    if not bound:
        return [
            f"annotation {key} was {verb(key, before, after)} by the gpushare device plugin, which may only add a "
            "placement the pod lacks (node-local placement); leave the scheduler extender's placement as it was"
            for key in moved
        ]
    return [
        f"annotation {key} was {verb(key, before, after)} after the pod was bound to a node or allocated; kubelet "
        "reads it into the containers' environment, so it cannot change any more; delete and recreate the pod to "
        "place it again"
        for key in moved
    ]


def _stored_intent(annotations: Mapping[str, str], contract: Contract) -> Intent | None:
    """The intent the pod was created with, if it has a readable one (it was verified at CREATE and is frozen)."""
    text = annotations.get(contract.intent_key)
    if text is None:
        return None
    try:
        return parse_intent(text, contract.intent_key)
    except ProtocolError:
        return None
