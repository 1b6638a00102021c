"""Mutation table: which pods get an intent, a signature and the downward-API GPU env, and which get nothing."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest

from contract import IDX, RESERVED_ENV, Contract, parse_intent, signing
from contract.env import expected_env
from tests.harness.pods import KEY, NS, OTHER_KEY, container, counter, pod, stamped
from webhook.rules.mutate import mutate

ENV = Contract()
VOID = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
CDI = Contract(delivery="cdi")
INTENT = ENV.intent_key
SIGNATURE = ENV.signature_key


def apply(p: dict[str, Any], contract: Contract = ENV, namespace: str = NS) -> tuple[list[dict[str, Any]], Any]:
    ops = mutate(p, namespace, contract, KEY, counter())
    return ops, jsonpatch.apply_patch(copy.deepcopy(p), ops)


def env_names(c: dict[str, Any]) -> list[str]:
    return [e["name"] for e in c.get("env") or []]


@pytest.mark.parametrize(
    ("case", "spec", "containers", "inits", "total", "env_units"),
    [
        ("single container", pod(container("a", "2")), {"a": 2}, {}, 2, {"a": 2}),
        (
            "several containers, one without GPU",
            pod(container("a", 4), container("b", 2), container("sidecar")),
            {"a": 4, "b": 2}, {}, 6, {"a": 4, "b": 2},
        ),
        (
            "init containers",
            pod(container("a", 4), inits=[container("fetch", 10), container("cpu-init")]),
            {"a": 4}, {"fetch": 10}, 10, {"a": 4, "fetch": 10},
        ),
        (
            "only an init container",
            pod(container("a"), inits=[container("warm", 3)]),
            {}, {"warm": 3}, 3, {"warm": 3},
        ),
        ("Deployment pod with generateName", pod(container("a", 1), name=None), {"a": 1}, {}, 1, {"a": 1}),
    ],
)
def test_gpu_share_pod_gets_signed_intent_and_env(
    case: str, spec: dict[str, Any], containers: dict[str, int], inits: dict[str, int], total: int,
    env_units: dict[str, int],
) -> None:
    ops, out = apply(spec)
    annotations = out["metadata"]["annotations"]
    intent = parse_intent(annotations[INTENT])
    assert intent.allocation_id == "alloc-1"
    assert (dict(intent.containers), dict(intent.init_containers), intent.total) == (containers, inits, total)
    assert signing.verify(KEY.public_key(), annotations[INTENT], NS, annotations[SIGNATURE])
    every = [*out["spec"].get("initContainers", []), *out["spec"]["containers"]]
    for c in every:
        if c["name"] in env_units:
            assert c["env"] == expected_env(env_units[c["name"]], total), case
        else:
            assert c["env"] == [VOID], case
    assert all(op["op"] == "add" for op in ops)


def test_deployment_pod_is_signed_for_the_request_namespace() -> None:
    spec = pod(container("a", 1), name=None)
    del spec["metadata"]["namespace"]  # pods from a ReplicaSet arrive without metadata.namespace
    _, out = apply(spec, namespace="team-b")
    annotations = out["metadata"]["annotations"]
    assert signing.verify(KEY.public_key(), annotations[INTENT], "team-b", annotations[SIGNATURE])
    assert not signing.verify(KEY.public_key(), annotations[INTENT], NS, annotations[SIGNATURE])


@pytest.mark.parametrize(
    ("spec", "voided"),
    [
        (pod(container("a")), ["a"]),
        (pod(container("a", 0)), ["a"]),
        (pod(container("a", "0")), ["a"]),
        (pod(container("a"), inits=[container("i")]), ["i", "a"]),
        ({"metadata": {"generateName": "x-"}, "spec": {}}, []),
        ({}, []),
    ],
)
def test_pod_without_gpu_share_gets_only_the_void_env(spec: dict[str, Any], voided: list[str]) -> None:
    _, out = apply(spec)
    assert "annotations" not in out.get("metadata", {})
    every = [*out.get("spec", {}).get("initContainers", []), *out.get("spec", {}).get("containers", [])]
    assert [c["name"] for c in every if c.get("env") == [VOID]] == voided
    assert mutate(spec, NS, CDI, KEY, counter()) == []
    assert mutate(out, NS, ENV, KEY, counter()) == []  # idempotent under reinvocation


def test_already_stamped_pod_gets_no_second_patch() -> None:
    once = stamped(pod(container("a", 2), container("b", 1)))
    assert mutate(once, NS, ENV, KEY, counter("second")) == []
    assert mutate(stamped(pod(container("a", 2)), CDI), NS, CDI, KEY, counter("second")) == []


def test_reinvocation_after_a_spec_change_stamps_again() -> None:
    once = stamped(pod(container("a", 2)))
    once["spec"]["containers"].append(container("late", 3))  # another webhook added a GPU container
    ops = mutate(once, NS, ENV, KEY, counter("again"))
    out = jsonpatch.apply_patch(once, ops)
    annotations = out["metadata"]["annotations"]
    intent = parse_intent(annotations[INTENT])
    assert intent.allocation_id == "again-1"
    assert intent.total == 5
    assert signing.verify(KEY.public_key(), annotations[INTENT], NS, annotations[SIGNATURE])
    assert env_names(out["spec"]["containers"][1]) == env_names({"env": expected_env(3, 5)})


@pytest.mark.parametrize(
    "annotations",
    [
        {INTENT: '{"version":1}', SIGNATURE: "AAAA"},
        {INTENT: "not json"},
        {SIGNATURE: "AAAA"},
    ],
)
def test_foreign_intent_is_left_for_the_validator(annotations: dict[str, str]) -> None:
    spec = pod(container("a", 2), annotations=annotations)
    assert mutate(spec, NS, ENV, KEY, counter()) == []


def test_intent_signed_by_another_key_or_namespace_is_not_overwritten() -> None:
    by_other_key = stamped(pod(container("a", 2)), key=OTHER_KEY)
    assert mutate(by_other_key, NS, ENV, KEY, counter()) == []
    other_namespace = stamped(pod(container("a", 2)), namespace="elsewhere")
    assert mutate(other_namespace, NS, ENV, KEY, counter()) == []


def test_cdi_delivery_injects_no_env() -> None:
    ops, out = apply(pod(container("a", 2), inits=[container("i", 1)]), CDI)
    assert [op["path"] for op in ops] == ["/metadata/annotations"]
    assert "env" not in out["spec"]["containers"][0]
    assert INTENT in out["metadata"]["annotations"]


def test_user_env_is_never_overwritten_and_the_rest_is_added() -> None:
    mine = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "HOME", "value": "/root"}]
    _, out = apply(pod(container("a", 2, env=mine)))
    env = out["spec"]["containers"][0]["env"]
    assert env[:2] == mine
    assert [e["name"] for e in env[2:]] == [n for n in env_names({"env": expected_env(2, 2)}) if n != mine[0]["name"]]


def test_existing_annotations_are_kept_and_keys_with_slashes_are_escaped() -> None:
    ops, out = apply(pod(container("a", 2), annotations={"team": "vision"}))
    paths = {op["path"] for op in ops if op["path"].startswith("/metadata")}
    assert paths == {"/metadata/annotations/gpushare.io~1intent", "/metadata/annotations/gpushare.io~1intent-signature"}
    assert out["metadata"]["annotations"]["team"] == "vision"


def test_null_env_and_null_annotations_are_handled() -> None:
    spec = pod(container("a", 2, env=None))
    spec["spec"]["containers"][0]["env"] = None
    spec["metadata"]["annotations"] = None
    _, out = apply(spec)
    assert len(out["spec"]["containers"][0]["env"]) == len(expected_env(2, 2))
    assert INTENT in out["metadata"]["annotations"]


def test_malformed_limit_gets_no_patch() -> None:
    assert mutate(pod(container("a", "1.5")), NS, ENV, KEY, counter()) == []


def test_configured_resource_unit_and_prefix_are_used() -> None:
    contract = Contract(resource="example.com/vram", unit="MiB", prefix="share.example.com/")
    spec = pod({"name": "a", "resources": {"limits": {"example.com/vram": "512"}}}, container("b", 2))
    _, out = apply(spec, contract)
    intent = parse_intent(out["metadata"]["annotations"]["share.example.com/intent"])
    assert (intent.resource, intent.unit, dict(intent.containers)) == ("example.com/vram", "MiB", {"a": 512})
    assert out["spec"]["containers"][1]["env"] == [VOID]


def test_expected_env_reads_the_index_from_the_pods_own_annotation() -> None:
    env = {e["name"]: e for e in expected_env(3, 7)}
    assert set(env) == set(RESERVED_ENV) - {"CUDA_VISIBLE_DEVICES"}
    assert env["NVIDIA_VISIBLE_DEVICES"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{IDX}']"
    assert (env["ALIYUN_COM_GPU_MEM_CONTAINER"]["value"], env["ALIYUN_COM_GPU_MEM_POD"]["value"]) == ("3", "7")
    json.dumps(env)  # plain JSON data, ready for a patch
