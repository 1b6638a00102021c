"""Pod -> JSONPatch: stamp the signed allocation intent and, in env delivery, the downward-API GPU env (pure)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract import (
    Contract,
    Demand,
    Intent,
    ProtocolError,
    container_units,
    demand_of,
    intent_for,
    intent_mismatch,
    parse_intent,
    pod_ref,
    read_annotations,
    signing,
)
from contract.env import expected_env
from webhook.rules.envrules import NEUTRAL_ENV, Slot, is_foreign_gpu, is_neutral, needs_void, new_ephemeral, slots

log = logging.getLogger(__name__)

Patch = list[dict[str, Any]]


class NoSigningKey(Exception):
    """A GPU-share pod needs the signing key (to stamp its intent, or to recognise an earlier stamp) and the webhook
    has none it can read; no other pod needs it."""


def _stamped_intent(
    annotations: Mapping[str, str], pod: Mapping[str, Any], namespace: str, contract: Contract,
    signer: Ed25519PrivateKey,
) -> tuple[Intent | None, bool]:
    """(intent, keep): the webhook's own earlier intent if one is present, and whether it still fits the spec.

    An intent whose signature verifies for this namespace was made by this webhook (a reinvocation). If it no
    longer matches the spec (another webhook changed the containers since) the pod is stamped again.
    """
    text = annotations.get(contract.intent_key)
    signature = annotations.get(contract.signature_key)
    if text is None or signature is None:
        return None, False
    if not signing.verify(signer.public_key(), text, namespace, signature):
        return None, False
    try:
        intent = parse_intent(text, contract.intent_key)
    except ProtocolError:
        return None, False
    return intent, intent_mismatch(intent, pod, contract) is None


def _pointer(key: str) -> str:
    """One JSON-pointer segment (RFC 6901): '~' and '/' escaped, as annotation keys contain '/'."""
    return key.replace("~", "~0").replace("/", "~1")


def _annotation_ops(pod: Mapping[str, Any], values: Mapping[str, str]) -> Patch:
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return [{"op": "add", "path": "/metadata", "value": {"annotations": dict(values)}}]
    if not isinstance(meta.get("annotations"), Mapping):
        return [{"op": "add", "path": "/metadata/annotations", "value": dict(values)}]
    # "add" on an existing member replaces it (RFC 6902 4.1): a re-stamp overwrites the webhook's own old intent.
    return [{"op": "add", "path": f"/metadata/annotations/{_pointer(k)}", "value": v} for k, v in values.items()]


def _env_ops(slot: Slot, entries: Sequence[Mapping[str, Any]]) -> Patch:
    if not entries:
        return []
    if not isinstance(slot.container.get("env"), list):
        return [{"op": "add", "path": f"{slot.path}/env", "value": [dict(e) for e in entries]}]
    return [{"op": "add", "path": f"{slot.path}/env/-", "value": dict(e)} for e in entries]


def _share_env(slot: Slot, units: int, total: int) -> list[dict[str, Any]]:
    # Never overwrite what the user wrote: the validating webhook denies a conflicting definition with a message,
    # which is better than silently replacing it.
    present = {entry.get("name") for entry in slot.container.get("env") or []}
    return [entry for entry in expected_env(units, total) if entry["name"] not in present]


def _slot_units(slot: Slot, demand: Demand) -> int:
    """The units of this container, read from the demand already parsed (same spec order, by position)."""
    if slot.kind == "initContainers":
        return demand.init_containers[slot.index].units
    return demand.containers[slot.index][1]


def _container_ops(pod: Mapping[str, Any], contract: Contract, intent: Intent | None,
                   other_gpu: Sequence[str], demand: Demand | None) -> Patch:
    """env delivery: the GPU env into GPU-share containers, NVIDIA_VISIBLE_DEVICES=void into every other one.

    `demand` is the pod's demand parsed once for the whole mutation; None when a limit is malformed, and then each
    container is read on its own (a malformed limit counts as GPU-share: the validator refuses it)."""
    ops: Patch = []
    for slot in slots(pod, ("initContainers", "containers")):
        if demand is not None:
            units = _slot_units(slot, demand)
            neutral = not units and not is_foreign_gpu(slot.container, other_gpu)
        else:
            neutral = is_neutral(slot.container, contract, other_gpu)
        if neutral:
            if needs_void(slot.container):
                ops.extend(_env_ops(slot, [NEUTRAL_ENV]))
            continue
        if demand is None:
            try:
                units = container_units(slot.container, contract.resource, "container")
            except ProtocolError:
                continue  # the validator refuses the malformed limit with a message
        if units and intent is not None:
            ops.extend(_env_ops(slot, _share_env(slot, units, intent.total)))
    return ops


def _intent_ops(
    pod: Mapping[str, Any], namespace: str, contract: Contract, signer: Ed25519PrivateKey | None,
    new_id: Callable[[], str], *, demand: Demand | None,
) -> tuple[Intent | None, Patch]:
    """The pod's intent (kept or fresh) and the ops that stamp it; (None, []) for a pod that is not GPU-share."""
    if demand is None or not demand.wants_gpu:
        return None, []
    if signer is None:
        raise NoSigningKey(pod_ref(pod))
    annotations = read_annotations(pod)
    previous, keep = _stamped_intent(annotations, pod, namespace, contract, signer)
    if previous is None and (contract.intent_key in annotations or contract.signature_key in annotations):
        # Not ours (edited, copied from another namespace, half present): leave it for the validator to deny.
        log.info("pod %s in %s carries an intent this webhook did not sign; not stamping", pod_ref(pod), namespace)
        return None, []
    if previous is not None and keep:
        return previous, []
    # A fresh id also when re-stamping: a genuine intent copied from another pod must not lend it its id.
    intent = intent_for(demand, contract, new_id())
    text = intent.to_json()
    stamp = {contract.intent_key: text, contract.signature_key: signing.sign(signer, text, namespace)}
    return intent, _annotation_ops(pod, stamp)


