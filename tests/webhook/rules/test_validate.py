"""Validation table: every denial with the fragment of its message, and every allowed path."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from contract import ASSIGNED, ASSUME_TIME, COMPAT_KEYS, DEV, IDX, POD, Allocation, ContainerSlot, Contract, signing
from contract.env import expected_env
from tests.harness.pods import (
    EXTENDER,
    KEY,
    NODE,
    NS,
    OTHER_KEY,
    PLUGIN,
    USER,
    Pod,
    allocated,
    allocation,
    annotate,
    bound,
    container,
    placed,
    pod,
    stamped,
)
from webhook.rules.validate import validate
from webhook.server.settings import Settings, settings_from

POLICY = settings_from({})
CDI_POLICY = settings_from({"GPUSHARE_DELIVERY": "cdi"})
NODE_POLICY = settings_from({"GPUSHARE_DELIVERY": "cdi", "GPUSHARE_PLACEMENT": "node"})
NODE_CONTRACT = NODE_POLICY.contract
C = POLICY.contract
INTENT, SIGNATURE, ALLOCATION = C.intent_key, C.signature_key, C.allocation_key

GPU = stamped(pod(container("a", 2), inits=[container("i", 1)]))


def check(operation: str, new: Pod, old: Pod | None = None, user: str = USER, *, policy: Settings = POLICY,
          namespace: str = NS) -> tuple[bool, str]:
    verdict = validate(operation, old, new, user, namespace, policy, KEY.public_key())
    return verdict.allowed, verdict.message


def with_env(p: Pod, env: list[dict[str, Any]], index: int = 0, kind: str = "containers") -> Pod:
    out = copy.deepcopy(p)
    out["spec"][kind][index]["env"] = env
    return out


def resign(p: Pod, text: str) -> Pod:
    return annotate(p, {INTENT: text, SIGNATURE: signing.sign(KEY, text, NS)})


ASSIGNED_POD = bound(placed(GPU))
ALLOCATED_POD = allocated(ASSIGNED_POD)
# The env the mutator injects, as an API server may store it without the defaulted fieldRef apiVersion.
UNDEFAULTED = [
    {k: ({"fieldRef": {"fieldPath": v["fieldRef"]["fieldPath"]}} if k == "valueFrom" else v) for k, v in e.items()}
    for e in expected_env(2, 2)
]

CREATE_DENIALS = [
    *[(f"reserved {key}", annotate(GPU, {key: "1"}), POLICY, f"Annotation {key} is reserved") for key in COMPAT_KEYS],
    ("reserved allocation", annotate(GPU, {ALLOCATION: allocation()}), POLICY, f"Annotation {ALLOCATION} is reserved"),
    ("signature from another namespace", stamped(pod(container("a", 2)), namespace="other"), POLICY,
     f"Annotation {SIGNATURE} does not verify for namespace {NS}"),
    ("signature from another key", stamped(pod(container("a", 2)), key=OTHER_KEY), POLICY,
     f"Annotation {SIGNATURE} does not verify"),
    ("edited intent", annotate(GPU, {INTENT: GPU["metadata"]["annotations"][INTENT].replace('"a":2', '"a":1')}),
     POLICY, "does not verify"),
    ("intent does not match spec", resign(GPU, stamped(pod(container("a", 5)))["metadata"]["annotations"][INTENT]),
     POLICY, f"Annotation {INTENT} does not match the pod spec"),
    ("unreadable intent signed", resign(GPU, '{"version": 1}'), POLICY, f"Annotation {INTENT} lacks a valid"),
    ("intent on a pod without GPU", annotate(pod(container("a")), GPU["metadata"]["annotations"]), POLICY,
     "this pod requests none"),
    ("intent without signature", annotate(GPU, {SIGNATURE: None}), POLICY,
     f"Annotation {INTENT} is present without {SIGNATURE}"),
    ("signature without intent", annotate(GPU, {INTENT: None}), POLICY,
     f"Annotation {SIGNATURE} is present without {INTENT}"),
    ("mutating webhook not reached", pod(container("a", 2)), POLICY,
     "has no gpushare.io/intent annotation, so the gpushare mutating webhook did not reach it"),
    ("user NVIDIA_VISIBLE_DEVICES", with_env(GPU, [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]), POLICY,
     "Container 'a' sets NVIDIA_VISIBLE_DEVICES itself"),
    ("user CUDA_VISIBLE_DEVICES", with_env(GPU, [*expected_env(2, 2), {"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]),
     POLICY, "Container 'a' sets CUDA_VISIBLE_DEVICES itself"),
    ("user ALIYUN_COM_GPU_MEM_POD", with_env(GPU, [{"name": "ALIYUN_COM_GPU_MEM_POD", "value": "99"}]), POLICY,
     "Container 'a' sets ALIYUN_COM_GPU_MEM_POD itself"),
    ("user env in an init container", with_env(GPU, [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}], 0,
                                               "initContainers"), POLICY, "Container 'i' sets NVIDIA_VISIBLE_DEVICES"),
    ("env from another annotation", with_env(GPU, [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['mine']"}}}]), POLICY, "sets NVIDIA_VISIBLE_DEVICES itself"),
    ("any reserved env in cdi mode", stamped(with_env(pod(container("a", 2)), expected_env(2, 2)), Contract(
        delivery="cdi")), CDI_POLICY, "come from the CDI device (cdi delivery); remove the NVIDIA_VISIBLE_DEVICES"),
    ("reserved env defined twice", with_env(GPU, [*expected_env(2, 2), expected_env(2, 2)[0]]), POLICY,
     "Container 'a' defines NVIDIA_VISIBLE_DEVICES 2 times; keep at most one entry"),
    ("limit over the largest GPU", stamped(pod(container("big", 200))), POLICY,
     "Container 'big' asks for 200 GiB of aliyun.com/gpu-mem, more than the largest GPU holds (192 GiB"),
    ("malformed limit", pod(container("a", "1.5")), POLICY, "is '1.5', which is not a whole number of units"),
]


@pytest.mark.parametrize(("case", "new", "policy", "fragment"), CREATE_DENIALS, ids=[c[0] for c in CREATE_DENIALS])
def test_create_denials(case: str, new: Pod, policy: Settings, fragment: str) -> None:
    allowed, message = check("CREATE", new, policy=policy)
    assert not allowed
    assert fragment in message
    assert message.startswith(f"gpushare denied pod {NS}/")


# Pods the gpushare scheduler extender cannot book: it books the app containers' sum only. Each is refused where
# the extender places pods, in env and in cdi delivery, and accepted where the device plugin places them.
INIT_LARGER = pod(container("main", 8), inits=[container("prep", 16)])
INIT_ONLY = pod(container("main"), inits=[container("prep", 8)])
GPU_SIDECAR = pod(container("main", 8), inits=[container("helper", 4, restart="Always")])
TWO_INITS = pod(container("a", 2), container("b", 2), inits=[container("p", 6), container("q", 5), container("r", 4)])
UNBOOKABLE = [
    ("init container larger than the app containers", INIT_LARGER,
     "Init container 'prep' (16 GiB) needs more aliyun.com/gpu-mem than the app containers together, but the "
     "gpushare scheduler extender books only the sum of the app containers' limits of aliyun.com/gpu-mem (8 GiB "
     "for this pod), so the GPU it picks may lack room for the init container; give the app containers at least "
     "16 GiB in total, or run the init container without GPU memory, or use cdi delivery with "
     "GPUSHARE_PLACEMENT=node, where the device plugin books the whole pod."),
    ("GPU memory only in an init container", INIT_ONLY,
     "(0 GiB for this pod), so it cannot place the pod at all: its bind fails until the pod is deleted; give the "
     "app containers at least 8 GiB in total"),
    ("a sidecar with GPU memory", GPU_SIDECAR,
     "Sidecar 'helper' (a restartable init container) asks for 4 GiB of aliyun.com/gpu-mem, but the gpushare "
     "scheduler extender books only the sum of the app containers' limits of aliyun.com/gpu-mem (8 GiB for this "
     "pod): GPU memory in a sidecar is not booked by the extender; move it into an app container, or use cdi "
     "delivery with GPUSHARE_PLACEMENT=node, where the device plugin books the whole pod."),
    ("two init containers larger than the app containers", TWO_INITS,
     "Init containers 'p' (6 GiB), 'q' (5 GiB) need more aliyun.com/gpu-mem than the app containers together"),
]


@pytest.mark.parametrize(("case", "new", "fragment"), UNBOOKABLE, ids=[c[0] for c in UNBOOKABLE])
@pytest.mark.parametrize(("policy", "contract"), [(POLICY, Contract()), (CDI_POLICY, Contract(delivery="cdi"))],
                         ids=["env", "cdi"])
def test_pods_the_extender_cannot_book_are_refused_where_it_places(
    case: str, new: Pod, fragment: str, policy: Settings, contract: Contract
) -> None:
    verdict = validate("CREATE", None, stamped(new, contract), USER, NS, policy, KEY.public_key())
    assert not verdict.allowed and verdict.reasons == ("unbookable",)
    assert verdict.message.startswith(f"gpushare denied pod {NS}/job-0. ")
    assert fragment in verdict.message


@pytest.mark.parametrize("new", [p for _, p, _ in UNBOOKABLE], ids=[c[0] for c in UNBOOKABLE])
def test_node_placement_books_the_whole_pod(new: Pod) -> None:
    assert check("CREATE", stamped(new, NODE_CONTRACT), policy=NODE_POLICY) == (True, "")


CREATE_ALLOWED = [
    ("stamped GPU pod", GPU, POLICY),
    ("stamped GPU pod before fieldRef defaulting", with_env(GPU, UNDEFAULTED), POLICY),
    ("stamped pod in cdi mode", stamped(pod(container("a", 2)), Contract(delivery="cdi")), CDI_POLICY),
    ("pod without GPU", pod(container("a")), POLICY),
    ("non-GPU container may set NVIDIA_VISIBLE_DEVICES to void", with_env(pod(container("cpu")), [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]), POLICY),
    ("unrelated env and annotations", annotate(with_env(GPU, [*expected_env(2, 2), {"name": "HOME", "value": "/"}]),
                                               {"team": "vision"}), POLICY),
    ("limit exactly the largest GPU", stamped(pod(container("a", 192))), POLICY),
    # What the extender books (the app containers' sum) is the pod's whole request: init containers no larger
    # than the app containers together, sidecars without GPU memory.
    ("init container as large as the app containers", stamped(pod(container("a", 2), container("b", 2),
                                                                  inits=[container("i", 4)])), POLICY),
    ("sidecar without GPU memory", stamped(pod(container("a", 2), inits=[container("s", 0, restart="Always"),
                                                                         container("t", restart="Always")])),
     POLICY),
]


@pytest.mark.parametrize(("case", "new", "policy"), CREATE_ALLOWED, ids=[c[0] for c in CREATE_ALLOWED])
def test_create_allowed(case: str, new: Pod, policy: Settings) -> None:
    assert check("CREATE", new, policy=policy) == (True, "")


def test_deployment_pod_named_by_generate_name() -> None:
    allowed, message = check("CREATE", pod(container("a", 2), name=None))
    assert not allowed
    assert message.startswith(f"gpushare denied pod {NS}/job-<generated>.")


UPDATE_DENIALS = [
    ("intent changed", GPU, resign(GPU, GPU["metadata"]["annotations"][INTENT].replace("alloc-1", "x")), PLUGIN,
     f"Annotation {INTENT} was changed"),
    ("intent removed", GPU, annotate(GPU, {INTENT: None}), EXTENDER, f"Annotation {INTENT} was removed"),
    ("signature changed", GPU, annotate(GPU, {SIGNATURE: "AAAA"}), USER, f"Annotation {SIGNATURE} was changed"),
    ("intent added", pod(container("a", 2)), GPU, PLUGIN, f"Annotation {INTENT} was added"),
    ("IDX written by a user", GPU, placed(GPU), USER,
     f"Annotation {IDX} was added by {USER}, but only the scheduler extender and the gpushare device plugin"),
    ("allocation written by a user", ASSIGNED_POD, allocated(ASSIGNED_POD), USER,
     f"Annotation {ALLOCATION} was added by {USER}"),
    ("ASSIGNED flipped by anonymous", ALLOCATED_POD, annotate(ALLOCATED_POD, {ASSIGNED: "false"}), "",
     f"Annotation {ASSIGNED} was changed by an anonymous user"),
    ("IDX not an integer", GPU, placed(GPU, index="gpu0"), EXTENDER,
     f"Annotation {IDX} is 'gpu0', which is not a non-negative decimal integer"),
    ("DEV not an integer", GPU, placed(GPU, dev="16GiB"), EXTENDER, f"Annotation {DEV} is '16GiB'"),
    ("POD not an integer", GPU, placed(GPU, total="-2"), EXTENDER, f"Annotation {POD} is '-2'"),
    ("ASSUME_TIME not an integer", GPU, annotate(placed(GPU), {ASSUME_TIME: "now"}), EXTENDER,
     f"Annotation {ASSUME_TIME} is 'now'"),
    ("POD differs from the intent total", GPU, placed(GPU, total="3"), EXTENDER,
     f"Annotation {POD} is 3 but the pod's stamped intent totals 2"),
    ("DEV smaller than a container", GPU, placed(GPU, dev="1"), EXTENDER, f"Annotation {DEV} is 1 GiB, smaller than"),
    ("IDX without DEV and POD", GPU, annotate(GPU, {IDX: "0"}), EXTENDER, f"Annotation {IDX} is set without"),
    ("IDX changed once bound", ASSIGNED_POD, annotate(ASSIGNED_POD, {IDX: "2"}), EXTENDER,
     f"Annotation {IDX} was changed after the pod was bound"),
    ("DEV changed once allocated", annotate(placed(GPU), {ASSIGNED: "true"}),
     annotate(placed(GPU), {ASSIGNED: "true", DEV: "32"}), PLUGIN,
     f"Annotation {DEV} was changed after the pod was bound to a node or allocated"),
    ("extender adds IDX after binding", bound(GPU), placed(bound(GPU)), EXTENDER,
     f"Annotation {IDX} was added after the pod was bound"),
    ("plugin removes IDX after binding", ASSIGNED_POD, annotate(ASSIGNED_POD, {IDX: None}), PLUGIN,
     f"Annotation {IDX} was removed after the pod was bound"),
    ("ASSIGNED not a boolean word", ASSIGNED_POD, annotate(ASSIGNED_POD, {ASSIGNED: "yes"}), PLUGIN,
     f"Annotation {ASSIGNED} is 'yes'; it must be \"true\" or \"false\""),
    ("ASSIGNED back to false", ALLOCATED_POD, annotate(ALLOCATED_POD, {ASSIGNED: "false"}), PLUGIN,
     f'Annotation {ASSIGNED} went from "true" to \'false\''),
    ("ASSIGNED removed", ALLOCATED_POD, annotate(ALLOCATED_POD, {ASSIGNED: None}), EXTENDER,
     f'Annotation {ASSIGNED} went from "true" to None'),
    ("allocation not JSON", ASSIGNED_POD, allocated(ASSIGNED_POD, "{"), PLUGIN,
     f"Annotation {ALLOCATION} is not valid JSON"),
    ("allocation of another intent", ASSIGNED_POD, allocated(ASSIGNED_POD, allocation("alloc-9")), PLUGIN,
     "the allocation record is for allocation alloc-9 but the pod's intent is alloc-1"),
    ("allocation on another node", ASSIGNED_POD, allocated(ASSIGNED_POD, allocation(node="gpu-node-2")), PLUGIN,
     f"names node 'gpu-node-2' but the pod is bound to '{NODE}'"),
    ("allocation on another GPU", ASSIGNED_POD, allocated(ASSIGNED_POD, allocation(gpu=3)), PLUGIN,
     f"the allocation record names GPU 3 but {IDX} is 1"),
    ("allocation with other units", ASSIGNED_POD, allocated(ASSIGNED_POD, allocation(units=5)), PLUGIN,
     "gives container 'a' 5 GiB but its intent is 2 GiB"),
]


@pytest.mark.parametrize(("case", "old", "new", "user", "fragment"), UPDATE_DENIALS, ids=[c[0] for c in UPDATE_DENIALS])
def test_update_denials(case: str, old: Pod, new: Pod, user: str, fragment: str) -> None:
    allowed, message = check("UPDATE", new, old, user)
    assert not allowed
    assert fragment in message


def relabel(p: Pod) -> Pod:
    out = copy.deepcopy(p)
    out["metadata"]["labels"] = {"tier": "gold"}
    return out


LEGACY = pod(container("a", 2))  # created before the webhook existed: no intent

UPDATE_ALLOWED = [
    ("extender assignment before binding", GPU, placed(GPU), EXTENDER),
    ("extender reassignment before binding", placed(GPU), placed(GPU, index="3"), EXTENDER),
    ("plugin allocation after binding", ASSIGNED_POD, ALLOCATED_POD, PLUGIN),
    ("plugin adds a container to the record", ALLOCATED_POD, allocated(ASSIGNED_POD, Allocation(
        "alloc-1", NODE, 1, "GPU-0000", {"a": ContainerSlot(2, "s-a"), "i": ContainerSlot(1, "s-i")}).to_json()),
     PLUGIN),
    ("node-local placement by the plugin", bound(GPU), allocated(placed(bound(GPU))), PLUGIN),
    ("label edit by a user", ALLOCATED_POD, relabel(ALLOCATED_POD), USER),
    ("unrelated annotation edit by a user", ALLOCATED_POD, annotate(ALLOCATED_POD, {"note": "hi"}), USER),
    ("pod without GPU", pod(container("a")), annotate(pod(container("a")), {"x": "y"}), USER),
    ("trusted writes on a pod without intent", LEGACY, placed(LEGACY, total="7"), EXTENDER),
    ("label edit on a pod with legacy garbage", annotate(GPU, {IDX: "junk"}), relabel(annotate(GPU, {IDX: "junk"})),
     USER),
]


@pytest.mark.parametrize(("case", "old", "new", "user"), UPDATE_ALLOWED, ids=[c[0] for c in UPDATE_ALLOWED])
def test_update_allowed(case: str, old: Pod, new: Pod, user: str) -> None:
    assert check("UPDATE", new, old, user) == (True, "")


def test_every_problem_is_reported_as_a_sentence() -> None:
    new = annotate(pod(container("a", "300")), {IDX: "1", ALLOCATION: "{}"})
    allowed, message = check("CREATE", new)
    assert not allowed
    assert message.count(". ") >= 3
    assert message.endswith(".")


def test_configured_identities_are_the_trusted_ones() -> None:
    policy = settings_from({"GPUSHARE_EXTENDER_IDENTITIES": "system:serviceaccount:sched:mine"})
    mine = "system:serviceaccount:sched:mine"
    assert validate("UPDATE", GPU, placed(GPU), mine, NS, policy, KEY.public_key()).allowed
    assert not validate("UPDATE", GPU, placed(GPU), EXTENDER, NS, policy, KEY.public_key()).allowed
