"""Pure decisions for the webhook's in-cluster certificates and signing keys: what to keep, issue and trust."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from certs.build import DEFAULT_NAMESPACE, DEFAULT_SERVICE, Issued, service_hosts
from contract.signing import SigningKeyError, load_private_key, private_pem, public_pem

TLS_SECRET = "gpushare-webhook-tls"
CA_SECRET = "gpushare-webhook-ca"
SIGNING_SECRET = "gpushare-signing-key"
VERIFY_CONFIGMAP = "gpushare-verify-key"
WEBHOOK_CONFIGURATION = "gpushare-webhook"
CONFIGURATION_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
INJECT_ANNOTATION = "cert-manager.io/inject-ca-from"
LABELS = {"app.kubernetes.io/part-of": "gpushare", "app.kubernetes.io/managed-by": "gpushare-certs"}
# Renew a serving certificate this long before it expires (cert-manager's default is a third of its life).
RENEW_BEFORE = datetime.timedelta(days=30)


class PlanError(ValueError):
    """Stored material that cannot be used as it is; the text names the object and what to do."""


@dataclass(frozen=True)
class Stored:
    """A Secret's or ConfigMap's data as bytes, with the resourceVersion an update must name."""

    data: Mapping[str, bytes]
    resource_version: str


@dataclass(frozen=True)
class WebhookConfiguration:
    kind: str
    name: str
    annotations: Mapping[str, str]
    ca_bundles: tuple[tuple[str, bytes], ...]  # (webhook name, caBundle) in list order


@dataclass(frozen=True)
class CaState:
    """The CA that signs serving certificates now, and during a CA rotation the one that replaces it."""

    current: Issued
    next: Issued | None = None

    @property
    def trusted(self) -> list[x509.Certificate]:
        return [self.current.cert] + ([self.next.cert] if self.next else [])


def load_issued(cert_pem: bytes, key_pem: bytes, where: str) -> Issued:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise PlanError(f"{where} does not hold a PEM certificate and an unencrypted PEM key ({exc})") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PlanError(f"{where} holds a {type(key).__name__}, not the ECDSA key gpushare-certs writes")
    if key.public_key().public_numbers() != _ec_numbers(cert):
        raise PlanError(f"{where} holds a certificate and a key that do not belong together")
    return Issued(key, cert)


def _ec_numbers(cert: x509.Certificate) -> ec.EllipticCurvePublicNumbers | None:
    public = cert.public_key()
    return public.public_numbers() if isinstance(public, ec.EllipticCurvePublicKey) else None


def pem(certs: Iterable[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def bundle_certs(bundle: bytes) -> list[x509.Certificate]:
    """The certificates of a PEM caBundle; an empty or unreadable bundle trusts nothing."""
    try:
        return x509.load_pem_x509_certificates(bundle) if bundle.strip() else []
    except ValueError:
        return []


def issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


# ---------------------------------------------------------------------------------------------------------
# Secret and ConfigMap contents.


def ca_data(state: CaState) -> dict[str, bytes]:
    data = {"ca.crt": state.current.cert_pem, "ca.key": state.current.key_pem}
    if state.next is not None:
        data.update({"next-ca.crt": state.next.cert_pem, "next-ca.key": state.next.key_pem})
    return data


def parse_ca_state(stored: Stored | None, namespace: str) -> CaState | None:
    if stored is None:
        return None
    where = f"Secret {namespace}/{CA_SECRET}"
    data = stored.data
    if "ca.crt" not in data or "ca.key" not in data:
        raise PlanError(f"{where} lacks ca.crt or ca.key; delete it and run `gpushare-certs install` for a new CA")
    current = load_issued(data["ca.crt"], data["ca.key"], where)
    if "next-ca.crt" in data and "next-ca.key" in data:
        return CaState(current, load_issued(data["next-ca.crt"], data["next-ca.key"], f"{where} (next-ca.*)"))
    return CaState(current)


def tls_data(serving: Issued, trusted: Sequence[x509.Certificate]) -> dict[str, bytes]:
    return {"tls.crt": serving.cert_pem, "tls.key": serving.key_pem, "ca.crt": pem(trusted)}


def serving_from(stored: Stored | None, namespace: str) -> Issued | None:
    """The serving pair of the TLS Secret, or None when it is missing or unreadable (then a new one is issued)."""
    if stored is None or "tls.crt" not in stored.data or "tls.key" not in stored.data:
        return None
    try:
        return load_issued(stored.data["tls.crt"], stored.data["tls.key"], f"Secret {namespace}/{TLS_SECRET}")
    except PlanError:
        return None


def serving_problem(
    serving: Issued | None,
    ca: x509.Certificate,
    now: datetime.datetime,
    *,
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    extra_hosts: Sequence[str] = (),
) -> str | None:
    """Why the stored serving certificate must be replaced, or None when it can stay."""
    if serving is None:
        return "there is no readable serving certificate"
    if not issued_by(serving.cert, ca):
        return "the serving certificate was not issued by the CA that must sign it"
    try:
        names = serving.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        named = {*names.get_values_for_type(x509.DNSName), *map(str, names.get_values_for_type(x509.IPAddress))}
    except x509.ExtensionNotFound:
        named = set()
    missing = [h for h in [*service_hosts(service, namespace), *extra_hosts] if h not in named]
    if missing:
        return f"the serving certificate does not name {', '.join(missing)}"
    if serving.cert.not_valid_after_utc - now < RENEW_BEFORE:
        return f"the serving certificate expires on {serving.cert.not_valid_after_utc:%Y-%m-%d}"
    return None


def signing_key_from(stored: Stored | None, namespace: str) -> Ed25519PrivateKey | None:
    if stored is None:
        return None
    where = f"Secret {namespace}/{SIGNING_SECRET} key signing.key"
    if "signing.key" not in stored.data:
        raise PlanError(f"{where} is missing; delete the Secret to let gpushare-certs create a new key pair")
    try:
        return load_private_key(stored.data["signing.key"], where)
    except SigningKeyError as exc:
        raise PlanError(str(exc)) from exc


def signing_data(key: Ed25519PrivateKey) -> dict[str, bytes]:
    return {"signing.key": private_pem(key)}


def verify_data(key: Ed25519PrivateKey) -> dict[str, bytes]:
    return {"signing.pub": public_pem(key.public_key())}


# ---------------------------------------------------------------------------------------------------------
# Webhook configurations.


def managed_by_cert_manager(configs: Iterable[WebhookConfiguration]) -> str | None:
    for config in configs:
        if INJECT_ANNOTATION in config.annotations:
            return (
                f"The {config.kind} {config.name} gets its caBundle from cert-manager "
                f"({INJECT_ANNOTATION}: {config.annotations[INJECT_ANNOTATION]}), so gpushare-certs must not write "
                "the certificates: use the cert-manager overlay alone, or apply manifests/self-signed instead."
            )
    return None


def bundle_needs_update(config: WebhookConfiguration, trusted: Sequence[x509.Certificate]) -> bool:
    """True unless every webhook of the configuration trusts exactly these CAs."""
    want = {c.fingerprint(hashes.SHA256()) for c in trusted}
    if not config.ca_bundles:
        return False  # no webhooks to patch
    return any({c.fingerprint(hashes.SHA256()) for c in bundle_certs(b)} != want for _, b in config.ca_bundles)
