"""The rules of a pod's CREATE: no reserved annotation, a genuine intent that matches the spec, sizes that fit a
GPU, and no reserved variable set other than the webhook sets it (pure)."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from contract import (
    COMPAT_KEYS,
    RESERVED_ENV,
    Contract,
    Demand,
    Intent,
    ProtocolError,
    demand_of,
    intent_mismatch,
    parse_intent,
    read_annotations,
    signing,
)
from contract.env import expected_env, normal_env
from webhook.rules.booking import booking_problems
from webhook.rules.envrules import container_problems, slots
from webhook.rules.problems import Pod, Policy, Problem, tagged


def create_problems(pod: Pod, namespace: str, policy: Policy, public_key: Ed25519PublicKey, *,
                    genuine: bool = False) -> list[Problem]:
    """Every problem of the pod's CREATE; `genuine`: its intent and signature are the ones this webhook has just
    stamped or recognised (webhook/rules/admit.py), so the signature is not verified again."""
    contract = policy.contract
    annotations = read_annotations(pod)
    problems = tagged("reserved_annotation", (
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
    intent = _created_intent(pod, namespace, demand, contract, None if genuine else public_key, problems=problems)
    problems.extend(tagged("container_env", container_problems(list(slots(pod)), contract,
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
        problems.extend(tagged("unbookable", booking_problems(demand, contract)))
    problems.extend(tagged("container_env", _env_problems(pod, contract, intent.total if intent else demand.total,
                                                           demand)))
    return problems


def _created_intent(
    pod: Pod, namespace: str, demand: Demand | None, contract: Contract, public_key: Ed25519PublicKey | None,
    *, problems: list[Problem],
) -> Intent | None:
    """The intent stamped by the mutating webhook, appending a problem when it is absent or not genuine (`public_key`
    None: known genuine, not verified)."""
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
    if public_key is not None and not signing.verify(public_key, text, namespace, signature):
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
                {e["name"]: normal_env(e) for e in expected_env(units, total)} if contract.delivery == "env" else {}
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
                if normal_env(entry) == wanted.get(name):
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
