"""Certificate builders: the serving certificate's names, the CA's signature, the key types, validity."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID

from certs.build import build_ca, build_serving_cert, build_signing_key, dev_bundle, service_hosts
from contract import signing

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)


def sans(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return names.get_values_for_type(x509.DNSName), [str(i) for i in names.get_values_for_type(x509.IPAddress)]


@pytest.mark.parametrize(
    ("service", "namespace", "extra", "dns", "ips"),
    [
        ("gpushare-webhook", "gpushare-system", (),
         ["gpushare-webhook", "gpushare-webhook.gpushare-system", "gpushare-webhook.gpushare-system.svc",
          "gpushare-webhook.gpushare-system.svc.cluster.local"], []),
        ("hook", "ns", ("localhost", "127.0.0.1", "::1", "hook.example.com"),
         ["hook", "hook.ns", "hook.ns.svc", "hook.ns.svc.cluster.local", "localhost", "hook.example.com"],
         ["127.0.0.1", "::1"]),
    ],
)
def test_serving_certificate_names(
    service: str, namespace: str, extra: tuple[str, ...], dns: list[str], ips: list[str]
) -> None:
    serving = build_serving_cert(build_ca(NOW), NOW, service=service, namespace=namespace, extra_hosts=extra)
    assert sans(serving.cert) == (dns, ips)
    assert service_hosts(service, namespace) == dns[:4]


def test_serving_certificate_is_signed_by_the_ca_and_for_servers() -> None:
    ca = build_ca(NOW)
    serving = build_serving_cert(ca, NOW)
    serving.cert.verify_directly_issued_by(ca.cert)
    other = build_ca(NOW)
    with pytest.raises(InvalidSignature):
        serving.cert.verify_directly_issued_by(other.cert)
    usage = serving.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage
    assert serving.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True


def test_key_types_and_validity() -> None:
    ca = build_ca(NOW, days=10)
    serving = build_serving_cert(ca, NOW, days=5)
    assert isinstance(ca.key, ec.EllipticCurvePrivateKey)
    assert isinstance(serving.key, ec.EllipticCurvePrivateKey)
    assert isinstance(build_signing_key(), Ed25519PrivateKey)
    assert serving.cert.not_valid_before_utc < NOW < serving.cert.not_valid_after_utc
    assert serving.cert.not_valid_after_utc == NOW + datetime.timedelta(days=5)
    assert ca.cert.not_valid_after_utc == NOW + datetime.timedelta(days=10)


def test_dev_bundle_files_load_and_pair_up() -> None:
    files = dev_bundle(NOW)
    assert sorted(files) == ["ca.crt", "ca.key", "signing.key", "signing.pub", "tls.crt", "tls.key"]
    cert = x509.load_pem_x509_certificate(files["tls.crt"])
    ca = x509.load_pem_x509_certificate(files["ca.crt"])
    cert.verify_directly_issued_by(ca)
    dns, ips = sans(cert)
    assert "localhost" in dns
    assert ips == [str(ipaddress.ip_address("127.0.0.1"))]
    private = signing.load_private_key(files["signing.key"], "signing.key")
    public = signing.load_public_key(files["signing.pub"], "signing.pub")
    assert signing.verify(public, "{}", "ns", signing.sign(private, "{}", "ns"))
