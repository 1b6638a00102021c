"""`gpushare-webhook` / `python -m webhook.server.serve`: start gunicorn over TLS; certificates reloaded from disk."""

from __future__ import annotations

import datetime
import json
import logging
import os
import ssl
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gunicorn.glogging import Logger

from common import cli
from common.logsetup import FIELDS
from common.settings import SettingsError
from webhook.server import preflight
from webhook.server.settings import WEBHOOK_VARIABLES, Settings, settings_from

log = logging.getLogger(__name__)

GUNICORN_CONF = Path(__file__).resolve().parents[2] / "gunicorn.conf.py"  # beside the webhook package
DEFAULT_DEV_DIR = ".dev-certs"
SAMPLE_REVIEW = "sample-review.json"

Stamp = tuple[tuple[int, int, int, int], ...]


class ReloadingTLS:
    """A server SSLContext (TLS 1.2 or newer) rebuilt when the certificate or key file changes on disk.

    gunicorn calls the `ssl_context` hook for every accepted connection, so checking the files' stat there
    makes a rotated certificate (cert-manager swaps the Secret volume's `..data` symlink) apply to the next
    connection without a restart. If the new files do not load (a half-written pair), the last good context
    stays in use and the failure is logged once per change.
    """

    def __init__(self, cert: str, key: str) -> None:
        self._cert = cert
        self._key = key
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._stamp: Stamp | None = None
        self._failed: Stamp | None = None

    def _stat(self) -> Stamp:
        out = []
        for path in (self._cert, self._key):
            st = os.stat(path)  # follows the ..data symlink, so a swap changes the inode
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self._cert, self._key)
        # No TLS 1.3 session tickets: the API server never resumes a session (client-go's transport sets no
        # ClientSessionCache, and Go's crypto/tls then drops every ticket: handshake_client_tls13.go
        # handleNewSessionTicket), so the two tickets OpenSSL sends by default cost each handshake a third send and
        # about a fifth of its OpenSSL time for nothing (docs/webhook.md, Performance as the API server sees it).
        context.num_tickets = 0
        return context

    def context(self) -> ssl.SSLContext:
        with self._lock:
            stamp: Stamp | None = None
            try:
                stamp = self._stat()
                if stamp != self._stamp:
                    fresh = self._build()
                    if self._stamp is not None:
                        log.info("Loaded the rotated TLS certificate %s.", self._cert)
                    self._context, self._stamp = fresh, stamp
            except (OSError, ssl.SSLError) as exc:
                if self._context is None:
                    raise
                if stamp is None or stamp != self._failed:
                    self._failed = stamp
                    log.error(
                        "The TLS certificate %s or key %s changed but cannot be loaded (%s); still serving the "
                        "previous certificate. Check the gpushare-webhook-tls Secret.", self._cert, self._key, exc,
                    )
            current = self._context
            assert current is not None  # set above or the first failure was raised
            return current


class GunicornLogger(Logger):  # type: ignore[misc]  # gunicorn ships no type hints
    """gunicorn's error and access logs through the root handler that `configure` set up, so one stream holds
    one format (gunicorn.conf.py: logger_class). Access lines carry the request as fields in JSON."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for log in (self.error_log, self.access_log):
            for handler in list(log.handlers):
                if getattr(handler, "_gunicorn", False) and type(handler) is logging.StreamHandler:
                    log.removeHandler(handler)  # "-": stderr/stdout; files and syslog keep their handlers
            log.propagate = not log.handlers

    def access(self, resp: Any, req: Any, environ: dict[str, Any], request_time: datetime.timedelta) -> None:
        if self.cfg.accesslog is None:
            return
        atoms = self.atoms(resp, req, environ, request_time)
        fields = {
            "remote": atoms["h"], "method": atoms["m"], "path": atoms["U"], "protocol": atoms["H"],
            "status": int(atoms["s"]) if str(atoms["s"]).isdigit() else atoms["s"], "bytes": atoms["B"],
            "duration_seconds": request_time.total_seconds(), "user_agent": atoms["a"],
        }
        self.access_log.info('%s "%s" %s %s %.6fs', atoms["h"], atoms["r"], atoms["s"], atoms["b"],
                             request_time.total_seconds(), extra={FIELDS: fields})


def sample_review() -> dict[str, object]:
    """A CREATE review of a two-container GPU-share pod, as the API server would post it."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "00000000-0000-4000-8000-000000000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "kubernetes-admin"},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": "trainer-", "namespace": "default"},
                "spec": {
                    "containers": [
                        {"name": "main", "image": "cuda:12", "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}},
                        {"name": "helper", "image": "cuda:12", "resources": {"limits": {"aliyun.com/gpu-mem": "2"}}},
                    ]
                },
            },
            "dryRun": False,
        },
    }


