"""The objects `helm test` creates (charts/gpushare/templates/tests/): a pod of our image that runs
gpushare-webhook-selftest, with the least it needs and nothing left once it passes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from charts.version import project_version
from tests.harness.manifests import helm

HOOK = {"helm.sh/hook": "test", "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}
DIGEST = "sha256:" + "0123456789abcdef" * 4


def _hooks(sets: Sequence[str] = (), set_json: Sequence[str] = ()) -> dict[tuple[str, str], dict[str, Any]]:
    everything = helm.template(sets=sets, set_json=set_json, tests=True)
    installed = {(o["kind"], o["metadata"]["name"]) for o in helm.template(sets=sets, set_json=set_json)}
    return {(o["kind"], o["metadata"]["name"]): o for o in everything
            if (o["kind"], o["metadata"]["name"]) not in installed}


def test_helm_test_creates_a_pod_its_account_and_a_role_to_create_pods_in_default_only() -> None:
    hooks = _hooks()
    assert set(hooks) == {("ServiceAccount", "gpushare-helm-test"), ("Role", "gpushare-helm-test"),
                          ("RoleBinding", "gpushare-helm-test"), ("Pod", "gpushare-helm-test")}
    for (kind, _), obj in hooks.items():
        annotations = obj["metadata"]["annotations"]
        assert {k: annotations.get(k) for k in HOOK} == HOOK, kind
        # The account and its permission exist before the pod that uses them.
        assert int(annotations.get("helm.sh/hook-weight", "0")) == (0 if kind == "Pod" else -1), kind
    assert hooks["Role", "gpushare-helm-test"]["metadata"]["namespace"] == "default"
    assert hooks["Role", "gpushare-helm-test"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]
    binding = hooks["RoleBinding", "gpushare-helm-test"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpushare-helm-test",
                                    "namespace": "gpushare-system"}]


@pytest.mark.parametrize(("sets", "image"), [
    ([], f"gpushare:{project_version()}"),
    ([f"image.digest={DIGEST}", "image.repository=registry.example/gpushare"], f"registry.example/gpushare@{DIGEST}"),
])
def test_the_test_pod_runs_the_selftest_in_the_releases_image(sets: list[str], image: str) -> None:
    secrets = [{"name": "registry-a"}]
    pod = _hooks(sets, [f"imagePullSecrets={json.dumps(secrets)}"])["Pod", "gpushare-helm-test"]
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never" and spec["serviceAccountName"] == "gpushare-helm-test"
    assert spec["imagePullSecrets"] == secrets
    (container,) = spec["containers"]
    assert container["image"] == image
    assert container["command"] == ["gpushare-webhook-selftest", "--namespace", "default", "--image", image]
    assert container["envFrom"] == [{"configMapRef": {"name": "gpushare-config"}}]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize(("namespace", "selector", "says"), [
    ("kube-system", [], ["kubectl label node NODE gpushare.io/gpu-memory=device-plugin"]),
    ("gpushare-system", ["devicePlugin.nodeSelector.pool=gpu"],
     ["kubectl label node NODE gpushare.io/gpu-memory=device-plugin pool=gpu",
      "kubectl label namespace gpushare-system pod-security.kubernetes.io/enforce=privileged"]),
])
def test_the_install_notes_give_the_commands_for_these_values(namespace: str, selector: list[str],
                                                              says: list[str]) -> None:
    args = ["install", helm.RELEASE, str(helm.CHART), "--dry-run=client", "--namespace", namespace,
            *helm.kube_version_args()]
    for item in selector:
        args += ["--set", item]
    done = helm.run(args)
    assert done.returncode == 0, done.stderr
    notes = done.stdout.partition("NOTES:")[2]
    for line in says:
        assert line in notes, notes
    assert ("pod-security.kubernetes.io/enforce" in notes) is (namespace == "gpushare-system"), notes
