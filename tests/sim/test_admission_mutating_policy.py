"""The MutatingAdmissionPolicy evaluator of the harness does what patch/json_patch.go and dispatcher.go do."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from celpy.evaluation import CELEvalError

from tests.harness.apiserver import mutating
from tests.harness.apiserver.admission import Attributes
from tests.harness.apiserver.auth import User
from tests.harness.apiserver.cellib import JSONPatch
from tests.harness.apiserver.resources import PODS

Obj = dict[str, Any]
POD: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]}}


def policy(*expressions: str, conditions: tuple[str, ...] = (), reinvocation: str = "Never",
           namespaces: tuple[str, ...] = ()) -> Obj:
    constraints: Obj = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                           "resources": ["pods"]}]}
    if namespaces:
        constraints["namespaceSelector"] = {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(namespaces)}]}
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": "p"},
            "spec": {"failurePolicy": "Fail", "reinvocationPolicy": reinvocation, "matchConstraints": constraints,
                     "matchConditions": [{"name": f"c{i}", "expression": e} for i, e in enumerate(conditions)],
                     "variables": [{"name": "n", "expression": "size(object.spec.containers)"}],
                     "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": e}}
                                   for e in expressions]}}


def test_a_json_patch_is_applied_in_order_and_each_mutation_sees_the_last() -> None:
    added = policy("[JSONPatch{op: 'add', path: '/spec/containers/-', value: {'name': 'c'}}]",
                   "[JSONPatch{op: 'add', path: '/metadata/labels/n', value: string(variables.n)}]")
    out = mutating.mutate(added, "CREATE", POD)
    assert out is not None
    assert [c["name"] for c in out["spec"]["containers"]] == ["a", "b", "c"]
    assert out["metadata"]["labels"] == {"app": "web", "n": "3"}
    assert POD["spec"]["containers"] == [{"name": "a"}, {"name": "b"}], "the request's object is not changed"


def test_lists_range_gives_the_indexes() -> None:
    expression = ("lists.range(variables.n).map(i, JSONPatch{op: 'add', path: '/spec/containers/' + string(i) + "
                  "'/env', value: [{'name': 'I', 'value': string(i)}]})")
    ops = mutating.operations(policy(expression), "CREATE", POD)
    assert ops == [{"op": "add", "path": f"/spec/containers/{i}/env", "value": [{"name": "I", "value": str(i)}]}
                   for i in (0, 1)]


def test_a_failed_test_operation_leaves_the_object_unpatched() -> None:
    guarded = policy("[JSONPatch{op: 'test', path: '/metadata/labels/app', value: 'db'}, "
                     "JSONPatch{op: 'remove', path: '/metadata/labels'}]")
    assert mutating.mutate(guarded, "CREATE", POD) == POD


def test_a_patch_that_does_not_apply_fails_the_request() -> None:
    with pytest.raises(mutating.PatchFailed, match="JSON Patch"):
        mutating.mutate(policy("[JSONPatch{op: 'add', path: '/spec/initContainers/0/env/-', value: {}}]"),
                        "CREATE", POD)


@pytest.mark.parametrize(("expression", "error"), [
    ("[JSONPatch{op: 'add', path: '/a', val: 1}]", "JSONPatch has no field 'val'"),
    ("[{'op': 'add', 'path': '/a'}]", "array of JSONPatch"),
])
def test_only_jsonpatch_values_make_a_patch(expression: str, error: str) -> None:
    with pytest.raises((mutating.PatchFailed, CELEvalError), match=error):
        mutating.mutate(policy(expression), "CREATE", POD)


def test_range_is_a_function_of_the_lists_namespace_only() -> None:
    with pytest.raises(CELEvalError, match="no matching overload for 'range'"):
        mutating.mutate(policy("[1, 2].range(2).map(i, JSONPatch{op: 'add', path: '/a', value: i})"), "CREATE", POD)


def test_a_policy_applies_only_where_it_matches() -> None:
    added = policy("[JSONPatch{op: 'add', path: '/metadata/labels/x', value: 'y'}]",
                   conditions=("object.metadata.labels.app == 'web'",), namespaces=("kube-system",))
    assert mutating.mutate(added, "CREATE", POD, namespace="kube-system") is None
    assert mutating.mutate(added, "UPDATE", POD, copy.deepcopy(POD)) is None
    other = copy.deepcopy(POD)
    other["metadata"]["labels"]["app"] = "db"
    assert mutating.mutate(added, "CREATE", other) is None
    assert mutating.mutate(added, "CREATE", POD) is not None


class _Chain:
    """A stand-in for the webhooks: adds a container once, as a sidecar injector does."""

    def __init__(self) -> None:
        self.calls = 0

    def admit(self, attrs: Attributes) -> Obj | None:
        self.calls += 1
        if attrs.obj is not None and not any(c["name"] == "proxy" for c in attrs.obj["spec"]["containers"]):
            attrs.obj = {**attrs.obj, "spec": {**attrs.obj["spec"],
                                               "containers": [*attrs.obj["spec"]["containers"], {"name": "proxy"}]}}
        return attrs.obj


@pytest.mark.parametrize(("reinvocation", "labelled"), [("IfNeeded", ["a", "b", "proxy"]), ("Never", ["a", "b"])])
def test_an_if_needed_policy_runs_again_after_a_webhook_changed_the_object(reinvocation: str,
                                                                            labelled: list[str]) -> None:
    label = policy("lists.range(variables.n).filter(i, !has(object.spec.containers[i].env)).map(i, "
                   "JSONPatch{op: 'add', path: '/spec/containers/' + string(i) + '/env', value: [{'name': 'SEEN'}]})",
                   reinvocation=reinvocation)
    attrs = Attributes(PODS, "CREATE", "ml", "p", copy.deepcopy(POD), None, User("alice"))
    out = mutating.admit([label], _Chain(), attrs)  # type: ignore[arg-type]
    assert out is not None
    assert [c["name"] for c in out["spec"]["containers"] if c.get("env") == [{"name": "SEEN"}]] == labelled


def test_a_jsonpatch_value_turns_into_json() -> None:
    op = JSONPatch({"op": "add", "path": "/a", "value": {"b": [1, True]}})
    assert op.operation() == {"op": "add", "path": "/a", "value": {"b": [1, True]}}
