"""`gpushare-certs install` against the test API server: Secrets, ConfigMap and caBundle, then a trusted call."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from certs.cli import main as certs_main
from tests.harness.apiserver.configs import project_webhook_objects
from tests.harness.apiserver.fakehook import FakeWebhook
from tests.harness.apiserver.server import ApiServer
from tests.harness.apiserver.status import ApiError
from tests.harness.tls import CertPair

pytestmark = pytest.mark.timeout(120)

HOOK_KEYS = ("mutatingwebhookconfigurations.admissionregistration.k8s.io",
             "validatingwebhookconfigurations.admissionregistration.k8s.io")
GPU_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu"},
           "spec": {"containers": [{"name": "main", "image": "cuda",
                                    "resources": {"limits": {"aliyun.com/gpu-mem": "8"}}}]}}


def test_install_makes_the_api_server_trust_the_webhook(tmp_path: Path) -> None:
    with ApiServer() as api:
        assert api.load_webhook_configurations(project_webhook_objects()) == [
            "MutatingWebhookConfiguration/gpushare-webhook", "ValidatingWebhookConfiguration/gpushare-webhook"]
        admin = api.client()
        with pytest.raises(ApiError) as caught:  # no caBundle and nothing routed yet: GPU pods fail closed
            admin.create_pod("default", GPU_POD)
        assert caught.value.code == 500

        kubeconfig = api.write_kubeconfig(tmp_path / "admin.kubeconfig")
        assert certs_main(["install", "--kubeconfig", str(kubeconfig)]) == 0
        tls = admin.get("secrets", "gpushare-webhook-tls", "gpushare-system")["data"]
        assert admin.get("configmaps", "gpushare-verify-key", "gpushare-system")["data"]["signing.pub"]
        bundles = {admin.get(key, "gpushare-webhook")["webhooks"][0]["clientConfig"]["caBundle"] for key in HOOK_KEYS}
        assert len(bundles) == 1

        # Serve exactly the certificate the CLI stored; the chain verifies it for gpushare-webhook.gpushare-system.svc
        # against the caBundle the CLI patched in.
        pair = CertPair(base64.b64decode(tls["tls.crt"]), base64.b64decode(tls["tls.key"]))
        with FakeWebhook(pair) as hook:
            api.add_service("gpushare-system", "gpushare-webhook", 443, hook.url)
            assert admin.create_pod("default", GPU_POD)["metadata"]["name"] == "gpu"
            assert hook.paths() == ["/mutate"]  # a GPU-share pod's CREATE: one call (webhook/rules/admit.py)

        assert certs_main(["install", "--kubeconfig", str(kubeconfig)]) == 0  # idempotent: resumes, changes nothing
        assert {admin.get(key, "gpushare-webhook")["webhooks"][0]["clientConfig"]["caBundle"]
                for key in HOOK_KEYS} == bundles
