"""The webhook configurations' matchConditions, evaluated with cel-python against sample admission requests."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel

from tests.harness.manifests.render import MANIFESTS

pytestmark = pytest.mark.timeout(60)

GPU = "aliyun.com/gpu-mem"


def conditions() -> list[tuple[str, str, str]]:
    """(configuration kind, condition name, expression) straight from the base, so this runs without kubectl."""
    docs = yaml.safe_load_all((MANIFESTS / "base" / "admission.yaml").read_text())
    return [(doc["kind"], cond["name"], cond["expression"])
            for doc in docs for hook in doc["webhooks"] for cond in hook["matchConditions"]]


def pod(*, limits: dict[str, str] | None = None, init_limits: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None, requests: dict[str, str] | None = None) -> dict[str, Any]:
    ctr: dict[str, Any] = {"name": "main", "image": "busybox"}
    if limits is not None or requests is not None:
        ctr["resources"] = {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    spec: dict[str, Any] = {"containers": [{"name": "sidecar", "image": "busybox"}, ctr]}
    if init_limits is not None:
        spec["initContainers"] = [{"name": "init", "image": "busybox", "resources": {"limits": init_limits}}]
    meta: dict[str, Any] = {"generateName": "job-", "namespace": "team-a"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def request(operation: str, obj: dict[str, Any], old: dict[str, Any] | None, *, user: str = "alice",
            kind: str = "Pod") -> dict[str, Any]:
    """The variables kube-apiserver binds for a webhook matchCondition (authorizer aside)."""
    req = {
        "uid": "0b9c7a0e-1111-2222-3333-444455556666",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": operation,
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "dryRun": False,
    }
    return {"object": obj, "oldObject": old, "request": req}


def without_annotations(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"].pop("annotations", None)
    return out


stamped = pod(limits={GPU: "4"}, annotations={"gpushare.io/intent": "{}", "gpushare.io/intent-signature": "c2ln"})
reserved_only = pod(annotations={"ALIYUN_COM_GPU_MEM_IDX": "0"})
own_only = pod(annotations={"gpushare.io/allocation": "{}"})

CASES = [
    ("GPU-share container", request("CREATE", pod(limits={GPU: "4", "cpu": "1"}), None), True),
    ("GPU-share init container only", request("CREATE", pod(init_limits={GPU: "2"}), None), True),
    ("plain pod without resources", request("CREATE", pod(), None), False),
    ("plain pod with empty resources", request("CREATE", pod(limits={}), None), False),
    ("CPU limits only", request("CREATE", pod(limits={"cpu": "1", "memory": "1Gi"}), None), False),
    ("whole-GPU resource", request("CREATE", pod(limits={"nvidia.com/gpu": "1"}), None), False),
    ("GPU-share in requests only (the API server rejects it anyway)",
     request("CREATE", pod(requests={GPU: "4"}), None), False),
    ("unrelated annotations", request("CREATE", pod(annotations={"team": "a", "gpushare.io": "x"}), None), False),
    ("user-supplied compatible annotation", request("CREATE", reserved_only, None), True),
    ("user-supplied own annotation", request("CREATE", own_only, None), True),
    ("UPDATE of a stamped GPU-share pod", request("UPDATE", stamped, stamped), True),
    ("UPDATE removing every reserved annotation", request("UPDATE", pod(), reserved_only), True),
    ("UPDATE removing annotations entirely", request("UPDATE", without_annotations(own_only), own_only), True),
    ("UPDATE adding a reserved annotation", request("UPDATE", reserved_only, pod()), True),
    ("UPDATE of a plain pod", request("UPDATE", pod(annotations={"a": "b"}), pod()), False),
    ("UPDATE of a plain pod without annotations", request("UPDATE", pod(), pod()), False),
]


def selected(name: str) -> list[tuple[str, str, str]]:
    return [c for c in conditions() if c[1] == name]


def evaluate(kind: str, name: str, expression: str, variables: dict[str, Any], case: str) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    result = program.evaluate({key: json_to_cel(value) for key, value in variables.items()})
    # A matchCondition that errors or yields a non-bool counts as a failed call (failurePolicy decides).
    assert isinstance(result, celtypes.BoolType), f"{kind} {name} gave {result!r} for {case}"
    return bool(result)


@pytest.mark.parametrize("condition", [*selected("gpushare-pods-only"), *selected("ordinary-pods-only")],
                         ids=lambda c: f"{c[0]}:{c[1]}")
@pytest.mark.parametrize(("case", "variables", "expected"), CASES, ids=[c[0] for c in CASES])
def test_gpu_share_pods_and_ordinary_pods_go_to_their_own_entries(
    condition: tuple[str, str, str], case: str, variables: dict[str, Any], expected: bool
) -> None:
    kind, name, expression = condition
    wanted = expected if name == "gpushare-pods-only" else not expected
    assert evaluate(kind, name, expression, variables, case) is wanted, f"{kind} {name} for {case}"


placed = pod(limits={GPU: "4"}, annotations={"gpushare.io/intent": "{}", "ALIYUN_COM_GPU_MEM_IDX": "0"})
STATUS_CASES = [
    ("kubelet status update of a GPU-share pod", request("UPDATE", placed, placed), False),
    ("status update of a plain pod", request("UPDATE", pod(), pod()), False),
    ("unrelated annotation added", request("UPDATE", pod(annotations={"a": "b"}), pod()), False),
    ("reserved annotation changed", request("UPDATE", pod(annotations={"ALIYUN_COM_GPU_MEM_IDX": "1"}), placed),
     True),
    ("reserved annotation added to a plain pod", request("UPDATE", reserved_only, pod()), True),
    ("reserved annotation removed", request("UPDATE", pod(annotations={"gpushare.io/intent": "{}"}), placed), True),
    ("annotations removed entirely", request("UPDATE", without_annotations(placed), placed), True),
]


def hooks() -> list[tuple[str, dict[str, Any]]]:
    docs = yaml.safe_load_all((MANIFESTS / "base" / "admission.yaml").read_text())
    return [(doc["kind"], hook) for doc in docs for hook in doc["webhooks"]]


def test_gpu_share_entries_fail_closed_and_ordinary_entries_never_block() -> None:
    found = conditions()
    assert {kind for kind, _, _ in found} == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    share = {expression for _, name, expression in found if name == "gpushare-pods-only"}
    ordinary = {expression for _, name, expression in found if name == "ordinary-pods-only"}
    assert len(share) == 1 and len(ordinary) == 1
    assert " ".join(ordinary.pop().split()) == "!(" + " ".join(share.pop().split()) + ")"
    for kind, hook in hooks():
        name = hook["matchConditions"][0]["name"]
        assert hook["failurePolicy"] == ("Ignore" if name == "ordinary-pods-only" else "Fail"), (kind, hook["name"])
        if name == "ordinary-pods-only":
            assert hook["timeoutSeconds"] <= 2, hook["name"]


def test_every_path_that_changes_a_pod_is_covered() -> None:
    covered = {(kind, op, res) for kind, hook in hooks() for rule in hook["rules"]
               for op in rule["operations"] for res in rule["resources"]}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert (kind, "CREATE", "pods") in covered
        assert (kind, "UPDATE", "pods/ephemeralcontainers") in covered
    assert ("ValidatingWebhookConfiguration", "UPDATE", "pods") in covered
    assert ("ValidatingWebhookConfiguration", "UPDATE", "pods/status") in covered
    assert ("ValidatingWebhookConfiguration", "UPDATE", "pods/*") in covered  # the plugin identity, any subresource
    assert ("ValidatingWebhookConfiguration", "CREATE", "pods/binding") in covered
    assert ("ValidatingWebhookConfiguration", "CREATE", "bindings") in covered  # the legacy path to the same


PLUGIN = "system:serviceaccount:gpushare-system:gpushare-device-plugin"
PLUGIN_CASES = [
    ("the plugin's patch of a GPU-share pod", request("UPDATE", placed, placed, user=PLUGIN), True),
    ("the plugin's patch of any pod", request("UPDATE", pod(), pod(), user=PLUGIN), True),
    ("a user's patch", request("UPDATE", pod(), pod()), False),
    ("the extender's patch", request("UPDATE", placed, placed,
                                     user="system:serviceaccount:kube-system:gpushare-schd-extender"), False),
    ("a kubelet status update", request("UPDATE", placed, placed, user="system:node:n1"), False),
]


def binding(annotations: dict[str, str] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "job-0", "namespace": "team-a"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Binding", "metadata": meta, "target": {"kind": "Node", "name": "n1"}}


BINDING_CASES = [
    ("the scheduler's Binding", binding(None), False),
    ("a Binding with unrelated annotations", binding({"team": "a"}), False),
    ("a Binding with a placement", binding({"ALIYUN_COM_GPU_MEM_IDX": "0"}), True),
    ("a Binding with an own key", binding({"gpushare.io/allocation": "{}"}), True),
]


# The entries sent only what they judge: status updates that touch a reserved annotation, the plugin identity's
# updates, Bindings that carry a reserved annotation.
SELECTIVE = [
    *[("reserved-annotations-change", case, variables, expected) for case, variables, expected in STATUS_CASES],
    *[("plugin-identity", case, variables, expected) for case, variables, expected in PLUGIN_CASES],
    *[("binding-carries-reserved-annotations", case,
       request("CREATE", obj, None, user="system:kube-scheduler", kind="Binding"), expected)
      for case, obj, expected in BINDING_CASES],
]


@pytest.mark.parametrize(("name", "case", "variables", "expected"), SELECTIVE,
                         ids=[f"{name}:{case}" for name, case, _, _ in SELECTIVE])
def test_selective_entries_are_sent_only_what_they_judge(name: str, case: str, variables: dict[str, Any],
                                                         expected: bool) -> None:
    found = selected(name)
    assert found, name
    for kind, _, expression in found:
        assert evaluate(kind, name, expression, variables, case) is expected, f"{kind} {name} for {case}"
