"""The webhook end to end: gunicorn over TLS with keep-alive connections, loaded by wrk, /healthz as the baseline.

Run: .venv/bin/python -m bench.bench_webhook_http [--seconds 5] [--workers 2 --threads 4]
Starts the real server (gunicorn.conf.py, our asyncio worker, development certificates in a temporary directory)
on a free 127.0.0.1 port and posts a realistic ~6 KB Deployment pod review (bench/workload.py) to /mutate. The
baseline, measured against the same server in the same run, is GET /healthz: what the server costs by itself.
Also shown: how the CPU time of the mutate run spread over the worker processes (keep-alive connections stay on
the process that accepted them). Exits 1 when a target is missed, 2 when wrk is missing (./dev bench installs it).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.workload import create_review, deployment_pod
from webhook.serve import GUNICORN_CONF, prepare_dev

TARGETS = {"ratio": 0.75, "p99_ms": 3.0, "rps": 1500.0}
_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, timeout: float = 30.0) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as raw, \
                    context.wrap_socket(raw) as tls:
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if tls.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"the webhook did not answer /healthz on 127.0.0.1:{port} within {timeout:g} s")


def workers_of(arbiter: int) -> list[int]:
    children = Path(f"/proc/{arbiter}/task/{arbiter}/children")
    return [int(p) for p in children.read_text().split()] if children.exists() else []


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def wrk(url: str, connections: int, threads: int, seconds: float, script: Path | None) -> tuple[float, float]:
    """(requests per second, p99 in ms) of one wrk run; any non-2xx answer or socket error ends the benchmark."""
    args = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds:g}s", "--latency", url]
    if script is not None:
        args[1:1] = ["-s", str(script)]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=seconds + 30).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise SystemExit(f"wrk saw failed requests against {url}:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    value, unit = re.search(r"\s99%\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
    return rps, float(value) * _UNITS[unit]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=0, help="GPUSHARE_WORKERS (default: the server's default)")
    parser.add_argument("--threads", type=int, default=0, help="GPUSHARE_THREADS (default: the server's default)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is not installed; run ./dev bench (it installs it) or apt-get install wrk", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHARE_")}
        prepare_dev(Path(tmp) / "certs", env)
        port = free_port()
        env["GPUSHARE_BIND"] = f"127.0.0.1:{port}"
        if args.workers:
            env["GPUSHARE_WORKERS"] = str(args.workers)
        if args.threads:
            env["GPUSHARE_THREADS"] = str(args.threads)
        body = Path(tmp) / "review.json"
        body.write_bytes(create_review(deployment_pod()))
        script = Path(tmp) / "post.lua"
        script.write_text(
            'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f'local f = io.open("{body}", "rb")\nwrk.body = f:read("*a")\nf:close()\n'
        )
        with open(Path(tmp) / "server.log", "wb") as log:
            server = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF)], env=env,
                                      stdout=log, stderr=log)
        try:
            wait_ready(port)
            base = f"https://127.0.0.1:{port}"
            wrk(base + "/mutate", 8, 2, 1.0, script)  # warm up every worker and connection path
            health_rps, health_p99 = wrk(base + "/healthz", 8, 2, args.seconds, None)
            workers = workers_of(server.pid)
            before = {pid: cpu_ticks(pid) for pid in workers}
            mutate_rps, mutate_p99_c8 = wrk(base + "/mutate", 8, 2, args.seconds, script)
            spent = {pid: cpu_ticks(pid) - before[pid] for pid in workers}
            _, p99_c1 = wrk(base + "/mutate", 1, 1, args.seconds, script)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    ratio = mutate_rps / health_rps
    total = sum(spent.values()) or 1
    spread = " / ".join(f"{100 * t / total:.0f}%" for t in sorted(spent.values(), reverse=True))
    print(f"webhook over TLS, keep-alive, {len(workers)} worker processes, {os.cpu_count()} CPUs")
    print(f"{'':<40} {'measured':>12} {'target':>12}")
    rows = [
        ("/healthz req/s, concurrency 8 (baseline)", f"{health_rps:,.0f}", "", True),
        ("/mutate req/s, concurrency 8", f"{mutate_rps:,.0f}", f">= {TARGETS['rps']:,.0f}",
         mutate_rps >= TARGETS["rps"]),
        ("mutate / healthz throughput", f"{ratio:.2f}", f">= {TARGETS['ratio']}", ratio >= TARGETS["ratio"]),
        ("/mutate p99 ms, concurrency 1", f"{p99_c1:.2f}", f"< {TARGETS['p99_ms']:g}", p99_c1 < TARGETS["p99_ms"]),
        ("/mutate p99 ms, concurrency 8", f"{mutate_p99_c8:.2f}", "", True),
        ("/healthz p99 ms, concurrency 8", f"{health_p99:.2f}", "", True),
        ("mutate CPU time per worker process", spread, "", True),
    ]
    for name, value, target, met in rows:
        print(f"{name:<40} {value:>12} {target:>12} {'' if met else 'MISSED'}")
    return 0 if all(met for *_, met in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
