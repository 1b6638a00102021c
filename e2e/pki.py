"""The cluster's own PKI: one CA, serving and client certificates, the ServiceAccount key, kubeconfigs."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAYS = 30


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


class Pki:
    """Writes every file into `directory` and returns their paths."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.now = datetime.datetime.now(datetime.UTC)
        self._ca_key = _key()
        self._ca = (
            x509.CertificateBuilder()
            .subject_name(_name("gpushare-e2e-cluster-ca")).issuer_name(_name("gpushare-e2e-cluster-ca"))
            .public_key(self._ca_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(self.now - datetime.timedelta(hours=1))
            .not_valid_after(self.now + datetime.timedelta(days=_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._ca_key.public_key()), critical=False)
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = self.dir / "ca.crt"
        self.ca.write_bytes(self._ca.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, common: str, *, org: str | None = None, hosts: tuple[str, ...] = ()) -> Pair:
        """A client certificate, or a serving one when `hosts` are given."""
        key = _key()
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if hosts else [ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common, org)).issuer_name(self._ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(self.now - datetime.timedelta(hours=1))
            .not_valid_after(self.now + datetime.timedelta(days=_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                           critical=False)
        )
        if hosts:
            builder = builder.add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        pair = Pair(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(_key_pem(key))
        pair.key.chmod(0o600)
        return pair

    def service_account_keys(self) -> Pair:
        """The key the API server signs ServiceAccount tokens with (`cert` holds the public key)."""
        key = _key()
        pair = Pair(self.dir / "sa.pub", self.dir / "sa.key")
        pair.key.write_bytes(_key_pem(key))
        pair.key.chmod(0o600)
        pair.cert.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                            serialization.PublicFormat.SubjectPublicKeyInfo))
        return pair


def kubeconfig(path: Path, server: str, ca: Path, *, client: Pair | None = None, token: str | None = None,
               user: str = "user") -> Path:
    """A kubeconfig with one cluster, one user (certificate or token) and one current context."""
    if client is not None:
        credentials = f"    client-certificate: {client.cert}\n    client-key: {client.key}\n"
    elif token is not None:
        credentials = f"    token: {token}\n"
    else:
        raise ValueError("a kubeconfig needs a client certificate or a token")
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: gpushare-e2e\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n"
        f"users:\n- name: {user}\n  user:\n{credentials}"
        f"contexts:\n- name: gpushare-e2e\n  context:\n    cluster: gpushare-e2e\n    user: {user}\n"
        "current-context: gpushare-e2e\n"
    )
    path.chmod(0o600)
    return path
