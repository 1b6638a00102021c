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
worker_class = "gthread"
workers = _settings.workers
threads = _settings.threads
# The API server waits at most timeoutSeconds (1-30 s, default 10) for an answer; a stuck worker is recycled.
timeout = 30
graceful_timeout = 10
keepalive = 30
loglevel = _settings.log_level.lower()
accesslog = None
errorlog = "-"
certfile = _settings.tls_cert
keyfile = _settings.tls_key
# Bodies over this size are refused by the app with a 400 (GPUSHARE_MAX_BODY_BYTES); headers stay small.
limit_request_field_size = 16384
# No gunicornc control socket: it defaults to one path per user ($HOME/.gunicorn), which a read-only root file
# system cannot hold and which two servers on one machine would fight over.
control_socket_disable = True

_tls = ReloadingTLS(_settings.tls_cert, _settings.tls_key)


def ssl_context(config: Any, default_ssl_context_factory: Any) -> ssl.SSLContext:
    """Called for every accepted connection; answers from a cache keyed on the files' stat."""
    return _tls.context()
