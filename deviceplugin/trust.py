"""Which pods the plugin believes: a signed intent that describes the pod, checked once per pod version (pure)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from contract import Contract, Intent, ProtocolError, intent_mismatch, parse_intent, pod_ref, read_annotations, signing
from contract.modes import Placement
from deviceplugin.checkpoint import Checkpoint
from deviceplugin.errors import Refusal
from deviceplugin.pins import Pins
from node.inventory import Gpu

log = logging.getLogger(__name__)

# A node runs at most a few hundred pods (kubelet --max-pods, 110 by default): room for every pod and its versions.
_REMEMBERED = 4096


class Verdicts:
    """Trust verdicts by pod version (UID and resourceVersion): a signature is checked once per version, not once
    per pod per call (about 0.1 ms each, over every pod of the node), and a pod that is not believed is reported
    in the log once, not on every call."""

    def __init__(self, size: int = _REMEMBERED) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._by_version: dict[tuple[str, str], Intent | Refusal] = {}
        self._reported: dict[tuple[str, str], None] = {}

    def intent(self, pod: Mapping[str, Any], ctx: Context) -> Intent | Refusal:
        meta = pod.get("metadata") or {}
        version = (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))
        if not all(version):
            return _verdict(pod, ctx)
        with self._lock:
            known = self._by_version.get(version)
        if known is None:
            known = _verdict(pod, ctx)
            with self._lock:
                _bounded_put(self._by_version, version, known, self._size)
        return known

    def report(self, uid: str, message: str) -> None:
        """Log `message` once per pod UID and message (the same problem seen on every call is logged once)."""
        key = (uid, message)
        with self._lock:
            if key in self._reported:
                return
            _bounded_put(self._reported, key, None, self._size)
        log.warning("%s", message)


def _bounded_put(table: dict[Any, Any], key: Any, value: Any, size: int) -> None:
    if len(table) >= size:
        del table[next(iter(table))]  # the oldest entry: dicts keep insertion order
    table[key] = value


def _verdict(pod: Mapping[str, Any], ctx: Context) -> Intent | Refusal:
    try:
        return stamped_intent(pod, ctx, f"pod {pod_ref(pod)}")
    except Refusal as refusal:
        return refusal


@dataclass(frozen=True)
class Context:
    contract: Contract
    node_name: str
    public_key: Ed25519PublicKey
    gpus: Mapping[int, Gpu]
    healthy: Callable[[int], bool]
    placement: Placement = "extender"
    pins: Pins = field(default_factory=Pins, compare=False)
    verdicts: Verdicts = field(default_factory=Verdicts, compare=False)
    # The kubelet's device checkpoint as of now (the adapter reads it again when the kubelet rewrites it): what the
    # pods of a previous device plugin hold, and what it gave them (deviceplugin/evidence.py).
    checkpoint: Callable[[], Checkpoint] = field(default=Checkpoint, compare=False)


def no_intent(who: str, key: str, why: str = "") -> str:
    """Why a pod without an intent is not served: it predates the webhook (or the webhook did not see it)."""
    return (
        f"{who} has no {key} annotation: it was created before the gpushare webhook was installed, or where the "
        f"webhook does not admit pods (check its namespaceSelector and failurePolicy){why}, so nothing tells which GPU "
        "it was promised, and it must be recreated; delete the pod so that it is created again through the gpushare "
        "webhook (its controller recreates it; create a bare pod again yourself)"
    )


def stamped_intent(pod: Mapping[str, Any], ctx: Context, who: str) -> Intent:
    """The pod's intent, only if the webhook's signature verifies and it describes the pod's spec."""
    annotations = read_annotations(pod)
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    key, sig_key = ctx.contract.intent_key, ctx.contract.signature_key
    if key not in annotations:
        raise Refusal(no_intent(who, key), reason="GpuShareNoIntent")
    signature = annotations.get(sig_key, "")
    if not signature or not signing.verify(ctx.public_key, annotations[key], namespace, signature):
        raise Refusal(
            f"{who} has an intent whose signature does not verify; recreate the pod through the gpushare webhook, "
            "and check that GPUSHARE_VERIFY_KEY holds the public key of the webhook's signing key",
            reason="GpuShareBadSignature",
        )
    try:
        intent = parse_intent(annotations[key], key)
    except ProtocolError as exc:
        raise Refusal(f"{who} has an unreadable intent: {exc}", reason="GpuShareBadIntent") from exc
    mismatch = intent_mismatch(intent, pod, ctx.contract)
    if mismatch:
        raise Refusal(f"{who} does not match its intent: {mismatch}; recreate the pod", reason="GpuShareBadIntent")
    return intent
