"""Pod -> JSONPatch: stamp the signed allocation intent and, in env delivery, the downward-API GPU env (pure)."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from typing import Any

import jsonpatch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from webhook import signing
from webhook.protocol import (
    DEV,
    ENV_CONTAINER,
    ENV_DEV,
    ENV_IDX,
    ENV_POD,
    ENV_VISIBLE,
    IDX,
    Contract,
    Intent,
    ProtocolError,
    container_units,
    demand_of,
    intent_for,
    intent_mismatch,
    parse_intent,
    pod_ref,
    read_annotations,
)

log = logging.getLogger(__name__)

Patch = list[dict[str, Any]]


def _annotation_ref(key: str) -> dict[str, Any]:
    # apiVersion "v1" is what the API server defaults a fieldRef to; writing it keeps the stored pod
    # equal to expected_env, so the validator and the device plugin can compare definitions exactly.
    return {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{key}']"}}}


def expected_env(container_units: int, intent_total: int) -> list[dict[str, Any]]:
    """The env entries a GPU-share container gets in `env` delivery mode, in injection order.

    NVIDIA_VISIBLE_DEVICES and the index/device variables come from the pod's own annotations through the
    downward API, which kubelet resolves at each container creation (after the extender wrote them).
    """
    return [
        {"name": ENV_VISIBLE, **_annotation_ref(IDX)},
        {"name": ENV_IDX, **_annotation_ref(IDX)},
        {"name": ENV_DEV, **_annotation_ref(DEV)},
        {"name": ENV_CONTAINER, "value": str(container_units)},
        {"name": ENV_POD, "value": str(intent_total)},
    ]


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


def _inject_env(container: dict[str, Any], units: int, total: int) -> None:
    env = container.get("env")
    if not isinstance(env, list):
        env = container["env"] = []
    present = {entry.get("name") for entry in env if isinstance(entry, dict)}
    for entry in expected_env(units, total):
        # Never overwrite what the user wrote: the validating webhook denies a conflicting definition
        # with a message, which is better than silently replacing it.
        if entry["name"] not in present:
            env.append(entry)


def mutate(
    pod: Mapping[str, Any], namespace: str, contract: Contract, signer: Ed25519PrivateKey, new_id: Callable[[], str]
) -> Patch:
    """The JSONPatch that stamps a GPU-share pod; [] for other pods and for pods already stamped."""
    try:
        demand = demand_of(pod, contract.resource)
    except ProtocolError as exc:
        log.info("pod %s has a malformed %s limit, left to the validator: %s", pod_ref(pod), contract.resource, exc)
        return []
    if not demand.wants_gpu:
        return []
    annotations = read_annotations(pod)
    previous, keep = _stamped_intent(annotations, pod, namespace, contract, signer)
    if previous is None and (contract.intent_key in annotations or contract.signature_key in annotations):
        # Not ours (edited, copied from another namespace, half present): leave it for the validator to deny.
        log.info("pod %s in %s carries an intent this webhook did not sign; not stamping", pod_ref(pod), namespace)
        return []

    edited = copy.deepcopy(dict(pod))
    if previous is not None and keep:
        intent = previous
    else:
        # A fresh id also when re-stamping: a genuine intent copied from another pod must not lend it its id.
        intent = intent_for(demand, contract, new_id())
        text = intent.to_json()
        meta = edited.setdefault("metadata", {})
        if not isinstance(meta.get("annotations"), dict):
            meta["annotations"] = {}
        meta["annotations"][contract.intent_key] = text
        meta["annotations"][contract.signature_key] = signing.sign(signer, text, namespace)

    if contract.delivery == "env":
        spec = edited.get("spec") or {}
        for kind in ("initContainers", "containers"):
            for container in spec.get(kind) or []:
                units = container_units(container, contract.resource, "container")
                if units:
                    _inject_env(container, units, intent.total)

    ops: Patch = jsonpatch.make_patch(dict(pod), edited).patch
    return ops
