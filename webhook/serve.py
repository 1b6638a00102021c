"""`gpushare-webhook` / `python -m webhook.serve`: start gunicorn over TLS; certificates reloaded from disk."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import ssl
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from webhook.settings import SettingsError, settings_from

log = logging.getLogger(__name__)

GUNICORN_CONF = Path(__file__).resolve().parent.parent / "gunicorn.conf.py"
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
    from certs.build import dev_bundle
    from certs.cli import missing_dev_files, write_files

    if missing_dev_files(directory):
        print(f"Creating development certificates and keys in {directory} ...")
        write_files(directory, dev_bundle(datetime.datetime.now(datetime.UTC)))
    write_files(directory, {SAMPLE_REVIEW: json.dumps(sample_review(), indent=2).encode() + b"\n"})
    env["GPUSHARE_TLS_CERT"] = str(directory / "tls.crt")
    env["GPUSHARE_TLS_KEY"] = str(directory / "tls.key")
    env["GPUSHARE_SIGNING_KEY"] = str(directory / "signing.key")


def curl_line(bind: str, directory: Path) -> str:
    host, _, port = bind.rpartition(":")
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = "127.0.0.1"
    return (
        f"curl -sS --cacert {directory / 'ca.crt'} -H 'Content-Type: application/json' "
        f"--data @{directory / SAMPLE_REVIEW} https://{host}:{port}/mutate"
    )


def main(
    argv: Sequence[str] | None = None, *, dev_default: bool = False, environ: Mapping[str, str] | None = None
) -> int:
    parser = argparse.ArgumentParser(
        prog="gpushare-webhook", description="Serve the gpushare admission webhook over TLS with gunicorn."
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dev", dest="dev", action="store_true", default=dev_default,
                      help="create development certificates and keys (GPUSHARE_DEV_CERTS, default .dev-certs)")
    mode.add_argument("--no-dev", dest="dev", action="store_false", help="use the configured certificate files")
    args = parser.parse_args(argv)

    env = dict(os.environ if environ is None else environ)
    directory = Path(env.get("GPUSHARE_DEV_CERTS") or DEFAULT_DEV_DIR)
    if args.dev:
        try:
            prepare_dev(directory, env)
        except OSError as exc:
            print(f"Could not prepare development certificates in {directory} ({exc}); set GPUSHARE_DEV_CERTS "
                  "to a writable directory.", file=sys.stderr)
            return 2
    try:
        settings = settings_from(env)
    except SettingsError as exc:
        print(f"The webhook cannot start: {exc}.", file=sys.stderr)
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