def prepare_dev(directory: Path, env: dict[str, str]) -> None:
    """Create development certificates and keys where missing and point the GPUSHARE_* files at them."""
    from certs.cli import write_files
    from certs.devcerts import ensure_dev_files

    files = ensure_dev_files(directory)
    write_files(directory, {SAMPLE_REVIEW: json.dumps(sample_review(), indent=2).encode() + b"\n"})
    env.update(files)


def curl_line(bind: str, directory: Path) -> str:
    host, _, port = bind.rpartition(":")
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = "127.0.0.1"
    return (
        f"curl -sS --cacert {directory / 'ca.crt'} -H 'Content-Type: application/json' "
        f"--data @{directory / SAMPLE_REVIEW} https://{host}:{port}/mutate"
    )


def cannot_start(problem: str) -> None:
    """One line on stderr: what is wrong and what to do."""
    print(f"The webhook cannot start: {' '.join(problem.split())}.", file=sys.stderr)


def checked(env: Mapping[str, str], *, try_bind: bool) -> Settings | None:
    """The settings, or None after one line per problem on stderr: every setting and file is checked before
    gunicorn binds, so a bad value never shows up as a gunicorn traceback, a bind retry loop or failing requests."""
    try:
        settings = settings_from(env)
    except SettingsError as exc:
        cannot_start(str(exc))
        return None
    found = preflight.problems(settings, try_bind=try_bind)
    for problem in found:
        cannot_start(problem)
    return None if found else settings


def main(
    argv: Sequence[str] | None = None, *, dev_default: bool = False, environ: Mapping[str, str] | None = None
) -> int:
    parser = cli.parser(
        "gpushare-webhook", "Serve the gpushare admission webhook over TLS with gunicorn (gunicorn.conf.py).",
        WEBHOOK_VARIABLES,
        "Every setting is checked before the webhook listens; a bad one stops it with one line naming the variable "
        "and exit status 2.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dev", dest="dev", action="store_true", default=dev_default,
                      help="create development certificates and keys in GPUSHARE_DEV_CERTS and use them")
    mode.add_argument("--no-dev", dest="dev", action="store_false", help="use the configured certificate files")
    args = parser.parse_args(argv)

    env = dict(os.environ if environ is None else environ)
    directory = Path(env.get("GPUSHARE_DEV_CERTS") or DEFAULT_DEV_DIR)
    if args.dev:
        try:
            prepare_dev(directory, env)
        except OSError as exc:
            cannot_start(f"GPUSHARE_DEV_CERTS={directory} cannot hold the development certificates ({exc.strerror}); "
                         "set GPUSHARE_DEV_CERTS to a writable directory")
            return 2
    settings = checked(env, try_bind=True)
    if settings is None:
        return 2
    if not GUNICORN_CONF.is_file():
        print(f"The gunicorn configuration {GUNICORN_CONF} is missing; run from a checkout of gpushare-webhook "
              "or start `gunicorn -c <path to gunicorn.conf.py>` yourself.", file=sys.stderr)
        return 2
    if args.dev:
        print(f"Serving the gpushare webhook on https://{settings.bind} (Ctrl-C stops it). Try:")
        print(f"  {curl_line(settings.bind, directory)}")
        sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF)], env)
    return 0  # not reached: execve replaces this process


if __name__ == "__main__":
    sys.exit(main(dev_default=True))
