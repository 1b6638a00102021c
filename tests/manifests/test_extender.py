"""manifests/extender: the extender's identity is the one the webhook trusts, with the rights its bind needs."""

from __future__ import annotations

from pathlib import Path

import yaml

EXTENDER = Path(__file__).resolve().parents[2] / "manifests" / "extender"
CONFIG = Path(__file__).resolve().parents[2] / "manifests" / "base" / "config.yaml"


def test_the_extender_service_account_is_the_trusted_identity() -> None:
    docs = list(yaml.safe_load_all((EXTENDER / "rbac.yaml").read_text()))
    [account] = [d for d in docs if d["kind"] == "ServiceAccount"]
    trusted = yaml.safe_load(CONFIG.read_text())["data"]["GPUSHARE_EXTENDER_IDENTITIES"].split(",")
    identity = f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"
    assert identity in trusted
    [binding] = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": account["metadata"]["namespace"]}]


def test_the_extender_may_annotate_and_bind_pods() -> None:
    docs = list(yaml.safe_load_all((EXTENDER / "rbac.yaml").read_text()))
    [role] = [d for d in docs if d["kind"] == "ClusterRole"]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert {("pods", "update"), ("pods", "patch"), ("pods/binding", "create"), ("nodes", "list")} <= granted


def test_the_scheduler_configuration_hands_gpu_share_pods_to_the_extender() -> None:
    config = yaml.safe_load((EXTENDER / "scheduler-config.yaml").read_text())
    [extender] = config["extenders"]
    assert config["kind"] == "KubeSchedulerConfiguration" and extender["bindVerb"] == "bind"
    assert extender["managedResources"] == [{"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False}]
    assert extender["ignorable"] is False
