"""Idle connections from other clients do not lock the real API server out of the webhook.

The review's attack: open thousands of TLS connections to the webhook's port, send one `GET /healthz` on each,
then stay silent. Each webhook process holds at most gunicorn's worker_connections, so before the connection
limits gave way (webhook/server/worker.py) the API server's new connections were reset: GPU-share pods were refused
(their entries fail closed) and ordinary pods went unneutralised (fail open). Here 2,000 such connections from one
address, then 200 from each of ten addresses, are held while GPU-share and ordinary pods are created through the real
API server, which calls the webhook from 127.0.0.1; every creation must be admitted, stamped or neutralised.
The pods carry a scheduling gate: admitted and stored, never scheduled, so they take no GPU and no time on the node.
"""

from __future__ import annotations

import http.client
import resource
import ssl
import sys
import time
from typing import Any

from e2e import settings as ports
from e2e.cluster import Cluster
from e2e.kube import Rest
from tests.e2e.test_refusals import scrape
from tests.harness.realtier import workloads as w
from tests.harness.webhook.stalled_clients import open_idle

CREATES = 20  # pods created through the API server while the connections are held, half of them GPU-share
FLOODS = {"one address, 2,000 connections": [("127.0.0.2", 2000)],
          "ten addresses, 200 connections each": [(f"127.0.0.{i}", 200) for i in range(3, 13)]}


def _client() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # an attacker does not care whom it talks to
    return context


def _gated(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["schedulingGates"] = [{"name": "gpushare.io/e2e-admission-only"}]
    return pod


def _admin(cluster: Cluster) -> Rest:
    pki = cluster.pki_dir
    return Rest(cluster.server, pki / "ca.crt", client=(pki / "admin.crt", pki / "admin.key"), timeout=30)


def test_idle_connections_leave_the_api_servers_calls_answered(cluster: Cluster, kubectl: Any,
                                                               namespace: str) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    port, context, api = cluster.settings.port(ports.WEBHOOK), _client(), _admin(cluster)
    img = w.image(cluster)
    for flood, sources in FLOODS.items():
        held: list[http.client.HTTPSConnection] = []
        try:
            for source, count in sources:
                held += [c for c in (open_idle(port, context, source) for _ in range(count)) if c is not None]
            seconds: list[float] = []
            for i in range(CREATES):
                gpu = i % 2 == 0
                spec = _gated(w.pod(f"f{len(seconds)}-{int(time.time() * 1000) % 10**8}",
                                    [w.container("main", img, 4 if gpu else None)]))
                started = time.monotonic()
                made = api.call("POST", f"/api/v1/namespaces/{namespace}/pods", spec)
                seconds.append(time.monotonic() - started)
                annotations = w.annotations_of(made)
                if gpu:
                    assert "gpushare.io/intent" in annotations, f"{flood}: a GPU-share pod was not stamped"
                else:
                    env = {e["name"]: e.get("value") for e in made["spec"]["containers"][0].get("env") or []}
                    if cluster.delivery == "env":
                        assert env.get("NVIDIA_VISIBLE_DEVICES") == "void", f"{flood}: not neutralised: {env}"
            seconds.sort()
            counts = scrape(cluster.settings.port(ports.WEBHOOK_METRICS))
            evicted = sum(v for (n, _), v in counts.items() if n == "gpushare_webhook_connections_evicted_total")
            refused = sum(v for (n, _), v in counts.items() if n == "gpushare_webhook_connections_refused_total")
            # The flood's own connections gave way to newcomers; none was refused (each address had idle ones).
            assert evicted > 0 and refused == 0, counts
            print(f"\n{flood}: {len(held)} connections opened (each answered once, then idle); {CREATES} "
                  f"creations through the API server all admitted; seconds per creation: median "
                  f"{seconds[len(seconds) // 2]:.3f}, slowest {seconds[-1]:.3f}; connections given up so far "
                  f"{evicted:.0f}, refused {refused:.0f}", file=sys.stderr)
        finally:
            for conn in held:
                conn.close()
    kubectl.ok(["delete", "pods", "--all", "-n", namespace, "--wait=false"])
