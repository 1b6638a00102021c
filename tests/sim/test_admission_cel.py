"""What matchConditions can use: the CEL subset cel-python evaluates, and the gaps, pinned by table tests."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.apiserver.cel import ConditionError, evaluate, match_conditions

POD: dict[str, Any] = {
    "metadata": {"name": "p", "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "1"}, "labels": {"app": "web"}},
    "spec": {"containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "8"}}}]},
}
VARIABLES: dict[str, Any] = {
    "object": POD,
    "oldObject": None,
    "request": {"operation": "CREATE", "userInfo": {"username": "alice", "groups": ["devs", "system:authenticated"]}},
}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("has(object.spec.initContainers)", False),
        ("has(object.metadata.annotations)", True),
        ("'aliyun.com/gpu-mem' in object.spec.containers[0].resources.limits", True),
        ("object.spec.containers.exists(c, has(c.resources.limits) && 'aliyun.com/gpu-mem' in c.resources.limits)",
         True),
        ("object.spec.containers.all(c, c.name == 'c')", True),
        ("object.spec.containers.exists_one(c, c.name == 'c')", True),
        ("object.metadata.annotations.exists(k, k.startsWith('ALIYUN_COM_GPU_MEM_'))", True),
        ("object.metadata.name.endsWith('p') && object.metadata.name.contains('p')", True),
        ("object.metadata.name.matches('^p$')", True),
        ("size(object.spec.containers) == 1 && object.spec.containers.size() == 1", True),
        ("object.spec.containers.map(c, c.name) == ['c']", True),
        ("object.spec.containers.filter(c, c.name == 'x').size() == 0", True),
        ("oldObject == null", True),
        ("request.operation == 'UPDATE' && oldObject.metadata.name == 'p'", False),  # short-circuits past null
        ("request.userInfo.groups.exists(g, g == 'devs')", True),
        ("'system:authenticated' in request.userInfo.groups", True),
        ("int(object.metadata.annotations['ALIYUN_COM_GPU_MEM_IDX']) == 1", True),
        ("object.metadata.nosuch == 'x' && false", False),  # CEL's commutative && absorbs the error
        ("object.metadata.nosuch == 'x' || true", True),
    ],
)
def test_supported(expression: str, expected: bool) -> None:
    assert evaluate(expression, VARIABLES) is expected


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("object.metadata.?labels.orValue({}).size() > 0", "optional syntax"),
        ("object.metadata.name.lowerAscii() == 'p'", "string extension library"),
        ("object.metadata.name.split('-').size() == 1", "string extension library"),
        ("quantity('8Gi').isGreaterThan(quantity('1Gi'))", "Kubernetes quantity library"),
        ("isSorted([1, 2])", "Kubernetes list library"),
        ("authorizer.group('').resource('pods').check('get').allowed()", "authorizer variable"),
        ("oldObject.metadata.name == 'p'", "field selection on null is an error, as in Kubernetes"),
        ("object.metadata.nosuch == 'x'", "a missing field is an error, as in Kubernetes"),
        ("object.metadata.name", "not a bool"),
    ],
)
def test_unsupported_or_erroneous(expression: str, why: str) -> None:
    with pytest.raises(ConditionError):
        evaluate(expression, VARIABLES)


@pytest.mark.parametrize(
    ("conditions", "matches", "error"),
    [
        ([], True, False),
        ([{"name": "a", "expression": "true"}, {"name": "b", "expression": "true"}], True, False),
        ([{"name": "a", "expression": "true"}, {"name": "b", "expression": "false"}], False, False),
        ([{"name": "a", "expression": "object.nosuch"}, {"name": "b", "expression": "false"}], False, False),
        ([{"name": "a", "expression": "object.nosuch"}, {"name": "b", "expression": "true"}], False, True),
        ([{"name": "a", "expression": "this is not CEL ("}], False, True),
    ],
)
def test_match_conditions_semantics(conditions: list[dict[str, str]], matches: bool, error: bool) -> None:
    verdict = match_conditions(conditions, VARIABLES)
    assert verdict.matches is matches
    assert (verdict.error is not None) is error
