"""The optional DRA component: a DeviceClass selecting our driver, the driver's RBAC for the device plugin's
ServiceAccount, and the policy that keeps it to its own node's ResourceSlice (proven on the real tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.keys import DRA_DRIVER
from tests.harness.manifests.render import render_with_component


@pytest.mark.parametrize("overlay", ["self-signed", "cert-manager"])
def test_the_component_adds_the_class_the_rbac_and_the_policy(overlay: str, tmp_path: Path) -> None:
    objs = render_with_component(overlay, "dra", tmp_path)
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    device_class = by_kind["DeviceClass", DRA_DRIVER]
    assert device_class["apiVersion"] == "resource.k8s.io/v1"
    assert [s["cel"]["expression"] for s in device_class["spec"]["selectors"]] == [f'device.driver == "{DRA_DRIVER}"']
    plugin_sa = next(o for o in objs if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"]
    binding = by_kind["ClusterRoleBinding", "gpushare-dra-plugin"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": plugin_sa, "namespace": "gpushare-system"}]
    rules = by_kind["ClusterRole", "gpushare-dra-plugin"]["rules"]
    assert {r for rule in rules for r in rule["resources"]} == {"resourceclaims", "resourceslices"}
    policy = by_kind["ValidatingAdmissionPolicy", "gpushare-dra-own-node-slices"]
    assert f"system:serviceaccount:gpushare-system:{plugin_sa}" in policy["spec"]["matchConditions"][0]["expression"]
    for name in ("gpushare-dra-own-node-slices", "gpushare-dra-one-share-per-request"):
        assert by_kind["ValidatingAdmissionPolicy", name]["spec"]["failurePolicy"] == "Fail"
        assert by_kind["ValidatingAdmissionPolicyBinding", name]["spec"]["policyName"] == name
