"""(operation, old pod, new pod, user) -> verdict: the lifecycle rules of the annotation contract (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from contract import (
    ASSIGNED,
    ASSUME_TIME,
    COMPAT_KEYS,
    PLACEMENT_KEYS,
    RESERVED_ENV,
    Assignment,
    Contract,
    Demand,
    Intent,
    ProtocolError,
    allocation_problems,
    assignment_problems,
    demand_of,
    intent_mismatch,
    parse_allocation,
    parse_assignment,
    parse_intent,
    read_annotations,
    signing,
)
from contract.env import expected_env
from webhook.binding import binding_problems
from webhook.booking import booking_problems
from webhook.envrules import container_problems, new_ephemeral, slots
from webhook.identity import plugin_problems

Pod = Mapping[str, Any]


class Policy(Protocol):
    """What the rules need from the settings (webhook.settings.Settings satisfies it)."""

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


# What a denial is counted under (webhook/metrics.py): a small, fixed set, each problem tagged with one.
REASONS = (
    "reserved_annotation", "no_intent", "forged_intent", "intent_changed", "not_authorized", "placement_frozen",
    "bad_assignment", "container_env", "too_large", "unbookable", "bad_spec",
)


class Problem(str):
    """One denial sentence, tagged with its reason (one of REASONS)."""

    reason: str

    def __new__(cls, text: str, reason: str) -> Problem:
        problem = super().__new__(cls, text)
        problem.reason = reason
        return problem


def _tagged(reason: str, problems: Iterable[str]) -> list[str]:
    return [Problem(p, reason) for p in problems]


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    reasons: tuple[str, ...] = ()  # of a denial, each once, in REASONS order


ALLOWED = Verdict(True)


def validate(  # noqa: PLR0917 - the call shape of the shared contract: (operation, old, new, user, ns, ...)
    operation: str, old: Pod | None, new: Pod, username: str, namespace: str, policy: Policy,
    public_key: Ed25519PublicKey, *, token_node: str | None = None, subresource: str = "",
) -> Verdict:
    """Allow, or deny with whole sentences that name the pod, each offending key and the fix.

    `token_node`: the node the caller's token is bound to (userInfo.extra), None where it names none.
    """
    if operation == "CREATE":
        problems = _create_problems(new, namespace, policy, public_key)
    elif operation == "UPDATE" and old is not None:
        problems = _update_problems(old, new, username, policy, token_node, subresource)
    else:
        return ALLOWED
    return _verdict(problems, _ref(new, namespace))


def validate_binding(binding: Pod, username: str, namespace: str, policy: Policy) -> Verdict:
    """A pods/binding CREATE: allow, or deny naming each reserved annotation the Binding may not carry."""
    problems = _tagged("not_authorized", binding_problems(binding, username, policy.extender_identities,
                                                          policy.contract))
    return _verdict(problems, _ref(binding, namespace))


def _verdict(problems: list[str], pod: str) -> Verdict:
    if not problems:
        return ALLOWED
    sentences = " ".join(_sentence(p) for p in problems)
    found = {getattr(p, "reason", "bad_spec") for p in problems}
    reasons = tuple(r for r in REASONS if r in found)
    return Verdict(False, f"gpushare denied pod {pod}. {sentences}", reasons)


def _sentence(problem: str) -> str:
    text = problem[0].upper() + problem[1:]
    return text if text.endswith(".") else text + "."


def _ref(pod: Pod, namespace: str) -> str:
    meta = pod.get("metadata") or {}
    name = meta.get("name") or f"{meta.get('generateName') or ''}<generated>"
    return f"{namespace}/{name}"


def _verb(key: str, old: Mapping[str, str], new: Mapping[str, str]) -> str:
    return "added" if key not in old else "removed" if key not in new else "changed"


# ---------------------------------------------------------------------------------------------------------
# CREATE


def _create_problems(pod: Pod, namespace: str, policy: Policy, public_key: Ed25519PublicKey) -> list[str]:
    contract = policy.contract
    annotations = read_annotations(pod)
    problems = _tagged("reserved_annotation", (
        f"annotation {key} is reserved: the scheduler extender or the gpushare device plugin writes it after "
        "scheduling; remove it from the pod (or its template)"
        for key in (*COMPAT_KEYS, contract.allocation_key)
        if key in annotations
    ))
    try:
        demand: Demand | None = demand_of(pod, contract.resource)
    except ProtocolError as exc:
        problems.append(Problem(str(exc), "bad_spec"))
        demand = None
    intent = _created_intent(pod, namespace, demand, contract, public_key, problems=problems)
    problems.extend(_tagged("container_env", container_problems(list(slots(pod)), contract,
                                                                policy.other_gpu_resources)))
    if demand is None or not demand.wants_gpu:
        return problems
    for name, units in (*demand.containers, *((i.name, i.units) for i in demand.init_containers)):
        if units > policy.max_gpu_units:
            problems.append(Problem(
                f"container {name!r} asks for {units} {contract.unit} of {contract.resource}, more than the largest "
                f"GPU holds ({policy.max_gpu_units} {contract.unit}, GPUSHARE_MAX_GPU_UNITS), so it could never be "
                "placed; lower its limit", "too_large",
            ))
    if contract.placement == "extender":
        problems.extend(_tagged("unbookable", booking_problems(demand, contract)))
    problems.extend(_tagged("container_env", _env_problems(pod, contract, intent.total if intent else demand.total,
                                                           demand)))
    return problems


def _created_intent(
    pod: Pod, namespace: str, demand: Demand | None, contract: Contract, public_key: Ed25519PublicKey,
    *, problems: list[str],
) -> Intent | None:
    """The intent stamped by the mutating webhook, appending a problem when it is absent or not genuine."""
    annotations = read_annotations(pod)
    intent_key, signature_key = contract.intent_key, contract.signature_key
    text, signature = annotations.get(intent_key), annotations.get(signature_key)
    fix = f"remove {intent_key} and {signature_key} and create the pod again so the gpushare webhook stamps it"
    if text is None and signature is None:
        if demand is not None and demand.wants_gpu:
            problems.append(Problem(
                f"the pod requests {demand.total} {contract.unit} of {contract.resource} but has no {intent_key} "
                "annotation, so the gpushare mutating webhook did not reach it; check that the "
                "MutatingWebhookConfiguration gpushare-webhook exists and selects this namespace, then create "
                "the pod again", "no_intent",
            ))
        return None
    if demand is not None and not demand.wants_gpu:
        problems.append(Problem(
            f"annotations {intent_key} and {signature_key} are written by the gpushare mutating webhook for pods "
            f"that request {contract.resource}, and this pod requests none; remove them", "forged_intent",
        ))
        return None
    if text is None or signature is None:
        present, missing = (intent_key, signature_key) if signature is None else (signature_key, intent_key)
        problems.append(Problem(f"annotation {present} is present without {missing}; {fix}", "forged_intent"))
        return None
    if not signing.verify(public_key, text, namespace, signature):
        problems.append(Problem(
            f"annotation {signature_key} does not verify for namespace {namespace}: this intent was not stamped "
            f"by the gpushare webhook for this pod (copied from another pod or edited); {fix}", "forged_intent",
        ))
        return None
    try:
        intent = parse_intent(text, intent_key)
    except ProtocolError as exc:
        problems.append(Problem(f"{exc}; {fix}", "forged_intent"))
        return None
    mismatch = intent_mismatch(intent, pod, contract, demand) if demand is not None else None
    if mismatch:
        problems.append(Problem(f"annotation {intent_key} does not match the pod spec: {mismatch}; {fix}",
                                "forged_intent"))
    return intent


def _normal_env(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An env definition as the API server stores it: empty value dropped, fieldRef apiVersion defaulted."""
    out = {k: v for k, v in entry.items() if not (k == "value" and v in ("", None))}
    value_from = out.get("valueFrom")
    if isinstance(value_from, dict) and isinstance(value_from.get("fieldRef"), dict):
        field_ref = {"apiVersion": "v1", **value_from["fieldRef"]}
        out["valueFrom"] = {**value_from, "fieldRef": field_ref}
    return out


