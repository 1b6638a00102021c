"""Installed beside the reference stack, no object or node label of ours takes one of its names: the chart (every
component on) against the reference's documented install files, read from GPUSHARE_E2E_REFERENCE_SRC. A shared
name would let `kubectl apply` rebind the other stack's role, or make Helm refuse an object it does not own; a shared
node label would start both device plugins on one node."""

from __future__ import annotations

import pytest
import yaml

from e2e.settings import from_environ
from tests.harness.manifests import helm
from tests.harness.manifests.render import Obj

# The reference's install as its READMEs document it: the device plugin's DaemonSet and RBAC, the extender's
# ServiceAccount, RBAC, Deployment and Service in one file (manifests/extender is that extender's own RBAC, applied
# with it, not part of the chart).
REFERENCE_FILES = ("gpushare-device-plugin/device-plugin-ds.yaml", "gpushare-device-plugin/device-plugin-rbac.yaml",
                   "gpushare-scheduler-extender/config/gpushare-schd-extender.yaml")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                  "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                  "DeviceClass"}
EVERY_COMPONENT = ["dra.enabled=true", "monitoring.enabled=true"]


def _reference() -> list[Obj]:
    source = from_environ().reference_src
    if source is None:
        pytest.skip("the reference stack's sources are not available: set GPUSHARE_E2E_REFERENCE_SRC")
    docs: list[Obj] = []
    for name in REFERENCE_FILES:
        docs += [d for d in yaml.safe_load_all((source / name).read_text()) if d]
    return docs


def _key(obj: Obj) -> tuple[str, str, str]:
    meta = obj["metadata"]
    namespace = "" if obj["kind"] in CLUSTER_SCOPED else meta.get("namespace", "default")
    return obj["kind"], namespace, meta["name"]


def _node_labels(objs: list[Obj]) -> set[str]:
    """The label keys the DaemonSets select nodes by."""
    return {key for o in objs if o["kind"] == "DaemonSet"
            for key in (o["spec"]["template"]["spec"].get("nodeSelector") or {})}


def _ours() -> list[Obj]:
    return helm.template(sets=EVERY_COMPONENT)


def test_no_object_of_ours_has_a_name_of_the_reference_install() -> None:
    reference, ours = _reference(), _ours()
    shared = {_key(o) for o in ours} & {_key(o) for o in reference}
    assert not shared, f"objects of the chart named as the reference's documented install: {sorted(shared)}"
    # The cluster-scoped names the reference's files spell are the ones that collided before: held by name.
    assert {"gpushare-device-plugin", "gpushare-schd-extender"} <= {
        o["metadata"]["name"] for o in reference if o["kind"] == "ClusterRole"}


def test_no_daemonset_of_ours_selects_a_node_label_of_the_reference() -> None:
    reference, ours = _node_labels(_reference()), _node_labels(_ours())
    assert reference == {"gpushare"}
    assert ours and not ours & reference, f"our DaemonSets select {sorted(ours)}, the reference's {sorted(reference)}"

