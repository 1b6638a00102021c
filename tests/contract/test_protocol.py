"""The shared annotation contract: demand, intent, assignment and allocation rules."""

from __future__ import annotations

from typing import Any, cast

import pytest

import contract as p
from tests.harness import pods

CONTRACT = p.Contract()
RES = p.DEFAULT_RESOURCE


def container(name: str, units: object = None, restart: str | None = None) -> dict[str, Any]:
    return pods.container(name, units, restart=restart)


def pod(containers: list[dict[str, Any]], inits: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return pods.pod(*containers, inits=inits, name=None)


@pytest.mark.parametrize(
    ("spec", "total"),
    [
        (pod([container("a", "8")]), 8),
        (pod([container("a", 4), container("b", 2), container("c")]), 6),
        (pod([container("a", 4)], [container("i", 10)]), 10),
        (pod([container("a", 4)], [container("i", 2)]), 4),
        # A sidecar runs beside the later init containers and beside the app containers.
        (pod([container("a", 4)], [container("sc", 2, "Always"), container("i", 9)]), 11),
        (pod([container("a", 4)], [container("i", 9), container("sc", 2, "Always")]), 9),
        (pod([container("a", 4)], [container("i", 3), container("sc", 2, "Always")]), 6),
        (pod([container("a")]), 0),
        (pod([container("a", "2Ki")]), 2048),
    ],
)
def test_total_follows_the_effective_request_rule(spec: dict[str, Any], total: int) -> None:
    assert p.demand_of(spec, RES).total == total


@pytest.mark.parametrize("bad", ["1.5", "-1", "abc", "8GiB", "", "1" * 19, "9" * 5000, "²", "٣", "\uff13", "1٣Gi"])
def test_fractional_or_malformed_units_are_refused_with_the_container_named(bad: str) -> None:
    with pytest.raises(p.ProtocolError, match=r"container 'a' limits\['aliyun.com/gpu-mem'\].*whole number"):
        p.demand_of(pod([container("a", bad)]), RES)


def test_intent_round_trips_and_lists_only_gpu_containers() -> None:
    spec = pod([container("a", 4), container("b")], [container("i", 2), container("sc", 1, "Always")])
    intent = p.intent_for(p.demand_of(spec, RES), CONTRACT, "id-1")
    assert dict(intent.containers) == {"a": 4}
    assert dict(intent.init_containers) == {"i": 2, "sc": 1}
    assert intent.sidecars == ("sc",)
    assert intent.total == 5
    assert p.parse_intent(intent.to_json()) == intent
    assert p.intent_mismatch(intent, spec, CONTRACT) is None


def test_intent_json_is_canonical() -> None:
    intent = p.Intent("x", RES, "GiB", {"b": 1, "a": 2}, {}, (), 3)
    text = intent.to_json()
    assert text == (
        '{"allocationId":"x","containers":{"a":2,"b":1},"initContainers":{},"resource":"aliyun.com/gpu-mem",'
        '"sidecars":[],"total":3,"unit":"GiB","version":1}'
    )


def test_intent_mismatch_names_both_sides() -> None:
    intent = p.intent_for(p.demand_of(pod([container("a", 4)]), RES), CONTRACT, "id")
    why = p.intent_mismatch(intent, pod([container("a", 8)]), CONTRACT)
    assert why is not None and "total 4" in why and "total 8" in why
    other = p.intent_mismatch(intent, pod([container("a", 4)]), p.Contract(unit="MiB"))
    assert other is not None and "in MiB" in other


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("not json", "is not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"version": 2}', "has version 2"),
        ('{"version": 1, "allocationId": "x", "resource": "r", "unit": "GiB"}', "lacks a valid 'total'"),
        (
            '{"version":1,"allocationId":"x","resource":"r","unit":"GiB","total":1,"containers":{"a":0},'
            '"initContainers":{}}',
            "'containers' must map container names to positive integers",
        ),
        (
            '{"version":1,"allocationId":"x","resource":"r","unit":"GiB","total":1,"containers":{},'
            '"initContainers":{},"sidecars":"x"}',
            "'sidecars' must be a list",
        ),
    ],
)
def test_parse_intent_refuses_malformed_records(text: str, fragment: str) -> None:
    with pytest.raises(p.ProtocolError, match=fragment):
        p.parse_intent(text)


@pytest.mark.parametrize(
    ("annotations", "fragment"),
    [
        ({p.IDX: "one"}, "ALIYUN_COM_GPU_MEM_IDX is 'one'"),
        ({p.DEV: "-3"}, "ALIYUN_COM_GPU_MEM_DEV is '-3'"),
        ({p.POD: "08"}, "ALIYUN_COM_GPU_MEM_POD is '08'"),
        ({p.ASSUME_TIME: "1.5"}, "ALIYUN_COM_GPU_MEM_ASSUME_TIME is '1.5'"),
        ({p.ASSIGNED: "yes"}, 'must be "true" or "false"'),
        ({p.IDX: "1\n"}, "ALIYUN_COM_GPU_MEM_IDX is '1\\\\n'"),
        ({p.IDX: " 1"}, "ALIYUN_COM_GPU_MEM_IDX is ' 1'"),
        ({p.ASSUME_TIME: "1" * 20}, "ALIYUN_COM_GPU_MEM_ASSUME_TIME is '1111"),
        ({p.POD: "9" * 5000}, r"ALIYUN_COM_GPU_MEM_POD is '9{39}\.\.\. \(5000 characters\)"),
        # Digits int() and str.isdigit() take, and the Go side does not: superscripts, Arabic-Indic, fullwidth.
        ({p.IDX: "²"}, "ALIYUN_COM_GPU_MEM_IDX is '²'"),
        ({p.IDX: "٣"}, "ALIYUN_COM_GPU_MEM_IDX is '٣'"),
        ({p.DEV: "\uff13"}, "ALIYUN_COM_GPU_MEM_DEV is '\uff13'"),
        ({p.POD: "1\U0001d7d9"}, "ALIYUN_COM_GPU_MEM_POD is '1\U0001d7d9'"),
    ],
)
def test_parse_assignment_refuses_non_integers(annotations: dict[str, str], fragment: str) -> None:
    with pytest.raises(p.ProtocolError, match=fragment):
        p.parse_assignment(annotations)