def _env_problems(pod: Pod, contract: Contract, total: int, demand: Demand) -> list[str]:
    """The reserved variables each GPU-share container sets other than the webhook does; the units of each
    container come from `demand`, the pod's limits parsed once (same spec order)."""
    problems: list[str] = []
    spec = pod.get("spec") or {}
    units_by_kind = {"initContainers": [i.units for i in demand.init_containers],
                     "containers": [u for _, u in demand.containers]}
    for kind in ("initContainers", "containers"):
        for container, units in zip(spec.get(kind) or [], units_by_kind[kind], strict=True):
            if not units:
                continue
            wanted = (
                {e["name"]: _normal_env(e) for e in expected_env(units, total)} if contract.delivery == "env" else {}
            )
            entries = [e for e in container.get("env") or [] if isinstance(e, dict)]
            seen: set[str] = set()
            for entry in entries:
                name = entry.get("name")
                if name not in RESERVED_ENV or name in seen:
                    continue
                seen.add(name)
                count = sum(1 for e in entries if e.get("name") == name)
                if count > 1:
                    problems.append(
                        f"container {container.get('name')!r} defines {name} {count} times; keep at most one entry"
                    )
                    continue
                if _normal_env(entry) == wanted.get(name):
                    continue
                how = (
                    "the gpushare webhook defines it from the scheduler's GPU choice (env delivery)"
                    if contract.delivery == "env"
                    else "the GPU and its variables come from the CDI device (cdi delivery)"
                )
                problems.append(
                    f"container {container.get('name')!r} sets {name} itself, but {how}; remove the {name} entry "
                    "from the container's env"
                )
    return problems


