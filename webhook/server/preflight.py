"""Checks of the webhook's files and address before gunicorn binds: each problem is one sentence naming the variable."""

from __future__ import annotations

import errno
import socket
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from contract.signing import SigningKeyError, load_private_key
from webhook.server.settings import Settings, bind_address

DEV_HINT = "or, for development, run `gpushare-webhook --dev`"
TLS_SECRET = "the gpushare-webhook-tls Secret"
SIGNING_SECRET = "the gpushare-signing-key Secret"


def _read(variable: str, path: str, what: str, source: str) -> bytes:
    where = f"{variable}={path}"
    file = Path(path)
    if not file.exists():
        raise ValueError(f"{where} does not exist; mount {source} there or point {variable} at {what}, {DEV_HINT}")
    if not file.is_file():
        raise ValueError(f"{where} is not a file; point {variable} at {what}")
    try:
        return file.read_bytes()
    except OSError as exc:
        raise ValueError(
            f"{where} cannot be read ({exc.strerror}); let the webhook's user read it (for a Secret volume: "
            "defaultMode 0440 and the pod's fsGroup)"
        ) from exc


def _tls_problems(cert_path: str, key_path: str) -> list[str]:
    problems: list[str] = []
    cert = key = None
    try:
        chain = x509.load_pem_x509_certificates(_read("GPUSHARE_TLS_CERT", cert_path, "the serving certificate",
                                                       TLS_SECRET))
        cert = chain[0]
    except ValueError as exc:
        text = str(exc)
        problems.append(text if text.startswith("GPUSHARE_") else (
            f"GPUSHARE_TLS_CERT={cert_path} holds no PEM certificate ({text}); point it at the serving "
            "certificate (tls.crt)"))
    try:
        pem = _read("GPUSHARE_TLS_KEY", key_path, "the serving certificate's private key", TLS_SECRET)
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        text = str(exc)
        problems.append(text if text.startswith("GPUSHARE_") else (
            f"GPUSHARE_TLS_KEY={key_path} is not an unencrypted PEM private key ({text}); point it at the "
            "serving certificate's key (tls.key)"))
    if cert is None or key is None or problems:
        return problems
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(serialization.Encoding.DER, spki) != key.public_key().public_bytes(
        serialization.Encoding.DER, spki
    ):
        return [f"GPUSHARE_TLS_KEY={key_path} is not the key of the certificate in GPUSHARE_TLS_CERT={cert_path}; "
                "mount tls.crt and tls.key of the same Secret (a rotation must replace both)"]
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path)
    except (OSError, ssl.SSLError) as exc:
        return [f"GPUSHARE_TLS_CERT={cert_path} and GPUSHARE_TLS_KEY={key_path} do not load as a TLS pair ({exc}); "
                "issue them again (gpushare-certs rotate, or cert-manager)"]
    return []


def _signing_problem(path: str) -> str | None:
    try:
        pem = _read("GPUSHARE_SIGNING_KEY", path, "the intent-signing key signing.key", SIGNING_SECRET)
        load_private_key(pem, f"GPUSHARE_SIGNING_KEY={path}")
    except (ValueError, SigningKeyError) as exc:
        return str(exc)
    return None


def _address_problem(variable: str, host: str, port: int, try_bind: bool) -> str | None:
    where = f"{variable}={host}:{port}" if ":" not in host else f"{variable}=[{host}]:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return (f"{where}: the host {host} does not resolve ({exc.strerror}); use an address of this machine "
                "such as 0.0.0.0 or 127.0.0.1")
    if not try_bind:
        return None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind(address)
        except OSError as exc:
            fix = {
                errno.EADDRINUSE: "another program listens there; stop it or choose another port",
                errno.EADDRNOTAVAIL: "it is not an address of this machine; use 0.0.0.0 or one of its addresses",
                errno.EACCES: "ports below 1024 need privileges; use a port such as 8443",
            }.get(exc.errno or 0, "choose another address")
            return f"{where} cannot be bound ({exc.strerror}): {fix}"
    return None


def problems(settings: Settings, *, try_bind: bool = True) -> list[str]:
    """Every problem found, each one sentence without the final period; empty when the webhook can serve.

    `try_bind` binds the address for a moment (and lets go): off where gunicorn may already hold it (a reload).
    """
    found = _tls_problems(settings.tls_cert, settings.tls_key)
    signing = _signing_problem(settings.signing_key)
    if signing:
        found.append(signing)
    host, port = bind_address(settings.bind)  # settings_from has checked the form already
    addresses = [("GPUSHARE_BIND", host, port)]
    if settings.metrics_bind is not None and settings.metrics_bind[1] != 0:
        addresses.append(("GPUSHARE_METRICS_BIND", *settings.metrics_bind))
    for variable, host, port in addresses:
        problem = _address_problem(variable, host, port, try_bind)
        if problem:
            found.append(problem)
    return found
