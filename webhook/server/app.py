"""Flask app factory: the one view over webhook.rules; it translates reviews and exceptions to HTTP answers."""

from __future__ import annotations

import datetime
import logging
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from flask import Flask, Response, request
from werkzeug.exceptions import RequestEntityTooLarge

from common import logsetup
from contract import pod_ref, signing
from webhook.rules.admit import carries_stamp, mutate_create
from webhook.rules.mutate import NoSigningKey, Patch, mutate_update
from webhook.rules.review import (
    VALIDATED_KINDS,
    MalformedReview,
    Request,
    Review,
    parse_review,
    respond,
    token_node,
    username,
)
from webhook.rules.validate import Verdict, validate, validate_binding
from webhook.server.metrics import WebhookMetrics
from webhook.server.settings import Settings, from_environ

log = logging.getLogger(__name__)

# Warn this long before the serving certificate lapses: cert-manager renews at two thirds of the lifetime (months
# ahead for the one-year default), so a warning inside this window means renewal is not happening.
EXPIRY_WARNING = datetime.timedelta(days=30)


def _new_uuid() -> str:
    return str(uuid.uuid4())


# What validate() is given while the signing key cannot be read: a public key whose private half nobody holds, so it
# verifies no signature. Only a pod CREATE that carries an intent or a signature has one verified, and those are
# refused first with the key's problem (_judge), so it stands in for the key of ordinary pods and updates only.
_NO_KEY = Ed25519PrivateKey.generate().public_key()


class SigningKey:
    """The intent-signing key, loaded from its file on first use and again after a failure (a late mount)."""

    def __init__(self, settings: Settings, key: Ed25519PrivateKey | None) -> None:
        self._path = settings.signing_key
        self._key = key
        self._public: Ed25519PublicKey | None = None
        self._lock = threading.Lock()

    def get(self) -> Ed25519PrivateKey:
        with self._lock:
            if self._key is None:
                try:
                    pem = Path(self._path).read_bytes()
                except OSError as exc:
                    raise signing.SigningKeyError(
                        f"the signing key {self._path} cannot be read ({exc.strerror}); mount the "
                        "gpushare-signing-key Secret there or set GPUSHARE_SIGNING_KEY"
                    ) from exc
                self._key = signing.load_private_key(pem, self._path)
            return self._key

    def public(self) -> Ed25519PublicKey:
        """The public half of the key get() returns, derived once."""
        if self._public is None:
            self._public = self.get().public_key()
        return self._public

    def get_or_problem(self) -> tuple[Ed25519PrivateKey | None, str]:
        """(the key, '') or (None, why it cannot be read, with the fix)."""
        try:
            return self.get(), ""
        except signing.SigningKeyError as exc:
            return None, str(exc)


def _describe(req: Request) -> str:
    return pod_ref(req["object"], req["namespace"])


def _sub(req: Request) -> str:
    sub = req.get("subResource") or ("binding" if req["kind"]["kind"] == "Binding" else "")
    return f" pods/{sub}" if sub else ""


def _mutation(req: Request, settings: Settings, key: SigningKey,
              new_id: Callable[[], str]) -> tuple[Patch, Verdict | None]:
    """The patch, and for a GPU-share pod's CREATE the verdict on the pod it makes (webhook/rules/admit.py);
    SigningKeyError when a GPU-share pod is to be stamped or its intent checked and the key cannot be read. Every
    other pod reaches a fail-open entry and needs no signature, so it is mutated as ever (readiness reports the key)."""
    if req["operation"] == "UPDATE" and req["oldObject"] is not None:  # pods/ephemeralcontainers
        return mutate_update(req["oldObject"], req["object"], settings.contract), None
    signer, problem = key.get_or_problem()
    try:
        return mutate_create(req["object"], req["namespace"], settings, signer,
                             _NO_KEY if signer is None else key.public(), new_id)
    except NoSigningKey as exc:
        raise signing.SigningKeyError(problem) from exc


def _judge(req: Request, settings: Settings, key: SigningKey) -> Verdict:
    """The verdict; SigningKeyError when the pod's intent signature must be checked and the key cannot be read. No
    other review needs the key: a pod without an intent or a signature, an update, a Binding."""
    if req["kind"]["kind"] == "Binding":
        return validate_binding(req["object"], username(req), req["namespace"], settings)
    signer, problem = key.get_or_problem()
    if signer is None and req["operation"] == "CREATE" and carries_stamp(req["object"], settings.contract):
        raise signing.SigningKeyError(problem)
    return validate(
        req["operation"], req["oldObject"], req["object"], username(req), req["namespace"], settings,
        _NO_KEY if signer is None else key.public(), token_node=token_node(req),
        subresource=req.get("subResource", ""),
    )


