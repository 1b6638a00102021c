"""Prometheus metrics of the webhook: counted in each gunicorn worker, served for all of them by the arbiter.

gunicorn runs several worker processes, so the counters live in prometheus_client's multiprocess mode: every
worker writes its samples to files under PROMETHEUS_MULTIPROC_DIR (set by gunicorn.conf.py before any worker
imports prometheus_client) and the arbiter, which outlives the workers, adds them up at each scrape on a plain
HTTP port of its own (GPUSHARE_METRICS_BIND). The serving certificate's expiry is read there, at scrape time.
"""

from __future__ import annotations

import datetime
import glob
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator

from cryptography import x509
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.buildinfo import BuildInfo
from common.metricsserver import MetricsServer as Listener
from webhook.rules.problems import REASONS

log = logging.getLogger(__name__)

ENDPOINTS = ("mutate", "validate")
OPERATIONS = ("CREATE", "UPDATE")  # the only ones the webhook is registered for; others are malformed
OUTCOMES = ("allowed", "denied", "malformed", "error")
LIMITS = ("client", "process")  # webhook/server/connlimits.py Limit
EVICTED_STATES = ("idle", "unfinished")  # a busy connection is never closed for another
HANDSHAKE_OUTCOMES = ("completed", "failed", "timed_out")
REQUEST_ENDPOINTS = ("mutate", "validate", "other")  # other: /healthz, /readyz, anything else on the TLS port
# A review takes about a millisecond; the API server gives up after timeoutSeconds (10 s by default).
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Requests one connection carried before it closed: the API server keeps up to 25 idle connections per transport
# (client-go transport/cache.go), one transport per webhook Service path (k8s.io/apiserver pkg/util/webhook/client.go
# gives each a dialer of its own), so a healthy connection carries hundreds.
PER_CONNECTION_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)


class WebhookMetrics:
    """The counters one app (one worker process) updates; a fresh registry each, so tests start from zero."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.reviews = Counter(
            "gpushare_webhook_reviews", "AdmissionReviews answered, by endpoint, operation and outcome.",
            ["endpoint", "operation", "outcome"], registry=self.registry,
        )
        self.denials = Counter(
            "gpushare_webhook_denials",
            "Denied reviews by reason; a review denied for several reasons counts once under each.",
            ["endpoint", "reason"], registry=self.registry,
        )
        self.duration = Histogram(
            "gpushare_webhook_review_duration_seconds", "Time from a whole request to its answer, by endpoint.",
            ["endpoint"], buckets=BUCKETS, registry=self.registry,
        )
        # One per live worker: gunicorn.conf.py's child_exit hook removes a dead worker's sample.
        self.workers = Gauge(
            "gpushare_webhook_worker_processes", "gunicorn worker processes serving the webhook.",
            registry=self.registry, multiprocess_mode="livesum",
        )
        self.workers.set(1)
        for endpoint in ENDPOINTS:  # every series exists from the start, so rate() sees the first review
            self.duration.labels(endpoint)
            for operation in (*OPERATIONS, "unknown"):
                for outcome in OUTCOMES:
                    self.reviews.labels(endpoint, operation, outcome)
            for reason in REASONS:
                self.denials.labels(endpoint, reason)

    def review(self, endpoint: str, operation: str, outcome: str, seconds: float,
               reasons: Iterable[str] = ()) -> None:
        self.reviews.labels(endpoint, operation if operation in OPERATIONS else "unknown", outcome).inc()
        self.duration.labels(endpoint).observe(seconds)
        for reason in reasons:
            self.denials.labels(endpoint, reason).inc()


class ConnectionMetrics:
    """What the connection limits of one worker process did (webhook/server/connlimits.py); counted like
    WebhookMetrics."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.evicted = Counter(
            "gpushare_webhook_connections_evicted",
            "Connections closed to make room for a new one, by the limit it reached (client: "
            "GPUSHARE_MAX_CONNECTIONS_PER_CLIENT, process: worker_connections) and the state of the one closed.",
            ["limit", "state"], registry=self.registry,
        )
        self.refused = Counter(
            "gpushare_webhook_connections_refused",
            "New connections refused because nothing could be closed for them, by the limit they reached.",
            ["limit"], registry=self.registry,
        )
        for limit in LIMITS:
            self.refused.labels(limit)
            for state in EVICTED_STATES:
                self.evicted.labels(limit, state)


