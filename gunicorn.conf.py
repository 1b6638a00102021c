"""gunicorn settings and hooks for the gpushare webhook: TLS 1.2+ with certificates reloaded from disk."""

from __future__ import annotations

import ssl
import sys
from typing import Any

from webhook.serve import ReloadingTLS
from webhook.settings import SettingsError, from_environ

try:
    _settings = from_environ()
except SettingsError as _exc:
    print(f"The webhook cannot start: {_exc}.", file=sys.stderr)
    sys.exit(2)

wsgi_app = "webhook.app:create_app_from_env()"
bind = [_settings.bind]
# An asyncio front per process bounds the TLS handshake, the headers and the body (GPUSHARE_READ_DEADLINE_SECONDS
# each) and hands whole requests to `threads` app threads: a stalled client holds a socket, never a thread.
# Measured in bench/bench_stalled_clients.py against gthread, which 8 stalled clients stop.
worker_class = "webhook.worker.WebhookWorker"
workers = _settings.workers
threads = _settings.threads
# Connections one process holds at most, stalled ones included; more are refused with a log line.
worker_connections = 1000
# The API server waits at most timeoutSeconds (1-30 s, default 10) for an answer; a worker whose event loop stops
# turning for this long is replaced.
timeout = 30
graceful_timeout = 10
# How long a kept-alive connection may stay idle between two requests.
keepalive = 30
loglevel = _settings.log_level.lower()
accesslog = None
errorlog = "-"
certfile = _settings.tls_cert
keyfile = _settings.tls_key
# Bodies over GPUSHARE_MAX_BODY_BYTES are refused by the app with a 400; headers over 16 KiB by the front (431).
# No gunicornc control socket: it defaults to one path per user ($HOME/.gunicorn), which a read-only root file
# system cannot hold and which two servers on one machine would fight over.
control_socket_disable = True

_tls = ReloadingTLS(_settings.tls_cert, _settings.tls_key)


def ssl_context(config: Any, default_ssl_context_factory: Any) -> ssl.SSLContext:
    """Called for every accepted connection; answers from a cache keyed on the files' stat."""
    return _tls.context()
