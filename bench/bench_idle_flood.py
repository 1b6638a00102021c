"""A review from a fresh client while other clients hold thousands of idle kept-alive connections, in the same run.

Run: .venv/bin/python -m bench.bench_idle_flood [--requests N] [--idle N] [--rounds N]
Starts the real server over TLS as deployed (2 processes, gunicorn's worker_connections 1000 each,
GPUSHARE_MAX_CONNECTIONS_PER_CLIENT at its default) and times mutate reviews, each on a new connection from
127.0.0.1 (connect, TLS handshake, request, answer), as the API server's client does when it needs one more:
without other clients, then while one client address (127.0.0.2) holds N idle connections (one GET /healthz each,
then silence), then while ten addresses (127.0.0.2-11) hold N/10 each; the three in turn, round after round, so the
machine's other load falls on all alike. Before webhook/server/connlimits.py, past 1000 connections in a process its new
connections were refused.
"""

from __future__ import annotations

import argparse
import http.client
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.bench_stalled_clients import latencies, pct
from tests.harness.webhook.server import RunningWebhook, webhook_server
from tests.harness.webhook.stalled_clients import open_idle, still_open

ENV = {"GPUSHARE_WORKERS": "2", "GPUSHARE_LOG_LEVEL": "WARNING"}


def fresh_reviews(hook: RunningWebhook, count: int) -> tuple[list[float], int]:
    """`count` mutate reviews, each on a new connection: (seconds of each answered one, how many failed)."""
    return latencies(hook, count, 5.0, fresh=True)


def flood(hook: RunningWebhook, sources: list[str], each: int) -> list[http.client.HTTPSConnection]:
    held = []
    for source in sources:
        for _ in range(each):
            conn = open_idle(hook.port, hook.ssl_context(), source)
            if conn is not None:
                held.append(conn)
    return held


def counter(hook: RunningWebhook, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", hook.scrape(), re.MULTILINE))


class Phase:
    """Reviews timed while `hold()`'s connections are held, summed over rounds."""

    def __init__(self, hold: Callable[[], list[http.client.HTTPSConnection]]) -> None:
        self.hold = hold
        self.answered: list[float] = []
        self.failed = self.opened = self.kept = 0
        self.evicted = 0.0

    def run(self, hook: RunningWebhook, count: int) -> None:
        evicted = counter(hook, "gpushare_webhook_connections_evicted_total")
        held = self.hold()
        try:
            answered, failed = fresh_reviews(hook, count)
            self.kept += sum(1 for conn in held if conn.sock is not None and still_open(conn.sock))
        finally:
            for conn in held:
                conn.close()
        self.opened += len(held)
        self.answered += answered
        self.failed += failed
        self.evicted += counter(hook, "gpushare_webhook_connections_evicted_total") - evicted


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, webhook_server(Path(tmp), ENV) as hook:
        fresh_reviews(hook, 50)  # warm up
        ten = [f"127.0.0.{i}" for i in range(2, 12)]
        phases = {
            "no other clients": Phase(list),
            f"{args.idle} idle from 1 address": Phase(lambda: flood(hook, ["127.0.0.2"], args.idle)),
            f"{args.idle // 10} idle from each of 10": Phase(lambda: flood(hook, ten, args.idle // 10)),
        }
        for _ in range(args.rounds):
            for each in phases.values():
                each.run(hook, args.requests // args.rounds)
    base = pct(phases["no other clients"].answered, 0.99)
    print(f"mutate on a fresh TLS connection from 127.0.0.1; {args.rounds} interleaved rounds; 2 processes x 1000 "
          "connections, the per-client limit at its default; opened, kept and evicted are summed over the rounds")
    print(f"{'while':28} {'opened':>6} {'kept':>5} {'evicted':>7} {'answered':>12} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'p99 x calm':>10}")
    for name, p in phases.items():
        tried = len(p.answered) + p.failed
        print(f"{name:28} {p.opened:>6} {p.kept:>5} {int(p.evicted):>7} {len(p.answered):>5} of {tried:<4} "
              f"{pct(p.answered, 0.5):7.2f} {pct(p.answered, 0.99):7.2f} {pct(p.answered, 0.99) / base:10.2f}")


if __name__ == "__main__":
    main()