def mutate(
    pod: Mapping[str, Any], namespace: str, contract: Contract, signer: Ed25519PrivateKey | None,
    new_id: Callable[[], str], *, other_gpu: Sequence[str] = (),
) -> Patch:
    """The JSONPatch of a pod CREATE: stamp a GPU-share pod; in env delivery also neutralise every other container.

    `signer` None: the signing key cannot be read now; a pod that is not GPU-share is mutated all the same (it needs
    no signature), a GPU-share pod raises NoSigningKey. `other_gpu` names other device plugins' GPU resources (whole
    GPUs): their containers are left alone.
    """
    return mutate_stamped(pod, namespace, contract, signer, new_id, other_gpu=other_gpu)[0]


def mutate_stamped(
    pod: Mapping[str, Any], namespace: str, contract: Contract, signer: Ed25519PrivateKey | None,
    new_id: Callable[[], str], *, other_gpu: Sequence[str] = (),
) -> tuple[Patch, Intent | None]:
    """mutate's patch, and the intent the patched pod carries where it is this webhook's: stamped now, or an earlier
    stamp of its own whose signature verified and that still fits the spec (a reinvocation); None otherwise."""
    try:
        demand: Demand | None = demand_of(pod, contract.resource)  # parsed once, for both halves below
    except ProtocolError as exc:
        log.info("pod %s has a malformed %s limit, left to the validator: %s", pod_ref(pod), contract.resource, exc)
        demand = None
    intent, ops = _intent_ops(pod, namespace, contract, signer, new_id, demand=demand)
    if contract.delivery == "env":
        ops.extend(_container_ops(pod, contract, intent, other_gpu, demand))
    return ops, intent


def mutate_update(old: Mapping[str, Any], new: Mapping[str, Any], contract: Contract) -> Patch:
    """The JSONPatch of an UPDATE (pods/ephemeralcontainers): neutralise each ephemeral container it adds.

    Ephemeral containers can have no resources, so none is a GPU-share container; an added one cannot be
    changed later (pkg/apis/core/validation ValidatePodEphemeralContainersUpdate), so it is neutralised now.
    """
    if contract.delivery != "env":
        return []
    ops: Patch = []
    for slot in new_ephemeral(old, new):
        if needs_void(slot.container):
            ops.extend(_env_ops(slot, [NEUTRAL_ENV]))
    return ops