class WireMetrics:
    """What one worker process sees on the wire: connections accepted, TLS handshakes and how they ended, requests
    per connection, and each request's time from its first byte to its answer handed to the kernel."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.accepted = Counter(
            "gpushare_webhook_connections_accepted", "TCP connections accepted on the TLS port.",
            registry=self.registry,
        )
        self.outsiders = Counter(
            "gpushare_webhook_connections_outside_sources",
            "Connections from outside GPUSHARE_ADMISSION_SOURCES reset at accept, before any TLS work; counted only "
            "where the kernel refused the socket filter that otherwise drops them (webhook/server/sourcefilter.py).",
            registry=self.registry,
        )
        self.handshakes = Counter(
            "gpushare_webhook_tls_handshakes",
            "TLS handshakes, by outcome: completed, failed (a TLS or socket error) or timed_out "
            "(GPUSHARE_READ_DEADLINE_SECONDS).", ["outcome"], registry=self.registry,
        )
        self.resumed = Counter(
            "gpushare_webhook_tls_sessions_resumed", "Completed TLS handshakes that resumed an earlier session.",
            registry=self.registry,
        )
        self.handshake_seconds = Histogram(
            "gpushare_webhook_tls_handshake_duration_seconds",
            "Time from a connection's set-up in the worker to its completed TLS handshake.",
            buckets=BUCKETS, registry=self.registry,
        )
        self.requests_per_connection = Histogram(
            "gpushare_webhook_connection_requests",
            "Requests answered on a TLS connection, observed when it closes.",
            buckets=PER_CONNECTION_BUCKETS, registry=self.registry,
        )
        self.request_seconds = Histogram(
            "gpushare_webhook_request_duration_seconds",
            "Time from a request's first byte read to its answer's last byte handed to the kernel, by endpoint: "
            "the review (gpushare_webhook_review_duration_seconds) plus reading, framing, the app and TLS.",
            ["endpoint"], buckets=BUCKETS, registry=self.registry,
        )
        # Label lookups take a lock each: the children are looked up once, here.
        self._handshakes = {outcome: self.handshakes.labels(outcome) for outcome in HANDSHAKE_OUTCOMES}
        self._requests = {endpoint: self.request_seconds.labels(endpoint) for endpoint in REQUEST_ENDPOINTS}

    def handshake(self, outcome: str, seconds: float = 0.0, *, resumed: bool = False) -> None:
        self._handshakes[outcome].inc()
        if outcome == "completed":
            self.handshake_seconds.observe(seconds)
            if resumed:
                self.resumed.inc()

    def request(self, path: str, seconds: float) -> None:
        endpoint = path[1:] if path in ("/mutate", "/validate") else "other"
        self._requests[endpoint].observe(seconds)


# ---------------------------------------------------------------------------------------------------------
# The arbiter's side: the multiprocess directory, the certificate's expiry and the /metrics listener.


def clear_dir(path: str) -> None:
    """Forget the samples of an earlier run in an operator-given directory (prometheus_client's advice)."""
    for stale in glob.glob(os.path.join(path, "*.db")):
        os.remove(stale)


def remove_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def worker_exited(path: str, pid: int) -> None:
    """A worker is gone: drop its live gauges (its counters stay, so totals never go down)."""
    multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class CertificateExpiry(Collector):
    """The serving certificate's end of validity, read from its file at each scrape (it rotates on disk)."""

    def __init__(self, cert_path: str, clock: Callable[[], datetime.datetime] = _utc_now) -> None:
        self.cert_path = cert_path
        self.clock = clock
        self._failed: str | None = None

    def collect(self) -> Iterator[Metric]:
        try:
            with open(self.cert_path, "rb") as pem:
                expires = x509.load_pem_x509_certificate(pem.read()).not_valid_after_utc
        except (OSError, ValueError) as exc:
            if str(exc) != self._failed:  # once per distinct problem, not once per scrape
                self._failed = str(exc)
                log.warning("The serving certificate %s cannot be read for its expiry metric (%s); /readyz says "
                            "what to fix.", self.cert_path, exc)
            return
        self._failed = None
        at = GaugeMetricFamily("gpushare_webhook_certificate_expiry_timestamp_seconds",
                               "When the serving certificate expires, in Unix time.")
        at.add_metric([], expires.timestamp())
        left = GaugeMetricFamily("gpushare_webhook_certificate_expires_in_seconds",
                                 "Seconds until the serving certificate expires (negative once it has).")
        left.add_metric([], (expires - self.clock()).total_seconds())
        yield at
        yield left


class WorkerFiles:
    """The workers' samples, leaving out a file a starting worker has created but not yet sized.

    prometheus_client creates each file empty and only then sizes it (mmap_dict.py MmapedDict.__init__: open 'a+b',
    then truncate); its MultiProcessCollector reads the first four bytes of every file it finds
    (read_all_values_from_file), so a scrape at that instant fails with struct.error. Such a file holds no sample yet.
    Once sized, a file never shrinks: it is only removed, and a removed live gauge the merge already skips.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def collect(self) -> Iterable[Metric]:
        files = []
        for path in glob.glob(os.path.join(self.path, "*.db")):
            try:
                if os.stat(path).st_size >= _SIZED:
                    files.append(path)
            except FileNotFoundError:
                pass  # a dead worker's live gauge, removed since the glob
        merged: Iterable[Metric] = multiprocess.MultiProcessCollector.merge(  # type: ignore[no-untyped-call]
            files, accumulate=True)
        return merged


_SIZED = 8  # the used-bytes integer and its padding: what a sized file holds first (mmap_dict.py)


class MetricsServer:
    """/metrics over plain HTTP in the arbiter: every worker's samples plus the certificate's expiry and the build
    info, served with bounded threads and connections (common/metricsserver.py)."""

    def __init__(self, bind: tuple[str, int], multiproc_dir: str, cert_path: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(WorkerFiles(multiproc_dir))
        self.registry.register(CertificateExpiry(cert_path))
        self.registry.register(BuildInfo("webhook"))
        self._listener = Listener(bind, self.registry, name="webhook-metrics")
        self.port = self._listener.port

    def stop(self) -> None:
        self._listener.stop()
