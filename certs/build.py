"""Pure builders: a CA, the webhook's serving certificate with its Service DNS names, the intent-signing keys."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from contract.signing import private_pem, public_pem

DEFAULT_SERVICE = "gpushare-webhook"
DEFAULT_NAMESPACE = "gpushare-system"
DEV_HOSTS = ("localhost", "127.0.0.1")
# Clock skew between this machine and the API server must not make a fresh certificate "not yet valid".
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class Issued:
    """A private key and the certificate for it."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)


def service_hosts(service: str, namespace: str) -> list[str]:
    """The names the API server may use for a Service-backed webhook (it dials <svc>.<ns>.svc)."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Signing only; a CA also signs certificates and revocation lists."""
    return x509.KeyUsage(
        digital_signature=True, key_cert_sign=ca, crl_sign=ca, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, encipher_only=False, decipher_only=False,
    )


def build_ca(now: datetime.datetime, *, common_name: str = "gpushare-webhook-ca", days: int = 3650) -> Issued:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(key, cert)


def build_serving_cert(
    ca: Issued,
    now: datetime.datetime,
    *,
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    extra_hosts: Iterable[str] = (),
    days: int = 365,
) -> Issued:
    """A TLS server certificate signed by `ca` for the Service's DNS names plus extra DNS names or IPs."""
    hosts = list(dict.fromkeys([*service_hosts(service, namespace), *extra_hosts]))
    key = _new_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[2])]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(key, cert)


def build_signing_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def dev_bundle(
    now: datetime.datetime,
    *,
    service: str = DEFAULT_SERVICE,
    namespace: str = DEFAULT_NAMESPACE,
    extra_hosts: Iterable[str] = DEV_HOSTS,
) -> dict[str, bytes]:
    """Every development file by name: ca.crt, ca.key, tls.crt, tls.key, signing.key, signing.pub."""
    ca = build_ca(now)
    serving = build_serving_cert(ca, now, service=service, namespace=namespace, extra_hosts=extra_hosts)
    signer = build_signing_key()
    return {
        "ca.crt": ca.cert_pem,
        "ca.key": ca.key_pem,
        "tls.crt": serving.cert_pem,
        "tls.key": serving.key_pem,
        "signing.key": private_pem(signer),
        "signing.pub": public_pem(signer.public_key()),
    }


SECRET_FILES = frozenset({"ca.key", "tls.key", "signing.key"})