def test_assignment_round_trips() -> None:
    a = p.Assignment(index=1, device_units=24, pod_units=8, assume_time=1592387683318737367, assigned=False)
    assert p.parse_assignment(a.annotations()) == a
    assert p.parse_assignment({}) == p.Assignment()


INTENT = p.Intent("id", RES, "GiB", {"a": 4, "b": 2}, {"i": 6}, (), 6)


@pytest.mark.parametrize(
    ("assignment", "fragments"),
    [
        (p.Assignment(1, 24, 6), []),
        (p.Assignment(1, 24, 8), ["ALIYUN_COM_GPU_MEM_POD is 8 but the pod's stamped intent totals 6"]),
        (p.Assignment(1, 5, 6), ["ALIYUN_COM_GPU_MEM_DEV is 5 GiB, smaller than the 6 GiB"]),
        (p.Assignment(1, None, None), ["set without ALIYUN_COM_GPU_MEM_DEV and ALIYUN_COM_GPU_MEM_POD"]),
        (p.Assignment(), []),
    ],
)
def test_assignment_rules(assignment: p.Assignment, fragments: list[str]) -> None:
    problems = p.assignment_problems(INTENT, assignment)
    assert len(problems) == len(fragments)
    for problem, fragment in zip(problems, fragments, strict=True):
        assert fragment in problem


def test_allocation_round_trips() -> None:
    alloc = p.Allocation("id", "node-1", 1, "GPU-abc", {"a": p.ContainerSlot(4, "s1")})
    assert p.parse_allocation(alloc.to_json()) == alloc


@pytest.mark.parametrize(
    ("allocation", "node", "fragment"),
    [
        (p.Allocation("other", "n1", 1, "GPU-x", {}), "n1", "is for allocation other"),
        (p.Allocation("id", "n2", 1, "GPU-x", {}), "n1", "names node 'n2' but the pod is bound to 'n1'"),
        (p.Allocation("id", "n1", 1, "GPU-x", {}), None, "bound to None"),
        (p.Allocation("id", "n1", 2, "GPU-x", {}), "n1", "names GPU 2 but ALIYUN_COM_GPU_MEM_IDX is 1"),
        (p.Allocation("id", "n1", 1, "GPU-x", {"a": p.ContainerSlot(3, "s")}), "n1", "gives container 'a' 3 GiB"),
    ],
)
def test_allocation_rules(allocation: p.Allocation, node: str | None, fragment: str) -> None:
    problems = p.allocation_problems(INTENT, p.Assignment(1, 24, 6), allocation, node)
    assert any(fragment in problem for problem in problems), problems


def test_matching_allocation_passes() -> None:
    alloc = p.Allocation("id", "n1", 1, "GPU-x", {"a": p.ContainerSlot(4, "s"), "i": p.ContainerSlot(6, "t")})
    assert p.allocation_problems(INTENT, p.Assignment(1, 24, 6), alloc, "n1") == []


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"version":1}', "lacks allocationId"),
        ('{"version":1,"allocationId":"a","node":"n","gpu":{"index":true,"uuid":"u"},"containers":{}}', "lacks"),
        (
            '{"version":1,"allocationId":"a","node":"n","gpu":{"index":0,"uuid":"u"},"containers":{"c":{"units":"1"}}}',
            "container 'c' needs integer 'units'",
        ),
    ],
)
def test_parse_allocation_refuses_malformed_records(text: str, fragment: str) -> None:
    with pytest.raises(p.ProtocolError, match=fragment):
        p.parse_allocation(text)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"unit": "KiB"}, "unit 'KiB' is not supported"),
        ({"delivery": "magic"}, "delivery mode 'magic' is unknown"),
        ({"placement": "random"}, "placement 'random' is unknown"),
        ({"placement": "node"}, "node placement needs cdi delivery"),
        ({"prefix": "gpushare.io"}, "is not a DNS subdomain followed by '/'"),
        ({"resource": "gpu-mem"}, "must be a domain-prefixed"),
    ],
)
def test_contract_refuses_bad_settings(kwargs: dict[str, str], fragment: str) -> None:
    with pytest.raises(p.ProtocolError, match=fragment):
        p.Contract(**cast(Any, kwargs))  # deliberately outside the types: what arrives untyped


def test_contract_keys_follow_the_prefix() -> None:
    contract = p.Contract(prefix="example.com/")
    assert contract.own_keys == ("example.com/intent", "example.com/intent-signature", "example.com/allocation")
    assert set(p.COMPAT_KEYS) <= set(contract.reserved_keys)


def test_pod_ref_for_generated_names() -> None:
    assert p.pod_ref(pod([container("a", 1)])) == "ml/job-<generated>"
    assert p.pod_ref({"metadata": {"name": "x", "namespace": "y"}}) == "y/x"


def test_gpu_containers_lists_init_and_app_containers_with_units() -> None:
    spec = pod([container("a", 4), container("b")], [container("i", 1), container("j")])
    assert [c["name"] for c in p.gpu_containers(spec, RES)] == ["i", "a"]