# ---------------------------------------------------------------------------------------------------------
# UPDATE


def _update_problems(  # noqa: PLR0917 - the request's parts, in the order validate() receives them
    old: Pod, new: Pod, username: str, policy: Policy, token_node: str | None, subresource: str
) -> list[str]:
    contract = policy.contract
    before, after = read_annotations(old), read_annotations(new)
    # pods/ephemeralcontainers adds containers to a running pod; the others cannot change (spec is immutable).
    problems = _tagged("container_env", container_problems(new_ephemeral(old, new), contract,
                                                           policy.other_gpu_resources))
    if username in policy.plugin_identities:
        problems += _tagged("not_authorized", plugin_problems(old, new, token_node, subresource, contract))
    problems += _tagged("intent_changed", (
        f"annotation {key} was {_verb(key, before, after)}, but it is stamped once at creation by the gpushare "
        "mutating webhook and never changes; restore its original value"
        for key in (contract.intent_key, contract.signature_key)
        if before.get(key) != after.get(key)
    ))
    changed = [k for k in (*COMPAT_KEYS, contract.allocation_key) if before.get(k) != after.get(k)]
    if not changed:
        return problems
    if username not in (*policy.extender_identities, *policy.plugin_identities):
        trusted = ", ".join((*policy.extender_identities, *policy.plugin_identities)) or "none configured"
        problems.extend(_tagged("not_authorized", (
            f"annotation {key} was {_verb(key, before, after)} by {username or 'an anonymous user'}, but only the "
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
    problems.extend(_tagged("placement_frozen", _placement_problems(old, before, after, username, policy)))

    intent = _stored_intent(after, contract)
    if intent is not None and assignment is not None:
        problems.extend(_tagged("bad_assignment", assignment_problems(intent, assignment)))
    allocation_text = after.get(contract.allocation_key)
    if allocation_text is not None:
        try:
            allocation = parse_allocation(allocation_text, contract.allocation_key)
        except ProtocolError as exc:
            problems.append(Problem(str(exc), "bad_assignment"))
        else:
            if intent is not None and assignment is not None:
                node_name = (new.get("spec") or {}).get("nodeName") or None
                problems.extend(_tagged("bad_assignment", (
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
            f"annotation {key} was {_verb(key, before, after)} by the gpushare device plugin, which may only add a "
            "placement the pod lacks (node-local placement); leave the scheduler extender's placement as it was"
            for key in moved
        ]
    return [
        f"annotation {key} was {_verb(key, before, after)} after the pod was bound to a node or allocated; kubelet "
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
