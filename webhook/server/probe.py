"""`gpushare-webhook-probe /readyz` (or `/healthz`): the webhook container's own probe, over loopback.

The kubelet's httpGet probes come from the node's address on the pod network, which is neither known here nor the
API server's, so GPUSHARE_ADMISSION_SOURCES would drop them (webhook/server/sourcefilter.py). This probe runs inside the
container (an exec probe) and connects to the admission port from loopback, which the filter always admits. Like the
kubelet's HTTPS probes it does not verify the serving certificate: it asks whether the server answers, and the
server's /readyz checks the certificate itself. Exit 0 on a 2xx answer, 1 otherwise, with the reason on stdout
(the kubelet puts it in the pod's Unhealthy event). Imports nothing of the webhook, so it starts in a few tens of
milliseconds.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import ssl
import sys
from collections.abc import Mapping, Sequence

from common.cli import Variable

PATHS = ("/readyz", "/healthz")
# The webhook's one setting the probe reads (webhook/server/settings.py WEBHOOK_VARIABLES has its full text).
PROBE_VARIABLES = (Variable("GPUSHARE_BIND", "127.0.0.1:8443", "the webhook's listen address; the probe connects "
                            "to loopback for a wildcard host"),)
# The default wait for the answer; the manifests give each probe a --timeout under its timeoutSeconds, so the kubelet
# reads our reason rather than its own timeout (manifests/base/webhook.yaml).
TIMEOUT = 1.5


def target(bind: str) -> tuple[str, int]:
    """Where to connect for GPUSHARE_BIND: loopback for a wildcard address, else the bound address itself."""
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    if host in ("0.0.0.0", ""):
        return "127.0.0.1", int(port)
    if host == "::":
        return "::1", int(port)
    return host, int(port)


def probe(path: str, environ: Mapping[str, str], timeout: float = TIMEOUT) -> tuple[bool, str]:
    bind = environ.get("GPUSHARE_BIND", "127.0.0.1:8443").strip()
    try:
        host, port = target(bind)
    except ValueError:
        return False, f"GPUSHARE_BIND={bind!r} is not HOST:PORT"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    try:
        conn.request("GET", path, headers={"User-Agent": "gpushare-webhook-probe"})
        res = conn.getresponse()
        body = res.read(4096).decode("utf-8", "replace").strip()
    except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
        return False, f"{path} on {host}:{port} did not answer: {exc}"
    finally:
        conn.close()
    return 200 <= res.status < 300, f"{path} on {host}:{port}: HTTP {res.status}: {body}"


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    from common import cli  # argparse and the package metadata only here, not for an import of target()

    args = cli.parser("gpushare-webhook-probe", "Ask the webhook in this container whether it is ready (/readyz) or "
                      "alive (/healthz), from loopback.", PROBE_VARIABLES)
    args.add_argument("path", choices=PATHS)
    args.add_argument("--timeout", type=_seconds, default=TIMEOUT, metavar="SECONDS",
                      help=f"how long to wait for the answer (default {TIMEOUT}); keep it under the probe's "
                           "timeoutSeconds")
    try:
        parsed = args.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    ok, said = probe(parsed.path, os.environ if environ is None else environ, parsed.timeout)
    print(said)
    return 0 if ok else 1


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 60:
        raise ValueError(text)
    return value


def bound_host(bind: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """The one address the admission port is bound to, when it is neither a wildcard nor loopback: the probe
    connects there from the container itself, so the filter admits it with loopback (webhook/server/worker.py)."""
    host = target(bind)[0]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return None if address.is_loopback else ipaddress.ip_network(address)


if __name__ == "__main__":
    sys.exit(main())
