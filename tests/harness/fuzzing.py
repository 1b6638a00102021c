"""Strategies for fuzzing the webhook's input surface: AdmissionReview v1 bodies, byte mutations, annotations.

GPUSHARE_FUZZ_CASES (read here only) sets the cases per property; the default keeps the unit tier fast.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import strategies as st

from contract import COMPAT_KEYS, DEFAULT_RESOURCE, Contract

CASES = int(os.environ.get("GPUSHARE_FUZZ_CASES", "150"))
RESERVED = (*COMPAT_KEYS, *Contract().own_keys)
JSONValue = Any

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                    st.text(max_size=20))
# Any JSON value: what a type-confused field may hold instead of the right type.
anything: st.SearchStrategy[JSONValue] = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)

# Values the annotation parsers meet: numbers of every length, signs, spaces, newlines, non-ASCII digits, JSON.
annotation_values = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"-?[0-9]{0,30}\n?", fullmatch=True),
    st.sampled_from(["true", "false", "TRUE", "", " 1", "1\n", "٣", "0x10", "1e3", "9" * 5000, "null", "{}", "[]"]),
    anything.map(json.dumps),
)

quantities = st.one_of(st.sampled_from(["0", "1", "2", "16", "1Gi", "0.5", "-1", "1e3", "", "9" * 40]),
                       st.integers(-5, 300).map(str), anything)


def maybe(strategy: st.SearchStrategy[JSONValue]) -> st.SearchStrategy[JSONValue]:
    """Mostly the right shape, sometimes any JSON value instead (type confusion)."""
    return st.one_of(strategy, strategy, strategy, anything)


env_names = st.sampled_from(["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", *COMPAT_KEYS, "PATH", "X"])
env_entries = st.one_of(
    st.fixed_dictionaries({"name": maybe(env_names), "value": maybe(st.text(max_size=12))}),
    st.fixed_dictionaries({"name": maybe(env_names), "valueFrom": maybe(st.fixed_dictionaries({
        "fieldRef": maybe(st.fixed_dictionaries({"fieldPath": maybe(st.sampled_from(
            [f"metadata.annotations['{key}']" for key in RESERVED] + ["metadata.name"]))}))}))}),
)
containers = st.fixed_dictionaries(
    {"name": maybe(st.text(min_size=1, max_size=8))},
    optional={
        "image": st.just("cuda:12"),
        "resources": maybe(st.fixed_dictionaries({}, optional={
            "limits": maybe(st.dictionaries(st.sampled_from([DEFAULT_RESOURCE, "nvidia.com/gpu", "cpu"]), quantities,
                                            max_size=2)),
            "requests": maybe(st.dictionaries(st.sampled_from([DEFAULT_RESOURCE, "cpu"]), quantities, max_size=2)),
        })),
        "env": maybe(st.lists(maybe(env_entries), max_size=4)),
        "envFrom": maybe(st.lists(anything, max_size=2)),
        "volumeMounts": maybe(st.lists(st.fixed_dictionaries({"name": st.just("v"), "mountPath": st.sampled_from(
            ["/data", "/var/run/nvidia-container-devices/all"])}), max_size=2)),
        "restartPolicy": maybe(st.sampled_from(["Always", "Never"])),
    },
)
annotation_maps = st.dictionaries(st.one_of(st.sampled_from(RESERVED), st.text(max_size=10)), annotation_values,
                              max_size=6)
pods = st.fixed_dictionaries(
    {"apiVersion": st.just("v1"), "kind": st.just("Pod"),
     "metadata": maybe(st.fixed_dictionaries({}, optional={
         "name": maybe(st.text(max_size=10)), "generateName": st.just("job-"), "namespace": st.just("ml"),
         "uid": st.text(max_size=8), "annotations": maybe(annotation_maps)})),
     "spec": maybe(st.fixed_dictionaries({"containers": maybe(st.lists(maybe(containers), max_size=3))}, optional={
         "initContainers": maybe(st.lists(maybe(containers), max_size=2)),
         "ephemeralContainers": maybe(st.lists(maybe(containers), max_size=2)),
         "nodeName": maybe(st.text(max_size=6))}))},
)
users = st.sampled_from(["alice", "system:serviceaccount:kube-system:gpushare-schd-extender",
                         "system:serviceaccount:gpushare-system:gpushare-device-plugin"])
requests = st.fixed_dictionaries(
    {"uid": maybe(st.text(min_size=1, max_size=8)),
     "kind": maybe(st.just({"group": "", "version": "v1", "kind": "Pod"})),
     "resource": st.just({"group": "", "version": "v1", "resource": "pods"}),
     "namespace": maybe(st.sampled_from(["ml", "kube-system", ""])),
     "operation": maybe(st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"])),
     "userInfo": maybe(st.fixed_dictionaries({"username": maybe(users)}, optional={
         "groups": st.lists(st.text(max_size=5), max_size=2), "extra": anything})),
     "object": maybe(pods), "oldObject": maybe(pods), "dryRun": maybe(st.booleans())},
    optional={"subResource": maybe(st.sampled_from(["status", "ephemeralcontainers"])), "name": st.text(max_size=5)},
)
reviews = st.fixed_dictionaries({"apiVersion": maybe(st.just("admission.k8s.io/v1")),
                                 "kind": maybe(st.just("AdmissionReview")), "request": maybe(requests)})


@st.composite
def mutated_bytes(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """A serialized review with a few bytes flipped, inserted, deleted, or the tail cut off."""
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if action == "flip":
            data[at] = draw(st.integers(0, 255))
        elif action == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4) | st.sampled_from([b"[", b"{", b'"', b"\\u"]))
        elif action == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        else:
            del data[at:]
    return bytes(data)


review_bodies = reviews.map(lambda doc: json.dumps(doc).encode())
fuzzed_bodies = st.one_of(review_bodies, mutated_bytes(review_bodies))
