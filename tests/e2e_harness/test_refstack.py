"""The reference algorithm's device plugin (e2e.reference_plugin) against a fake of the tier's REST client, the
shared decision (e2e.refalloc), the audit-log reader and the scheduler configuration the tier renders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.api import deviceplugin_pb2 as dp
from deviceplugin.inventory import fake_gpus
from e2e import audit
from e2e.control import EXTENDER_USER, scheduler_config
from e2e.kube import KubeError
from e2e.refalloc import decide
from e2e.reference_plugin import ReferencePlugin
from e2e.settings import from_environ
from webhook.protocol import ASSIGNED, ASSUME_TIME, IDX

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


class FakeApi:
    def __init__(self, pods: list[dict[str, Any]], fail_patches: int = 0, status: int = 409) -> None:
        self.pods = pods
        self.fail_patches = fail_patches
        self.status = status
        self.paths: list[str] = []
        self.patches: list[tuple[str, Any, str]] = []

    def get(self, path: str) -> Any:
        self.paths.append(path)
        return {"items": self.pods}

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        self.patches.append((path, body, content_type))
        if self.fail_patches:
            self.fail_patches -= 1
            raise KubeError(self.status, "the object has been modified")
        return {}


def allocate(api: FakeApi, *sizes: int) -> list[dict[str, str]]:
    plugin = ReferencePlugin("node-a", GPUS, api, Path("/nonexistent"))
    request = dp.AllocateRequest(container_requests=[
        dp.ContainerAllocateRequest(devices_ids=[f"d{i}" for i in range(n)]) for n in sizes])
    response = plugin.Allocate(request, None)  # type: ignore[arg-type]
    return [dict(r.envs) for r in response.container_responses]


def test_allocate_lists_pending_pods_and_marks_the_guess_assigned() -> None:
    api = FakeApi([pod("p", [3], idx="1")])
    [envs] = allocate(api, 3)
    assert envs == {"NVIDIA_VISIBLE_DEVICES": GPUS[1].uuid, "ALIYUN_COM_GPU_MEM_IDX": "1",
                    "ALIYUN_COM_GPU_MEM_POD": "3", "ALIYUN_COM_GPU_MEM_CONTAINER": "3", "ALIYUN_COM_GPU_MEM_DEV": "16"}
    assert "fieldSelector=spec.nodeName%3Dnode-a%2Cstatus.phase%3DPending" in api.paths[0]
    [(path, body, kind)] = api.patches
    assert path == "/api/v1/namespaces/ns/pods/p" and kind == "application/strategic-merge-patch+json"
    assert body["metadata"]["annotations"][ASSIGNED] == "true"


@pytest.mark.parametrize(("failures", "status", "visible"), [
    (1, 409, GPUS[1].uuid),  # a conflict is retried once
    (2, 409, "no-gpu-has-3GiB-to-run"),
    (1, 403, "no-gpu-has-3GiB-to-run"),  # anything else: the made-up answer at once
])
def test_a_failed_mark_gives_the_made_up_answer(failures: int, status: int, visible: str) -> None:
    api = FakeApi([pod("p", [3], idx="1")], fail_patches=failures, status=status)
    [envs] = allocate(api, 3)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == visible


def test_every_container_of_a_request_gets_the_same_answer() -> None:
    envs = allocate(FakeApi([pod("p", [2, 2])]), 2, 2)
    assert [e["NVIDIA_VISIBLE_DEVICES"] for e in envs] == [GPUS[1].uuid] * 2
    assert [e["ALIYUN_COM_GPU_MEM_CONTAINER"] for e in envs] == ["2", "2"]


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
