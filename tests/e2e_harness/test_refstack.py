"""The reference stack's wiring on the tier (the reference plugin's RBAC, the extender's namespace, forwarder and
environment), the reference algorithm's decision the simulated baseline runs (e2e.refalloc), the audit-log reader and
the scheduler configuration the tier renders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from contract import ASSIGNED, ASSUME_TIME, IDX
from e2e import audit, extender
from e2e.control import EXTENDER_USER, scheduler_config
from e2e.refalloc import decide
from e2e.refstack import reference_rbac
from e2e.settings import from_environ
from node.inventory import fake_gpus

GPUS = fake_gpus("2x16GiB", "node-a", "GiB")
RESOURCE = "aliyun.com/gpu-mem"


def pod(name: str, units: list[int], *, assume: int = 1, assigned: str = "false", idx: str = "1",
        node: str = "node-a", phase: str = "Pending") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": {IDX: idx, ASSIGNED: assigned, ASSUME_TIME: str(assume)}},
            "spec": {"nodeName": node, "containers": [
                {"name": f"c{i}", "resources": {"limits": {RESOURCE: str(u)}}} for i, u in enumerate(units)]},
            "status": {"phase": phase}}


@pytest.mark.parametrize(("pods", "units", "gpus", "visible", "chosen"), [
    # The oldest assumed pod with the same total wins, whichever pod the kubelet is admitting.
    ([pod("late", [4], assume=9, idx="0"), pod("early", [4], assume=2, idx="1")], 4, GPUS, GPUS[1].uuid, "early"),
    # A pod of two containers never matches one container's request: a made-up device.
    ([pod("two", [2, 2])], 2, GPUS, "no-gpu-has-2GiB-to-run", None),
    ([pod("done", [4], assigned="true")], 4, GPUS, "no-gpu-has-4GiB-to-run", None),
    ([pod("elsewhere", [4], node="node-b")], 4, GPUS, "no-gpu-has-4GiB-to-run", None),
    ([pod("bad-index", [4], idx="7")], 4, GPUS, "no-gpu-has-4GiB-to-run", None),
    # On a one-GPU node the reference skips the search and hands out that GPU.
    ([], 4, GPUS[:1], GPUS[0].uuid, None),
])
def test_decide(pods: list[dict[str, Any]], units: int, gpus: list[Any], visible: str, chosen: str | None) -> None:
    decision = decide(pods, "node-a", units, gpus, resource=RESOURCE, unit="GiB")
    assert decision.visible == visible
    assert (decision.pod or {}).get("metadata", {}).get("name") == chosen


def event(verb: str, name: str, code: int, body: Any, user: str = EXTENDER_USER, sub: str = "") -> str:
    ref = {"resource": "pods", "namespace": "ns", "name": name, **({"subresource": sub} if sub else {})}
    return json.dumps({"stage": "ResponseComplete", "verb": verb, "user": {"username": user}, "objectRef": ref,
                       "responseStatus": {"code": code, "message": "denied: no" if code >= 400 else ""},
                       "requestObject": body})


def test_audit_lists_the_extender_writes_with_keys_and_verdicts() -> None:
    lines = [
        event("patch", "a", 200, {"metadata": {"annotations": {IDX: "0", ASSIGNED: "false", "other": "x"}}}),
        event("create", "a", 201, {"kind": "Binding"}, sub="binding"),
        event("patch", "b", 403, {"metadata": {"annotations": {IDX: "1"}}}),
        event("patch", "c", 200, {}, user="someone-else"),
        "not json",
        json.dumps({"stage": "ResponseStarted", "verb": "patch"}),
    ]
    writes = audit.parse(lines, EXTENDER_USER)
    assert [(w.operation, w.pod, w.subresource, w.keys, w.verdict) for w in writes] == [
        ("UPDATE", "ns/a", "", (ASSIGNED, IDX), "allowed"),
        ("CREATE", "ns/a", "binding", (), "allowed"),
        ("UPDATE", "ns/b", "", (IDX,), "refused (403): denied: no"),
    ]
    assert [w.judged_by_webhook for w in writes] == [True, False, True]


def test_the_tier_runs_the_users_scheduler_configuration(tmp_path: Path) -> None:
    settings = from_environ({"GPUSHARE_E2E_PORT_BASE": "30000"})
    path = scheduler_config(settings, tmp_path / "kubeconfig", tmp_path / "scheduler.yaml")
    config = yaml.safe_load(path.read_text())
    [extender] = config["extenders"]
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert extender["urlPrefix"] == "http://127.0.0.1:30005/gpushare-scheduler"
    assert (extender["filterVerb"], extender["bindVerb"], extender["nodeCacheCapable"]) == ("filter", "bind", True)
    assert extender["managedResources"] == [{"name": RESOURCE, "ignoredByScheduler": False}]
    assert config["clientConnection"]["kubeconfig"] == str(tmp_path / "kubeconfig")


def test_the_extender_runs_in_its_namespace_behind_one_forwarder(tmp_path: Path) -> None:
    settings = from_environ({"GPUSHARE_E2E_PORT_BASE": "30000"})
    argv = extender.forwarder_argv(settings)
    # The scheduler's port into the namespace's extender port; the API server's port out, the same number inside.
    assert argv[argv.index("--into") + 1] == f"30005:{extender.PORT}"
    assert argv[argv.index("--out") + 1] == "30003:30003"
    assert extender.url(settings) == "http://127.0.0.1:30005/gpushare-scheduler"
    env = extender.environment(tmp_path / "kubeconfig")
    assert env == {"KUBECONFIG": str(tmp_path / "kubeconfig"), "PORT": str(extender.PORT), "LOG_LEVEL": "info"}


def test_the_reference_plugins_rbac_is_applied_as_its_own_file(tmp_path: Path) -> None:
    text = """# rbac.yaml
---
kind: ClusterRole
apiVersion: rbac.authorization.k8s.io/v1
metadata: {name: gpushare-device-plugin}
rules: [{apiGroups: [""], resources: [pods], verbs: [patch]}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: gpushare-device-plugin, namespace: kube-system}
"""
    (tmp_path / "device-plugin-rbac.yaml").write_text(text)
    assert reference_rbac(tmp_path) == (text, ("kube-system", "gpushare-device-plugin"))
