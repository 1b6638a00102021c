"""Webhook metrics: denial reasons, the app's counters, and /metrics of the real multi-worker gunicorn server."""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import os
import signal
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client.parser import text_string_to_metric_families

from common.buildinfo import installed_version
from common.settings import SettingsError, metrics_address
from contract import ASSIGNED, IDX, signing
from tests.harness.pods import EXTENDER, KEY, PLUGIN, USER, Pod, annotate, container, placed, pod, review, stamped
from tests.harness.webhook.server import HOST, RunningWebhook, webhook_server
from tests.webhook.rules.test_validate import (
    ALLOCATED_POD,
    ASSIGNED_POD,
    CREATE_DENIALS,
    GPU,
    POLICY,
    UPDATE_DENIALS,
    with_env,
)
from webhook.rules.problems import REASONS
from webhook.rules.validate import validate
from webhook.server.app import create_app
from webhook.server.metrics import CertificateExpiry, WebhookMetrics, WireMetrics, WorkerFiles
from webhook.server.settings import Settings, settings_from

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by name and sorted labels."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(s: Samples, name: str, **labels: str) -> float:
    return s.get((name, tuple(sorted(labels.items()))), 0.0)


# ---------------------------------------------------------------------------------------------------------
# Reasons: every denial is counted under one or more of a small fixed set.

