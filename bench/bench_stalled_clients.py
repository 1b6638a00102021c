"""Legitimate reviews while clients stall mid-request: our worker against gunicorn's gthread, in the same run.

Run: .venv/bin/python -m bench.bench_stalled_clients [--requests N] [--stalled N] [--seconds S]
Starts the real server over TLS (2 processes x 4 threads, as deployed) once with gthread (the baseline) and once
with webhook.server.worker, and prints for each: mutate latency p50/p99 over a kept-alive connection without and with
N stalled connections (a third each mid-handshake, mid-headers, mid-body), and throughput at concurrency 8.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from tests.harness.pods import container, pod, review
from tests.harness.webhook.server import HOST, RunningWebhook, webhook_server
from tests.harness.webhook.stalled_clients import KINDS, Stalled, close_all, open_one

BODY = json.dumps(review("CREATE", pod(container("main", 2), container("side", 1), container("cpu"),
                                       inits=[container("load", 1)]))).encode()
HEADERS = {"Content-Type": "application/json"}
ENV = {"GPUSHARE_WORKERS": "2", "GPUSHARE_THREADS": "4", "GPUSHARE_READ_DEADLINE_SECONDS": "30",
       "GPUSHARE_LOG_LEVEL": "WARNING"}


def latencies(hook: RunningWebhook, count: int, timeout: float, fresh: bool = False) -> tuple[list[float], int]:
    """Sequential mutate reviews over kept-alive connections, or each on a new one (`fresh`: timed from its connect):
    (seconds of each answered one, how many failed)."""
    out: list[float] = []
    failed = 0
    conn: http.client.HTTPSConnection | None = None
    for _ in range(count):
        start = time.perf_counter()
        conn = conn or http.client.HTTPSConnection(HOST, hook.port, context=hook.ssl_context(), timeout=timeout)
        try:
            conn.request("POST", "/mutate", body=BODY, headers=HEADERS)
            res = conn.getresponse()
            res.read()
            if res.status != 200:
                raise http.client.HTTPException(res.status)
            out.append(time.perf_counter() - start)
        except (OSError, http.client.HTTPException):
            failed += 1
            fresh_one = True
        else:
            fresh_one = fresh
        if fresh_one:
            conn.close()
            conn = None
    if conn is not None:
        conn.close()
    return out, failed


def throughput(hook: RunningWebhook, seconds: float, clients: int = 8) -> float:
    done = [0] * clients
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        conn = http.client.HTTPSConnection(HOST, hook.port, context=hook.ssl_context(), timeout=10)
        while time.monotonic() < stop:
            conn.request("POST", "/mutate", body=BODY, headers=HEADERS)
            conn.getresponse().read()
            done[i] += 1
        conn.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / seconds


def open_stalled(hook: RunningWebhook, count: int) -> list[Stalled]:
    """Like the stall test's; once the server is stuck (a handshake times out), the rest stall mid-handshake,
    which needs no answer from the server."""
    out: list[Stalled] = []
    stuck = False
    for i in range(count):
        kind = "handshake" if stuck else KINDS[i % len(KINDS)]
        try:
            out.append(open_one(hook.port, hook.ssl_context(), kind, timeout=2.0))
        except OSError:
            stuck = True
            out.append(open_one(hook.port, hook.ssl_context(), "handshake"))
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def stall_phase(name: str, hook: RunningWebhook, args: argparse.Namespace) -> dict[str, float]:
    stalled = open_stalled(hook, args.stalled)
    try:
        # gthread never answers while its threads are held: a few tries with a short timeout say so.
        count = args.requests if name != "gthread" else 5
        busy, _ = latencies(hook, count, 2.0 if name == "gthread" else 5.0)
    finally:
        close_all(stalled)
    return {"opened": len(stalled), "answered": len(busy), "tried": count,
            "stall_p50": pct(busy, 0.5), "stall_p99": pct(busy, 0.99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--stalled", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kinds = {"gthread": ["-k", "gthread"], "webhook.server.worker": []}
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        hooks = {name: stack.enter_context(webhook_server(Path(tmp) / name, ENV, gunicorn_args=extra))
                 for name, extra in kinds.items()}
        calm: dict[str, list[float]] = {name: [] for name in hooks}
        rates: dict[str, list[float]] = {name: [] for name in hooks}
        for hook in hooks.values():
            latencies(hook, 50, 5.0)  # warm up
        for _ in range(args.rounds):  # interleaved, so the machine's other load falls on both alike
            for name, hook in hooks.items():
                calm[name] += latencies(hook, args.requests // args.rounds, 5.0)[0]
                rates[name].append(throughput(hook, args.seconds))
        for name, hook in hooks.items():
            rows[name] = {"p50": pct(calm[name], 0.5), "p99": pct(calm[name], 0.99),
                          "rate": statistics.median(rates[name]), **stall_phase(name, hook, args)}
    base = rows["gthread"]
    print(f"mutate over TLS, 2 processes x 4 threads; {args.rounds} interleaved rounds; then {args.stalled} "
          f"connections stalled mid-handshake/headers/body")
    print(f"{'worker':16} {'p50 ms':>8} {'p99 ms':>8} {'req/s c8':>9} {'x gthread':>9} {'stalled':>7} "
          f"{'answered':>12} {'p50 ms':>8} {'p99 ms':>8} {'p99 x calm':>10}")
    for name, r in rows.items():
        print(f"{name:16} {r['p50']:8.2f} {r['p99']:8.2f} {r['rate']:9.0f} {r['rate'] / base['rate']:9.2f} "
              f"{int(r['opened']):>7} {int(r['answered']):>5} of {int(r['tried']):<4} "
              f"{r['stall_p50']:8.2f} {r['stall_p99']:8.2f} {r['stall_p99'] / r['p99']:10.2f}")


if __name__ == "__main__":
    main()
