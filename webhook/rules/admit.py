"""A GPU-share pod's CREATE in one webhook call: the patch the mutating entry answers, and the verdict of the CREATE
rules on the pod that patch makes (pure).

The API server sends a GPU-share pod's CREATE to mutate.gpushare.io only (manifests/base/admission.yaml): judging it
there saves the second HTTPS call validate.gpushare.io used to take. What could still change the pod afterwards is a
later mutating admission plugin; the ValidatingAdmissionPolicy gpushare-gpu-share-pods (policy.yaml) checks after
every mutation what CEL can (the stamp present, the GPU-selecting variable as the webhook wrote it), and the device
plugin verifies the signature and that the intent describes the spec before it gives a container any GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from contract import Contract, is_reserved_annotation, pod_ref, read_annotations
from webhook.rules.mutate import NoSigningKey, Patch, mutate_stamped
from webhook.rules.problems import Policy
from webhook.rules.validate import Verdict, create_verdict


def is_gpu_share(pod: Mapping[str, Any], policy: Policy) -> bool:
    """The matchCondition gpushare-pods-only of the fail-closed entries, at a CREATE: a container or init container
    names the shared resource in its limits (any value), or the pod carries a reserved annotation."""
    spec = pod.get("spec") or {}
    resource = policy.contract.resource
    for kind in ("containers", "initContainers"):
        for container in spec.get(kind) or []:
            limits = (container.get("resources") or {}).get("limits") if isinstance(container, Mapping) else None
            if isinstance(limits, Mapping) and resource in limits:
                return True
    return any(is_reserved_annotation(key, policy.contract) for key in read_annotations(pod))


def carries_stamp(pod: Mapping[str, Any], contract: Contract) -> bool:
    """The pod carries an intent or a signature: judging it at a CREATE needs the signing key."""
    annotations = read_annotations(pod)
    return contract.intent_key in annotations or contract.signature_key in annotations


def patched(pod: Mapping[str, Any], patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The pod as the API server makes it from `patch`: a copy, with each "add" of mutate's ops applied (RFC 6902
    4.1: a member is set, and "-" appends to an array)."""
    doc: dict[str, Any] = orjson.loads(orjson.dumps(pod))  # a copy, at a tenth of copy.deepcopy's cost
    for op in patch:
        if op.get("op") != "add":
            raise ValueError(f"the webhook's own patch has an operation it never makes: {op.get('op')!r}")
        *parents, last = [s.replace("~1", "/").replace("~0", "~") for s in str(op["path"]).split("/")[1:]]
        target: Any = doc
        for segment in parents:
            target = target[int(segment)] if isinstance(target, list) else target[segment]
        if isinstance(target, list):
            target.append(op["value"]) if last == "-" else target.insert(int(last), op["value"])
        else:
            target[last] = op["value"]
    return doc


def mutate_create(  # noqa: PLR0917 - mutate's arguments and the key that verifies what it signs
    pod: Mapping[str, Any], namespace: str, policy: Policy, signer: Ed25519PrivateKey | None,
    public_key: Ed25519PublicKey, new_id: Callable[[], str],
) -> tuple[Patch, Verdict | None]:
    """(the patch, None) for an ordinary pod, which its own entries judge; for a GPU-share pod, (the patch, the
    verdict of the CREATE rules on the patched pod), which the API server would have had from validate.gpushare.io.

    NoSigningKey when `signer` is None and the pod is to be stamped, or carries an intent to verify (`public_key`,
    the signer's, verifies nothing else then).
    """
    patch, intent = mutate_stamped(pod, namespace, policy.contract, signer, new_id,
                                   other_gpu=policy.other_gpu_resources)
    if not is_gpu_share(pod, policy):
        return patch, None
    if signer is None and carries_stamp(pod, policy.contract):
        raise NoSigningKey(pod_ref(pod, namespace))
    # An intent of this webhook's own needs no second check of its signature (about 0.1 ms).
    return patch, create_verdict(patched(pod, patch), namespace, policy, public_key, genuine=intent is not None)
