"""`gpushare-webhook-selftest`: ask the API server to admit a GPU-share pod (a server-side dry run) and check that
the webhook stamped it, which is what `helm test` runs (charts/gpushare/templates/tests/).

The pod goes the way every user's pod goes: the API server calls the mutating webhook through its Service (on
every path: GPU-share pods are never admitted in-process alone), then the validating entries; `dryRun=All` stops
before anything is stored, so nothing is scheduled or left behind. It reads the shared settings (the ConfigMap
gpushare-config, with envFrom) for the resource name and the annotation prefix, and talks to the API server with
the pod's ServiceAccount token over the in-cluster address, as client-go's rest.InClusterConfig does
(k8s.io/client-go/rest/config.go). Standard library only: it starts in a few tens of milliseconds.
"""

from __future__ import annotations

import http.client
import json
import ssl
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.cli import Variable
from common.settings import SettingsError
from contract.errors import ProtocolError
from contract.settings import CONTRACT_VARIABLES, Contract, contract_from

ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SELFTEST_VARIABLES = (
    Variable("KUBERNETES_SERVICE_HOST", "", "the API server's in-cluster address (set by the kubelet)", True),
    Variable("KUBERNETES_SERVICE_PORT", "443", "its port (set by the kubelet)"),
    *CONTRACT_VARIABLES,
)
TIMEOUT = 30.0  # the API server's own budget for the webhook calls of one request is 10 s each


@dataclass(frozen=True)
class SelfTest:
    host: str
    port: int
    contract: Contract


class SelfTestError(Exception):
    """What went wrong, as one sentence with what to check."""


def settings_from(env: Mapping[str, str]) -> SelfTest:
    host = env.get("KUBERNETES_SERVICE_HOST", "").strip()
    if not host:
        raise SelfTestError("KUBERNETES_SERVICE_HOST is not set: run this inside a pod (helm test does).")
    port = env.get("KUBERNETES_SERVICE_PORT", "443").strip()
    if not port.isdigit():
        raise SelfTestError(f"KUBERNETES_SERVICE_PORT={port!r} is not a port number.")
    try:
        contract = contract_from(env)
    except (ProtocolError, SettingsError) as exc:
        raise SelfTestError(f"The shared settings are not valid: {exc}") from exc
    return SelfTest(host, int(port), contract)


def probe_pod(namespace: str, image: str, contract: Contract) -> dict[str, Any]:
    """The smallest GPU-share pod: one container asking one unit."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "gpushare-selftest", "namespace": namespace},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": image, "resources": {"limits": {contract.resource: "1"}}}]}}


def judge(status: int, body: bytes, namespace: str, contract: Contract) -> str:
    """The sentence for a passing answer; SelfTestError for any other."""
    where = f"the GPU-share pod {namespace}/gpushare-selftest"
    try:
        doc = json.loads(body)
    except ValueError:
        doc = {}
    if status not in (200, 201):
        message = doc.get("message") if isinstance(doc, dict) else None
        detail = message if isinstance(message, str) and message else repr(body[:300])
        raise SelfTestError(f"The API server did not admit {where} (HTTP {status}): {detail}. "
                            "Check the webhook pods (kubectl -n gpushare-system get pods) and "
                            "docs/troubleshooting.md.")
    annotations = (doc.get("metadata") or {}).get("annotations") or {}
    stamp = annotations.get(contract.intent_key)
    if not stamp:
        raise SelfTestError(f"The API server admitted {where} without {contract.intent_key}: the mutating webhook "
                            "was not called. Check `kubectl get mutatingwebhookconfiguration -l "
                            "app.kubernetes.io/part-of=gpushare -o yaml` (its service and caBundle).")
    return f"The API server admitted {where} through the webhook's Service, stamped {contract.intent_key}={stamp}."


def run(settings: SelfTest, namespace: str, image: str, account: Path = ACCOUNT) -> str:
    try:
        token = (account / "token").read_text().strip()
        context = ssl.create_default_context(cafile=str(account / "ca.crt"))
    except OSError as exc:
        raise SelfTestError(f"The pod's ServiceAccount token or CA is missing ({exc}): the test pod needs "
                            "automountServiceAccountToken.") from exc
    pod = probe_pod(namespace, image, settings.contract)
    conn = http.client.HTTPSConnection(settings.host, settings.port, timeout=TIMEOUT, context=context)
    try:
        conn.request("POST", f"/api/v1/namespaces/{namespace}/pods?dryRun=All&fieldManager=gpushare-selftest",
                     body=json.dumps(pod), headers={"Authorization": f"Bearer {token}",
                                                    "Content-Type": "application/json",
                                                    "User-Agent": "gpushare-webhook-selftest"})
        res = conn.getresponse()
        body = res.read()
    except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
        raise SelfTestError(f"The API server at {settings.host}:{settings.port} did not answer: {exc}.") from exc
    finally:
        conn.close()
    return judge(res.status, body, namespace, settings.contract)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    import os

    from common import cli

    args = cli.parser("gpushare-webhook-selftest", "Check, with a server-side dry run, that the API server admits a "
                      "GPU-share pod through the webhook and that the webhook stamps it.", SELFTEST_VARIABLES)
    args.add_argument("--namespace", default="default", help="where the dry-run pod is created (default: default)")
    args.add_argument("--image", required=True, help="the dry-run pod's image (never pulled)")
    try:
        parsed = args.parse_args(argv)
        said = run(settings_from(os.environ if environ is None else environ), parsed.namespace, parsed.image)
    except SystemExit as exc:
        return int(exc.code or 0)
    except SelfTestError as exc:
        print(exc)
        return 1
    print(said)
    return 0


if __name__ == "__main__":
    sys.exit(main())