def _denial(req: Request, endpoint: str, verdict: Verdict) -> Review:
    log.info("%s %s uid=%s %s%s denied: %s", endpoint, _describe(req), req["uid"], req["operation"], _sub(req),
             verdict.message)
    return respond(req["uid"], allowed=False, message=verdict.message)


def _no_key(what: str, req: Request, problem: Exception, settings: Settings) -> str:
    return (f"The gpushare webhook cannot {what} {_describe(req)}: {problem}. Pods that do not ask for "
            f"{settings.contract.resource} are admitted meanwhile; create this one again once the gpushare-webhook "
            "pods in gpushare-system are ready.")


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _tls_state(settings: Settings, now: datetime.datetime) -> tuple[str | None, datetime.datetime | None]:
    """(problem, expiry) of the serving pair: a pair that does not load (a key that does not match the
    certificate included) or a certificate past its end is a problem; the API server's handshake would fail."""
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
        with open(settings.tls_cert, "rb") as pem:
            expires = x509.load_pem_x509_certificate(pem.read()).not_valid_after_utc
    except (OSError, ssl.SSLError, ValueError) as exc:
        return f"the TLS certificate {settings.tls_cert} / key {settings.tls_key} cannot be loaded ({exc})", None
    if expires <= now:
        return (
            f"the serving certificate {settings.tls_cert} expired at {expires:%Y-%m-%dT%H:%M:%SZ}, so the API "
            "server refuses the handshake; renew it (cert-manager does so on its own; without it run "
            "gpushare-certs rotate)"
        ), expires
    return None, expires


# What /readyz and the start-up log say while GPUSHARE_ADMISSION_SOURCES is empty.
OPEN_PORT = ("every source may connect to the admission port: set GPUSHARE_ADMISSION_SOURCES (the chart's "
             "webhook.admissionSources) to the API server's source addresses, or a flood of connections from pods can "
             "keep the API server's calls waiting past their timeout (docs/deploy.md, Network policy)")


class Readiness:
    """GET /readyz: the signing key loads and the serving pair loads, matches and has not expired; the expiry is
    exposed as a header and warned about (once per certificate) in the last EXPIRY_WARNING before it lapses."""

    def __init__(self, settings: Settings, key: SigningKey, clock: Callable[[], datetime.datetime]) -> None:
        self._settings = settings
        self._key = key
        self._clock = clock
        self._warned: set[datetime.datetime] = set()

    def answer(self) -> tuple[str, int, dict[str, str]]:
        problems: list[str] = []
        try:
            self._key.get()
        except signing.SigningKeyError as exc:
            problems.append(str(exc))
        now = self._clock()
        tls, expires = _tls_state(self._settings, now)
        if tls:
            problems.append(tls)
        headers = {"Content-Type": "text/plain; charset=utf-8"}
        if expires is not None:
            stamp = f"{expires:%Y-%m-%dT%H:%M:%SZ}"
            headers["X-Serving-Certificate-Expires"] = stamp
            if not tls and expires - now < EXPIRY_WARNING and expires not in self._warned:
                self._warned.add(expires)
                log.warning("the serving certificate %s expires at %s, in %s days; renew it before then "
                            "(cert-manager renews on its own; without it run gpushare-certs rotate)",
                            self._settings.tls_cert, stamp, (expires - now).days)
        headers["X-Admission-Sources"] = self._settings.sources_text()
        if problems:
            return "not ready: " + "; ".join(problems) + "\n", 503, headers
        if self._settings.open_to_every_source:
            return f"ok; {OPEN_PORT}\n", 200, headers
        return "ok\n", 200, headers


