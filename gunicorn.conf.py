"""gunicorn settings and hooks for the gpushare webhook: TLS 1.2+ with certificates reloaded from disk."""

from __future__ import annotations

import os
import ssl
import sys
import tempfile
from typing import Any

from common import logsetup
from webhook.server.serve import ReloadingTLS, checked

# Every setting and file is checked here, before gunicorn binds; the address is only bound for a trial by
# `gpushare-webhook` (webhook/server/serve.py), as gunicorn may already hold it when it reloads this file.
_checked = checked(os.environ, try_bind=False)
if _checked is None:
    sys.exit(2)
_settings = _checked

wsgi_app = "webhook.server.app:create_app_from_env()"
bind = [_settings.bind]
# An asyncio front per process bounds the TLS handshake, the headers and the body (GPUSHARE_READ_DEADLINE_SECONDS
# each) and hands only whole requests to the app: a stalled client holds a socket, never a thread.
# Measured in bench/bench_stalled_clients.py against gthread, which 8 stalled clients stop.
#
# Worker model, measured with bench/bench_webhook_http.py (wrk, keep-alive TLS, 6 KB Deployment pod, 2 CPUs):
# - Each process accepts one connection per wake-up, and one that holds more connections than another lets that one
#   take the next (webhook/server/worker.py, webhook/server/acceptshare.py), so the API server's kept-alive connections
#   spread over the processes: the CPU time of a mutate run split 99% / 1% over 2 processes with asyncio's
#   accept-everything-waiting; 51/49 to 68/32 over runs after (100/0 in one run of three under load average 16 with one
#   accept per wake-up alone). So workers = the cores (GPUSHARE_WORKERS, default 2); more processes than cores only add
#   memory and context switches.
# - The app runs on the event loop's thread (GPUSHARE_THREADS=0, the default): a review holds the GIL for its whole
#   ~0.5 ms and never waits on I/O, so app threads add no parallelism, only a hand-off per request and, on every
#   socket call of the loop, a wait for the GIL. Server CPU per request, 2 processes: /healthz 0.26-0.31 ms on the
#   loop against 0.31-0.41 ms with 4 threads; /mutate 0.80-0.85 ms against 0.95-1.03 ms (several runs each, on a
#   machine that other jobs loaded, load average 15-25, which blurs throughput far more than CPU per request).
worker_class = "webhook.server.worker.WebhookWorker"
workers = _settings.workers
threads = max(_settings.threads, 1)  # gunicorn's own setting; our worker reads GPUSHARE_THREADS itself
# Connections one process holds at most, stalled ones included, about 60 KiB each (webhook/server/worker.py,
# TLS_READ_BUFFER): 1,000 add about 60 MiB to a process. Past it a new connection takes the place of an idle (else
# unfinished) one of the client address holding the most, when that client holds more than the newcomer's; else it is
# refused. One client address holds at most GPUSHARE_MAX_CONNECTIONS_PER_CLIENT (webhook/server/connlimits.py).
worker_connections = 1000
# The API server waits at most timeoutSeconds (1-30 s, default 10) for an answer; a worker whose event loop stops
# turning for this long is replaced.
timeout = 30
graceful_timeout = 10
# How long a kept-alive connection may stay idle between two requests: longer than the API server keeps one, so the
# API server, not the webhook, closes its idle connections. Its webhook client is client-go's transport, built with
# IdleConnTimeout 90 s (k8s.io/apimachinery pkg/util/net/http.go SetTransportDefaults, from net/http's
# DefaultTransport) and 25 idle connections per webhook path (k8s.io/client-go transport/cache.go). With 30 s, every
# call after a quiet half minute paid a new TLS handshake (about 2 ms of a process's CPU, 4 times a review), and a
# server closing an idle connection races the client reusing it: a POST written on it fails, unretried, and the
# entry's failurePolicy applies (docs/webhook.md, Connections). Idle connections stay bounded by worker_connections
# and give way to newcomers (webhook/server/connlimits.py).
keepalive = 120
loglevel = _settings.log_level.lower()
accesslog = None
errorlog = "-"
# One stream, one format (GPUSHARE_LOG_FORMAT: text or json) for the app and gunicorn's error and access logs.
logsetup.configure(_settings.log_level, _settings.log_format)
logger_class = "webhook.server.serve.GunicornLogger"
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


# Prometheus multiprocess mode (webhook/server/metrics.py): prometheus_client reads this variable when a worker first
# imports it, after the fork, so it is set here, in the arbiter, before any worker starts.
_metrics_dir = _settings.metrics_dir or tempfile.mkdtemp(prefix="gpushare-metrics-")
_metrics_dir_ours = not _settings.metrics_dir
os.environ["PROMETHEUS_MULTIPROC_DIR"] = _metrics_dir
_served: dict[str, Any] = {}  # "metrics": the arbiter's MetricsServer, once started


def on_starting(server: Any) -> None:
    """Once per start (not on reload): counters begin at zero."""
    from webhook.server.metrics import clear_dir

    clear_dir(_metrics_dir)


def when_ready(server: Any) -> None:
    """The arbiter says who may connect, and serves /metrics for every worker on a plain port of its own
    (GPUSHARE_METRICS_BIND)."""
    if _settings.open_to_every_source:
        from webhook.server.app import OPEN_PORT

        server.log.warning("On %s %s.", _settings.bind, OPEN_PORT)
    elif _settings.admission_sources:
        server.log.info("The kernel drops connections to %s from outside GPUSHARE_ADMISSION_SOURCES=%s and loopback.",
                        _settings.bind, _settings.sources_text())
    if _settings.metrics_bind is None or "metrics" in _served:
        return
    from webhook.server.metrics import MetricsServer

    host, port = _settings.metrics_bind
    try:
        _served["metrics"] = metrics = MetricsServer(_settings.metrics_bind, _metrics_dir, _settings.tls_cert)
    except OSError as exc:
        print(f"The webhook cannot start: GPUSHARE_METRICS_BIND={host}:{port} cannot be listened on ({exc}); "
              "choose a free port, or set it empty to serve no metrics.", file=sys.stderr)
        sys.exit(2)
    server.log.info("Serving Prometheus metrics on http://%s:%s/metrics", host, metrics.port)


def post_worker_init(worker: Any) -> None:
    """The worker has loaded the app: full collections skip everything it made so far (common/heap.py)."""
    from common import heap

    heap.freeze_start_up()


def child_exit(server: Any, worker: Any) -> None:
    from webhook.server.metrics import worker_exited

    worker_exited(_metrics_dir, worker.pid)


def on_exit(server: Any) -> None:
    if "metrics" in _served:
        _served.pop("metrics").stop()
    if _metrics_dir_ours:
        from webhook.server.metrics import remove_dir

        remove_dir(_metrics_dir)