REASON_CASES: list[tuple[str, str, Pod | None, Pod, str, tuple[str, ...]]] = [
    ("reserved annotation", "CREATE", None, annotate(GPU, {IDX: "1"}), USER, ("reserved_annotation",)),
    ("webhook not reached", "CREATE", None, pod(container("a", 2)), USER, ("no_intent",)),
    ("another key signed it", "CREATE", None, stamped(pod(container("a", 2)), key=KEY, namespace="other"), USER,
     ("forged_intent",)),
    ("over the largest GPU", "CREATE", None, stamped(pod(container("big", 200))), USER, ("too_large",)),
    ("user GPU env", "CREATE", None, with_env(GPU, [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), USER,
     ("container_env",)),
    ("malformed limit", "CREATE", None, pod(container("a", "1.5")), USER, ("bad_spec",)),
    ("two at once", "CREATE", None, annotate(pod(container("a", 2)), {IDX: "1"}), USER,
     ("reserved_annotation", "no_intent")),
    ("intent edited", "UPDATE", GPU, annotate(GPU, {POLICY.contract.signature_key: "AAAA"}), PLUGIN,
     ("intent_changed",)),
    ("IDX by a user", "UPDATE", GPU, placed(GPU), USER, ("not_authorized",)),
    ("IDX moved once bound", "UPDATE", ASSIGNED_POD, annotate(ASSIGNED_POD, {IDX: "2"}), EXTENDER,
     ("placement_frozen",)),
    ("ASSIGNED back to false", "UPDATE", ALLOCATED_POD, annotate(ALLOCATED_POD, {ASSIGNED: "false"}), PLUGIN,
     ("bad_assignment",)),
]


@pytest.mark.parametrize(("case", "operation", "old", "new", "user", "reasons"), REASON_CASES,
                         ids=[c[0] for c in REASON_CASES])
def test_denials_carry_their_reasons(case: str, operation: str, old: Pod | None, new: Pod, user: str,
                                     reasons: tuple[str, ...]) -> None:
    verdict = validate(operation, old, new, user, "ml", POLICY, KEY.public_key())
    assert not verdict.allowed
    assert verdict.reasons == reasons


def test_every_denial_of_the_validation_tables_has_a_known_reason() -> None:
    cases: list[tuple[str, Pod | None, Pod, str, Settings]]
    cases = [("CREATE", None, new, USER, policy) for _, new, policy, _ in CREATE_DENIALS]
    cases += [("UPDATE", old, new, user, POLICY) for _, old, new, user, _ in UPDATE_DENIALS]
    for operation, old, new, user, policy in cases:
        verdict = validate(operation, old, new, user, "ml", policy, KEY.public_key())
        assert not verdict.allowed
        assert verdict.reasons and set(verdict.reasons) <= set(REASONS), verdict.message


@pytest.mark.parametrize(("text", "expected"), [
    ("", None), ("127.0.0.1:9102", ("127.0.0.1", 9102)), (":9103", ("0.0.0.0", 9103)), ("[::]:9102", ("::", 9102)),
    ("127.0.0.1:0", ("127.0.0.1", 0)),
])
def test_metrics_address(text: str, expected: tuple[str, int] | None) -> None:
    assert metrics_address(text) == expected


@pytest.mark.parametrize("text", ["9102", "host:", "host:http", "host:70000"])
def test_a_bad_metrics_address_names_the_variable(text: str) -> None:
    with pytest.raises(SettingsError, match=r"GPUSHARE_METRICS_BIND=.*expected host:port, or empty"):
        settings_from({"GPUSHARE_METRICS_BIND": text})


# ---------------------------------------------------------------------------------------------------------
# Traffic with known answers, driven through the app (one process) and through gunicorn (several).

def traffic(post: Callable[[str, bytes], int], key: Ed25519PrivateKey) -> None:
    """3 mutations, 2 allowed and 3 denied validations (4 reasons counted), 2 malformed bodies; `key` is the
    server's signing key."""
    gpu = stamped(pod(container("a", 2)), key=key)

    def send(path: str, doc: dict[str, Any]) -> None:
        assert post(path, json.dumps(doc).encode()) == 200

    for i in range(3):
        send("/mutate", review("CREATE", pod(container("a", 2), name=f"m-{i}"), uid=f"m-{i}"))
    send("/validate", review("CREATE", gpu, uid="v-1"))
    send("/validate", review("UPDATE", placed(gpu), gpu, user=EXTENDER, uid="v-2"))
    send("/validate", review("CREATE", pod(container("a", 2)), uid="v-3"))  # no_intent
    send("/validate", review("UPDATE", placed(gpu), gpu, user=USER, uid="v-4"))  # not_authorized
    send("/validate", review("CREATE", annotate(pod(container("a", 2)), {IDX: "1"}), uid="v-5"))  # two reasons
    assert post("/validate", b"{not json") == 400
    assert post("/mutate", b'{"kind": "AdmissionReview"}') == 400


EXPECTED_REVIEWS = {
    ("mutate", "CREATE", "allowed"): 3,
    ("mutate", "unknown", "malformed"): 1,
    ("validate", "CREATE", "allowed"): 1,
    ("validate", "CREATE", "denied"): 2,
    ("validate", "UPDATE", "allowed"): 1,
    ("validate", "UPDATE", "denied"): 1,
    ("validate", "unknown", "malformed"): 1,
}
EXPECTED_DENIALS = {"no_intent": 2, "not_authorized": 1, "reserved_annotation": 1}


def assert_traffic(s: Samples, times: int) -> None:
    reviews = {
        (labels["endpoint"], labels["operation"], labels["outcome"]): v
        for (name, items), v in s.items() if name == "gpushare_webhook_reviews_total" and (labels := dict(items))
    }
    # Every endpoint, operation and outcome has its series from the start (rate() sees the first review).
    assert len(reviews) == 2 * 3 * 4
    assert {k: v for k, v in reviews.items() if v} == {k: v * times for k, v in EXPECTED_REVIEWS.items()}
    for reason in REASONS:
        assert value(s, "gpushare_webhook_denials_total", endpoint="validate", reason=reason) == \
            EXPECTED_DENIALS.get(reason, 0) * times, reason
        assert value(s, "gpushare_webhook_denials_total", endpoint="mutate", reason=reason) == 0
    for endpoint, count in (("mutate", 4), ("validate", 6)):
        assert value(s, "gpushare_webhook_review_duration_seconds_count", endpoint=endpoint) == count * times
        assert value(s, "gpushare_webhook_review_duration_seconds_bucket", endpoint=endpoint, le="+Inf") == \
            count * times
        assert value(s, "gpushare_webhook_review_duration_seconds_sum", endpoint=endpoint) > 0


def test_the_app_counts_what_it_answers(tmp_path: Path) -> None:
    from certs.build import dev_bundle
    from certs.cli import write_files

    write_files(tmp_path, dev_bundle(datetime.datetime.now(datetime.UTC)))
    settings = settings_from({"GPUSHARE_TLS_CERT": str(tmp_path / "tls.crt"),
                              "GPUSHARE_TLS_KEY": str(tmp_path / "tls.key"),
                              "GPUSHARE_SIGNING_KEY": str(tmp_path / "signing.key")})
    metrics = WebhookMetrics()
    app = create_app(settings, metrics=metrics)
    with app.test_client() as client:
        traffic(lambda path, body: client.post(path, data=body, content_type="application/json").status_code,
                signing.load_private_key((tmp_path / "signing.key").read_bytes(), "signing.key"))
    from prometheus_client import generate_latest

    assert_traffic(samples(generate_latest(metrics.registry).decode()), 1)


def test_a_file_a_starting_worker_has_not_yet_sized_is_left_out_of_the_sum(tmp_path: Path) -> None:
    import struct

    from prometheus_client import multiprocess
    from prometheus_client.mmap_dict import MmapedDict

    written = MmapedDict(str(tmp_path / "counter_111.db"))  # type: ignore[no-untyped-call]
    key = json.dumps(["gpushare_test_things", "gpushare_test_things_total", {}, "Things."])
    written.write_value(key, 3.0, 0.0)  # type: ignore[no-untyped-call]
    written.close()  # type: ignore[no-untyped-call]
    (tmp_path / "counter_222.db").touch()  # created, not yet sized: mmap_dict.py MmapedDict.__init__
    with pytest.raises(struct.error):  # what prometheus_client's own collector does with it
        list(multiprocess.MultiProcessCollector(None, path=str(tmp_path)).collect())  # type: ignore[no-untyped-call]
    [family] = WorkerFiles(str(tmp_path)).collect()
    assert [(s.name, s.value) for s in family.samples] == [("gpushare_test_things_total", 3.0)]


def test_certificate_expiry_is_read_at_each_scrape(tmp_path: Path) -> None:
    from certs.build import dev_bundle
    from certs.cli import write_files

    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    write_files(tmp_path, dev_bundle(now))
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    collector = CertificateExpiry(str(tmp_path / "tls.crt"), clock=lambda: now)
    got = {m.name: m.samples[0].value for m in collector.collect()}
    assert got == {
        "gpushare_webhook_certificate_expiry_timestamp_seconds": cert.not_valid_after_utc.timestamp(),
        "gpushare_webhook_certificate_expires_in_seconds": (cert.not_valid_after_utc - now).total_seconds(),
    }
    (tmp_path / "tls.crt").write_text("not a certificate")
    assert list(collector.collect()) == []


def workers_of(arbiter: int) -> set[int]:
    children = Path(f"/proc/{arbiter}/task/{arbiter}/children").read_text().split()
    return {int(pid) for pid in children}


def wait_for(what: str, check: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def post_over_tls(hook: RunningWebhook) -> Callable[[str, bytes], int]:
    def post(path: str, body: bytes) -> int:
        return hook.request("POST", path, body)[0]  # a new connection each: the workers share them out
    return post


@pytest.mark.timeout(120)
def test_gunicorn_with_three_workers_serves_the_sum_of_all_of_them(tmp_path: Path) -> None:
    multiproc = tmp_path / "multiproc"
    multiproc.mkdir()
    (multiproc / "counter_999999.db").write_bytes(b"left from an earlier run")
    env = {"GPUSHARE_WORKERS": "3", "PROMETHEUS_MULTIPROC_DIR": str(multiproc)}
    with webhook_server(tmp_path / "hook", env) as hook:
        assert not (multiproc / "counter_999999.db").exists()  # an earlier run's samples are not counted
        wait_for("three workers", lambda: value(samples(hook.scrape()), "gpushare_webhook_worker_processes") == 3)
        before = samples(hook.scrape())
        assert value(before, "gpushare_webhook_reviews_total", endpoint="mutate", operation="CREATE",
                     outcome="allowed") == 0
        assert value(before, "gpushare_webhook_denials_total", endpoint="validate", reason="no_intent") == 0

        traffic(post_over_tls(hook), hook.private_key)
        assert_traffic(samples(hook.scrape()), 1)

        # A worker dies: its counts stay in the totals, its live gauge goes, and its replacement counts on.
        victim = min(workers_of(hook.process.pid))
        os.kill(victim, signal.SIGKILL)
        wait_for("the dead worker's gauge to go", lambda: not list(multiproc.glob(f"gauge_livesum_{victim}.db")))
        wait_for("a replacement", lambda: len(workers_of(hook.process.pid) - {victim}) == 3)
        wait_for("three workers again",
                 lambda: value(samples(hook.scrape()), "gpushare_webhook_worker_processes") == 3)
        traffic(post_over_tls(hook), hook.private_key)
        after = samples(hook.scrape())
        assert_traffic(after, 2)
        assert list(multiproc.glob(f"counter_{victim}.db")) or list(multiproc.glob(f"histogram_{victim}.db"))

        cert = x509.load_pem_x509_certificate((hook.cert_dir / "tls.crt").read_bytes())
        assert value(after, "gpushare_webhook_certificate_expiry_timestamp_seconds") == \
            cert.not_valid_after_utc.timestamp()
        left = value(after, "gpushare_webhook_certificate_expires_in_seconds")
        assert 0 < left <= (cert.not_valid_after_utc - cert.not_valid_before_utc).total_seconds()
        [build] = [dict(labels) for (name, labels), v in after.items() if name == "gpushare_build_info" and v == 1]
        assert build["program"] == "webhook" and build["version"] == installed_version()
        rotated = hook.rotate()
        assert value(samples(hook.scrape()), "gpushare_webhook_certificate_expiry_timestamp_seconds") == \
            rotated.not_valid_after_utc.timestamp()

        # /metrics is not on the admission port, and the admission paths are not on the metrics port.
        assert hook.request("GET", "/metrics")[0] == 404
        conn = http.client.HTTPConnection(HOST, hook.metrics_port, timeout=10)
        conn.request("POST", "/mutate", body=b"{}")
        assert conn.getresponse().status == 405
        conn.close()


@pytest.mark.timeout(60)
def test_a_metrics_port_in_use_stops_the_start_with_the_variable_named(tmp_path: Path) -> None:
    with webhook_server(tmp_path / "first") as first:
        taken = f"{HOST}:{first.metrics_port}"
        with pytest.raises(RuntimeError) as failed, webhook_server(tmp_path / "second",
                                                                   {"GPUSHARE_METRICS_BIND": taken}):
            pass
    log = str(failed.value)
    assert f"GPUSHARE_METRICS_BIND={taken} cannot be listened on" in log
    assert "exited with 2" in log


@pytest.mark.timeout(60)
def test_metrics_can_be_turned_off(tmp_path: Path) -> None:
    with webhook_server(tmp_path, {"GPUSHARE_METRICS_BIND": ""}) as hook:
        assert "Serving Prometheus metrics" not in hook.log_text()
        with pytest.raises(OSError):
            hook.scrape(timeout=2)


def test_a_review_the_webhook_cannot_answer_counts_as_an_error(tmp_path: Path) -> None:
    settings = settings_from({"GPUSHARE_SIGNING_KEY": str(tmp_path / "missing.key")})
    metrics = WebhookMetrics()
    with create_app(settings, metrics=metrics).test_client() as client:
        doc = review("CREATE", pod(container("a", 2)), uid="e-1")
        assert client.post("/mutate", data=json.dumps(doc), content_type="application/json").status_code == 200
    from prometheus_client import generate_latest

    s = samples(generate_latest(metrics.registry).decode())
    assert value(s, "gpushare_webhook_reviews_total", endpoint="mutate", operation="CREATE", outcome="error") == 1
    assert value(s, "gpushare_webhook_review_duration_seconds_count", endpoint="mutate") == 1


@pytest.mark.timeout(60)
def test_idle_connections_to_the_metrics_port_hold_no_thread_of_the_arbiter(tmp_path: Path) -> None:
    with webhook_server(tmp_path) as hook:
        hook.scrape()
        task_dir = Path(f"/proc/{hook.process.pid}/task")  # the arbiter serves /metrics
        threads = len(list(task_dir.iterdir()))
        idle = [socket.create_connection((HOST, hook.metrics_port), timeout=10) for _ in range(200)]
        try:
            assert value(samples(hook.scrape()), "gpushare_webhook_worker_processes") == 1
            assert len(list(task_dir.iterdir())) <= threads + 1  # at most the collector pool's second thread
        finally:
            for sock in idle:
                sock.close()


# ---------------------------------------------------------------------------------------------------------
# The wire: connections, TLS handshakes and requests, as each worker process sees them (webhook/server/worker.py).

def test_wire_requests_are_counted_by_endpoint() -> None:
    from prometheus_client import generate_latest

    wire = WireMetrics()
    for path in ("/mutate", "/mutate", "/validate", "/healthz", "/readyz", "/mutate/x"):
        wire.request(path, 0.002)
    wire.handshake("completed", 0.003, resumed=True)
    wire.handshake("completed", 0.004)
    wire.handshake("failed")
    s = samples(generate_latest(wire.registry).decode())
    for endpoint, count in (("mutate", 2), ("validate", 1), ("other", 3)):
        assert value(s, "gpushare_webhook_request_duration_seconds_count", endpoint=endpoint) == count
    assert value(s, "gpushare_webhook_tls_handshakes_total", outcome="completed") == 2
    assert value(s, "gpushare_webhook_tls_handshakes_total", outcome="failed") == 1
    assert value(s, "gpushare_webhook_tls_handshakes_total", outcome="timed_out") == 0
    assert value(s, "gpushare_webhook_tls_sessions_resumed_total") == 1
    assert value(s, "gpushare_webhook_tls_handshake_duration_seconds_count") == 2  # only completed ones are timed


def _wire(hook: RunningWebhook) -> dict[str, float]:
    s = samples(hook.scrape())
    return {
        "accepted": value(s, "gpushare_webhook_connections_accepted_total"),
        **{outcome: value(s, "gpushare_webhook_tls_handshakes_total", outcome=outcome)
           for outcome in ("completed", "failed", "timed_out")},
        "resumed": value(s, "gpushare_webhook_tls_sessions_resumed_total"),
        "handshakes_timed": value(s, "gpushare_webhook_tls_handshake_duration_seconds_count"),
        "mutate": value(s, "gpushare_webhook_request_duration_seconds_count", endpoint="mutate"),
        "other": value(s, "gpushare_webhook_request_duration_seconds_count", endpoint="other"),
        "connections_closed": value(s, "gpushare_webhook_connection_requests_count"),
        "requests_on_closed": value(s, "gpushare_webhook_connection_requests_sum"),
    }


def _delta(hook: RunningWebhook, before: dict[str, float]) -> dict[str, float]:
    return {k: v - before[k] for k, v in _wire(hook).items()}


@pytest.mark.timeout(60)
def test_the_worker_exports_what_it_sees_on_the_wire(tmp_path: Path) -> None:
    """Every worker's wire counters reach the arbiter's /metrics (prometheus multiprocess mode)."""
    with webhook_server(tmp_path, {"GPUSHARE_WORKERS": "2", "GPUSHARE_READ_DEADLINE_SECONDS": "0.5"}) as hook:
        wait_for("the start-up probes' connections to close", lambda: _wire(hook)["connections_closed"] >= 1)
        before = _wire(hook)

        # One kept-alive connection carries three reviews and a health check, then closes.
        conn = http.client.HTTPSConnection(HOST, hook.port, context=hook.ssl_context(), timeout=10)
        for i in range(3):
            body = json.dumps(review("CREATE", pod(container("a", 2), name=f"w-{i}"), uid=f"w-{i}")).encode()
            conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
            res = conn.getresponse()
            res.read()
            assert res.status == 200
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b"ok\n"
        conn.close()
        wait_for("the kept-alive connection to be counted",
                 lambda: _delta(hook, before)["connections_closed"] == 1)
        after = _delta(hook, before)
        assert (after["accepted"], after["completed"], after["handshakes_timed"]) == (1, 1, 1)
        assert (after["mutate"], after["other"], after["requests_on_closed"]) == (3, 1, 4)

        # A client that does not speak TLS, and one that says nothing until the read deadline.
        with socket.create_connection((HOST, hook.port), timeout=10) as plain:
            plain.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            with contextlib.suppress(OSError):  # closed, or reset, without an answer
                plain.recv(1024)
        with socket.create_connection((HOST, hook.port), timeout=10):
            wait_for("the silent connection's handshake to time out",
                     lambda: _delta(hook, before)["timed_out"] == 1)
        after = _delta(hook, before)
        assert (after["accepted"], after["failed"], after["timed_out"], after["completed"]) == (3, 1, 1, 1)
        assert after["connections_closed"] == 1  # a connection without a completed handshake carried no request


def _session(hook: RunningWebhook, context: ssl.SSLContext) -> ssl.SSLSession | None:
    """What a first connection leaves to resume with, after an answer (TLS 1.3 tickets arrive after the handshake)."""
    with socket.create_connection((HOST, hook.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=HOST) as first:
        first.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        while first.recv(1024):
            pass
        return first.session


def _resumes(hook: RunningWebhook, context: ssl.SSLContext, session: ssl.SSLSession | None) -> bool:
    with socket.create_connection((HOST, hook.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=HOST, session=session) as second:
        second.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        while second.recv(1024):
            pass
        return bool(second.session_reused)


@pytest.mark.timeout(60)
def test_tls_sessions_no_client_resumes_are_not_offered_and_a_resumed_one_is_counted(tmp_path: Path) -> None:
    """TLS 1.3, as the API server speaks it: no session ticket (its client would drop it). A TLS 1.2 client may still
    resume by session id, and the worker counts it."""
    with webhook_server(tmp_path) as hook:
        modern = hook.ssl_context()
        session = _session(hook, modern)
        assert session is None or not session.has_ticket
        assert not _resumes(hook, modern, session)

        old = hook.ssl_context()
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        session = _session(hook, old)
        before = _wire(hook)
        assert _resumes(hook, old, session)
        wait_for("the resumed handshake to be counted", lambda: _delta(hook, before)["resumed"] == 1)
        assert _delta(hook, before)["completed"] == 1