def create_app(
    settings: Settings,
    *,
    private_key: Ed25519PrivateKey | None = None,
    new_id: Callable[[], str] = _new_uuid,
    clock: Callable[[], datetime.datetime] = _utc_now,
    metrics: WebhookMetrics | None = None,
) -> Flask:
    """The webhook's WSGI app: POST /mutate, POST /validate, GET /healthz, GET /readyz (metrics:
    webhook/server/metrics.py)."""
    app = Flask(__name__)
    # The API server's own limit for a request body is 3 MiB (etcd's 1.5 MiB object, JSON-wrapped twice).
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    key = SigningKey(settings, private_key)
    readiness = Readiness(settings, key, clock)
    counted = metrics or WebhookMetrics()

    def body() -> bytes:
        try:
            return request.get_data(cache=False)
        except RequestEntityTooLarge as exc:
            raise MalformedReview(
                f"the request body is over the {settings.max_body_bytes}-byte limit (GPUSHARE_MAX_BODY_BYTES)"
            ) from exc

    def answer(review: Review) -> Response:
        return Response(orjson.dumps(review), 200, mimetype="application/json")

    def malformed(exc: MalformedReview) -> tuple[str, int, dict[str, str]]:
        log.warning("%s %s: malformed AdmissionReview: %s", request.method, request.path, exc)
        return " ".join(str(exc).split()) + "\n", 400, {"Content-Type": "text/plain; charset=utf-8"}

    def count(endpoint: str, started: float, operation: str, outcome: str, reasons: tuple[str, ...] = ()) -> None:
        counted.review(endpoint, operation, outcome, time.perf_counter() - started, reasons)

    def failed(req: Request, endpoint: str, started: float, message: str, *, trace: bool) -> Response:
        log.error("%s %s uid=%s failed: %s", endpoint, _describe(req), req["uid"], message, exc_info=trace)
        count(endpoint, started, req["operation"], "error")
        return answer(respond(req["uid"], allowed=False, code=500, message=message))

    @app.post("/mutate")
    def mutate_view() -> Any:
        started = time.perf_counter()
        try:
            req = parse_review(body(), settings.max_body_bytes)
        except MalformedReview as exc:
            count("mutate", started, "unknown", "malformed")
            return malformed(exc)
        try:
            patch, verdict = _mutation(req, settings, key, new_id)
        except signing.SigningKeyError as exc:
            return failed(req, "mutate", started, _no_key("stamp GPU-share pod", req, exc, settings), trace=False)
        except Exception as exc:
            return failed(req, "mutate", started, (
                f"The gpushare webhook could not stamp pod {_describe(req)} because of an internal error ({exc}); "
                "check the gpushare-webhook logs in gpushare-system and create the pod again."
            ), trace=True)
        if verdict is not None and not verdict.allowed:
            count("mutate", started, req["operation"], "denied", verdict.reasons)
            return answer(_denial(req, "mutate", verdict))
        log.info("mutate %s uid=%s %s%s ops=%s dryRun=%s", _describe(req), req["uid"], req["operation"],
                 _sub(req), len(patch), req["dryRun"])
        count("mutate", started, req["operation"], "allowed")
        return answer(respond(req["uid"], patch=patch))

    @app.post("/validate")
    def validate_view() -> Any:
        started = time.perf_counter()
        try:
            req = parse_review(body(), settings.max_body_bytes, VALIDATED_KINDS)
        except MalformedReview as exc:
            count("validate", started, "unknown", "malformed")
            return malformed(exc)
        try:
            verdict = _judge(req, settings, key)
        except signing.SigningKeyError as exc:
            return failed(req, "validate", started, _no_key("check the intent signature of pod", req, exc, settings),
                          trace=False)
        except Exception as exc:
            return failed(req, "validate", started, (
                f"The gpushare webhook could not check pod {_describe(req)} because of an internal error ({exc}); "
                "check the gpushare-webhook logs in gpushare-system and retry."
            ), trace=True)
        if not verdict.allowed:
            count("validate", started, req["operation"], "denied", verdict.reasons)
            return answer(_denial(req, "validate", verdict))
        log.debug("validate %s uid=%s %s%s allowed", _describe(req), req["uid"], req["operation"], _sub(req))
        count("validate", started, req["operation"], "allowed")
        return answer(respond(req["uid"]))

    @app.get("/healthz")
    def healthz() -> Any:
        return "ok\n", 200, {"Content-Type": "text/plain; charset=utf-8"}

    @app.get("/readyz")
    def readyz() -> Any:
        return readiness.answer()

    return app


def create_app_from_env() -> Flask:
    """The app gunicorn serves (gunicorn.conf.py: wsgi_app), configured from GPUSHARE_* variables."""
    settings = from_environ()
    if not logging.getLogger().handlers:  # gunicorn.conf.py has configured logging already; another server has not
        logsetup.configure(settings.log_level, settings.log_format)
    logging.getLogger().setLevel(settings.log_level)
    return create_app(settings)
