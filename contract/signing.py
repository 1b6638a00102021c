"""Ed25519 signature over a pod's intent and namespace: signed by the webhook, verified by the plugins."""

from __future__ import annotations

import base64
import binascii

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

_DOMAIN = b"gpushare.io/intent/v1\n"


class SigningKeyError(ValueError):
    """A key file that is not an Ed25519 key in PEM form; the text says which and what to do."""


def message(intent_json: str, namespace: str) -> bytes:
    """The signed bytes: a domain tag, the namespace and the canonical intent, so an intent cannot be
    copied into another namespace."""
    return _DOMAIN + namespace.encode() + b"\n" + intent_json.encode()


def sign(private_key: Ed25519PrivateKey, intent_json: str, namespace: str) -> str:
    return base64.b64encode(private_key.sign(message(intent_json, namespace))).decode()


def verify(public_key: Ed25519PublicKey, intent_json: str, namespace: str, signature: str) -> bool:
    try:
        raw = base64.b64decode(signature.encode(), validate=True)
    except (binascii.Error, ValueError):
        return False
    try:
        public_key.verify(raw, message(intent_json, namespace))
    except InvalidSignature:
        return False
    return True


def load_private_key(pem: bytes, where: str) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(
            f"{where} is not an unencrypted PEM private key ({exc}); create one with `gpushare-certs dev`"
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{where} holds a {type(key).__name__}, not an Ed25519 key; the intent "
                              "signature needs Ed25519 (create one with `gpushare-certs dev`)")
    return key


def load_public_key(pem: bytes, where: str) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(
            f"{where} is not a PEM public key ({exc}); use the signing.pub made by `gpushare-certs dev`"
        ) from exc
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"{where} holds a {type(key).__name__}, not an Ed25519 public key")
    return key


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
