"""The intent signature: Ed25519 over the namespace and the canonical intent."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract import signing

INTENT = '{"allocationId":"x","total":8}'


def test_signature_verifies_only_for_the_same_intent_namespace_and_key() -> None:
    key = Ed25519PrivateKey.generate()
    sig = signing.sign(key, INTENT, "ml")
    assert signing.verify(key.public_key(), INTENT, "ml", sig)
    assert not signing.verify(key.public_key(), INTENT, "other", sig)
    assert not signing.verify(key.public_key(), INTENT.replace("8", "9"), "ml", sig)
    assert not signing.verify(Ed25519PrivateKey.generate().public_key(), INTENT, "ml", sig)


@pytest.mark.parametrize("garbage", ["", "not base64!", "AAAA", "=" * 8])
def test_garbage_signatures_do_not_verify(garbage: str) -> None:
    key = Ed25519PrivateKey.generate()
    assert not signing.verify(key.public_key(), INTENT, "ml", garbage)


def test_keys_round_trip_through_pem() -> None:
    key = Ed25519PrivateKey.generate()
    loaded = signing.load_private_key(signing.private_pem(key), "signing.key")
    public = signing.load_public_key(signing.public_pem(key.public_key()), "signing.pub")
    assert signing.verify(public, INTENT, "ns", signing.sign(loaded, INTENT, "ns"))


def test_wrong_key_material_is_refused_with_the_file_named() -> None:
    with pytest.raises(signing.SigningKeyError, match=r"signing\.key is not an unencrypted PEM private key"):
        signing.load_private_key(b"hello", "signing.key")
    with pytest.raises(signing.SigningKeyError, match=r"signing\.pub is not a PEM public key"):
        signing.load_public_key(b"hello", "signing.pub")
    from cryptography.hazmat.primitives import serialization

    ec = generate_private_key(SECP256R1())
    pem = ec.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(signing.SigningKeyError, match="not an Ed25519 key"):
        signing.load_private_key(pem, "ec.key")
    pub = ec.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(signing.SigningKeyError, match="not an Ed25519 public key"):
        signing.load_public_key(pub, "ec.pub")
