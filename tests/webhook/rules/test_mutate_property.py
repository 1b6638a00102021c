"""Property: the JSONPatch mutate builds directly, applied with jsonpatch, gives the pod the old whole-pod diff gave.

The oracle is the way the webhook used to build its patch (copy the pod, edit the copy, `jsonpatch.make_patch` the
two), kept here only: it is too slow for the admission path (CONTRIBUTING.md, rule 3) but obviously right.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract import Contract, ProtocolError, container_units, demand_of, intent_for, signing
from contract.env import expected_env
from tests.harness.pods import KEY, NS, RES
from webhook.rules.envrules import NEUTRAL_ENV, is_neutral, needs_void
from webhook.rules.mutate import mutate

CONTRACTS = [Contract(), Contract(delivery="cdi")]
OTHER_GPU = ("nvidia.com/gpu",)
NEW_ID = "00000000-0000-4000-8000-000000000000"


def old_whole_pod_diff(pod: dict[str, Any], contract: Contract) -> list[dict[str, Any]]:
    """The oracle: edit a deep copy of the pod as the rules say, then diff the two whole pods."""
    try:
        demand = demand_of(pod, contract.resource)
    except ProtocolError:
        demand = None
    edited = copy.deepcopy(pod)
    total = 0
    if demand is not None and demand.wants_gpu:
        intent = intent_for(demand, contract, NEW_ID)
        text = intent.to_json()
        meta = edited.setdefault("metadata", {})
        if not isinstance(meta.get("annotations"), dict):
            meta["annotations"] = {}
        meta["annotations"][contract.intent_key] = text
        meta["annotations"][contract.signature_key] = signing.sign(KEY, text, NS)
        total = intent.total
    if contract.delivery == "env":
        for kind in ("initContainers", "containers"):
            for c in edited["spec"].get(kind) or []:
                if is_neutral(c, contract, OTHER_GPU):
                    if needs_void(c):
                        c.setdefault("env", []).append(dict(NEUTRAL_ENV))
                    continue
                try:
                    units = container_units(c, contract.resource, "container")
                except ProtocolError:
                    continue
                if units and total:
                    present = {e.get("name") for e in c.get("env") or []}
                    env = c["env"] if isinstance(c.get("env"), list) else c.setdefault("env", [])
                    env.extend(e for e in expected_env(units, total) if e["name"] not in present)
                    if not env:
                        del c["env"]
    return list(jsonpatch.make_patch(pod, edited).patch)


names = st.text(alphabet="abcdefgh-", min_size=1, max_size=6)
env_names = st.sampled_from(["MODEL", "NVIDIA_VISIBLE_DEVICES", "ALIYUN_COM_GPU_MEM_IDX", "GPUSHARE_X", "PATH"])
env_entry = st.builds(lambda n, v: {"name": n, "value": v}, env_names, st.text(max_size=4))
limits = st.dictionaries(st.sampled_from([RES, "nvidia.com/gpu", "cpu"]),
                         st.sampled_from(["0", "1", "2", "7", "1Gi", "x"]), max_size=2)


@st.composite
def containers(draw: st.DrawFn) -> dict[str, Any]:
    c: dict[str, Any] = {"name": draw(names), "image": "cuda:12"}
    if draw(st.booleans()):
        c["resources"] = {"limits": draw(limits)}
    env = draw(st.one_of(st.none(), st.lists(env_entry, max_size=3)))
    if env is not None:
        c["env"] = env
    return c


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": NS, "generateName": "job-"}
    annotations = draw(st.one_of(st.none(), st.dictionaries(st.sampled_from(["a/b", "x~y", "plain", "k8s.io/~/z"]),
                                                           st.text(max_size=3), max_size=3)))
    if annotations is not None:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"containers": draw(st.lists(containers(), min_size=1, max_size=3, unique_by=lambda c:
                                                        c["name"]))}
    inits = draw(st.one_of(st.none(), st.lists(containers(), max_size=2, unique_by=lambda c: c["name"])))
    if inits is not None:
        spec["initContainers"] = inits
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=pods(), contract=st.sampled_from(CONTRACTS))
def test_the_direct_patch_gives_the_pod_the_whole_pod_diff_gave(pod: dict[str, Any], contract: Contract) -> None:
    direct = mutate(pod, NS, contract, KEY, lambda: NEW_ID, other_gpu=OTHER_GPU)
    expected = jsonpatch.apply_patch(pod, old_whole_pod_diff(pod, contract))
    assert jsonpatch.apply_patch(pod, direct) == expected

