"""The DRA component's slice policy as the API server evaluates it (tests/harness/apiserver/policies.py): the driver's
identity writes only its own node's slices of its own driver, in its node's pool, under names its keeper gives, so
one node's token cannot create a slice named as another node's (proven on the real tier: tests/e2e/test_dra.py)."""

from __future__ import annotations

from typing import Any

import pytest

from contract.keys import DRA_DRIVER
from dra.slice import node_owner, pool_slices, slice_prefix
from node.inventory import Gpu
from tests.harness.apiserver import policies
from tests.harness.manifests.render import NAMESPACE, find, render_with_component

DRIVER_USER = f"system:serviceaccount:{NAMESPACE}:gpushare-dra-plugin"
NODE, OTHER = "node-a", "node-b"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Obj:
    objs = render_with_component("self-signed", "dra", tmp_path_factory.mktemp("dra"))
    return find(objs, "ValidatingAdmissionPolicy", "gpushare-dra-own-node-slices")


def generated(node: str, index: int = 0) -> Obj:
    """The keeper's slice of GPU `index` as the API server stores it: named from its generateName (the first 58
    characters and five random ones: k8s.io/apiserver pkg/storage/names/generate.go)."""
    [body] = pool_slices(node, [Gpu(index, f"GPU-{index}", 16)], set(), "GiB")
    return {**body, "metadata": {"name": slice_prefix(node, index)[:58] + "x7k2q"}}


def sliced(name: str, *, node: str = NODE, driver: str = DRA_DRIVER, pool: str | None = None) -> Obj:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node, "devices": [],
                     "pool": {"name": node if pool is None else pool, "generation": 1, "resourceSliceCount": 1}}}


def admit(policy: Obj, operation: str, slice_: Obj, *, node: str | None = NODE,
          user: str = DRIVER_USER) -> list[str] | None:
    obj, old = (None, slice_) if operation == "DELETE" else (slice_, slice_ if operation == "UPDATE" else None)
    return policies.admit(policy, operation, obj, old, user=user, node=node, resource="resourceslices")


@pytest.mark.parametrize("length", [6, 40, 41, 42, 60, 253])
def test_the_keepers_own_slices_are_admitted(policy: Obj, length: int) -> None:
    """Whatever the node name's length: the generated name keeps the prefix's first 58 characters, and the policy
    asks for no more."""
    node = ("n" * length)[:length - 2] + "-a" if length > 6 else NODE
    for operation in ("CREATE", "UPDATE", "DELETE"):
        assert admit(policy, operation, generated(node, 3), node=node) == [], operation


def test_a_slice_an_earlier_version_named_is_still_updated_and_deleted(policy: Obj) -> None:
    fixed = sliced(f"{NODE}-{DRA_DRIVER}-gpu-0")
    assert admit(policy, "UPDATE", fixed) == [] and admit(policy, "DELETE", fixed) == []


def _driver(name: str, driver: str) -> str:
    return (f"The gpushare DRA driver on node {NODE} may write only ResourceSlices of driver gpushare.io, not "
            f"ResourceSlice {name} of driver {driver}.")


def _name(name: str) -> str:
    return (f"The gpushare DRA driver on node {NODE} may name a ResourceSlice only as its keeper does (generateName "
            f"{NODE}-gpushare.io-gpu-<index>-), not {name}.")


SQUAT = f"{OTHER}-{DRA_DRIVER}-gpu-0"  # the name node-b's driver once gave its first slice
THEIRS = generated(OTHER)["metadata"]["name"]


@pytest.mark.parametrize(
    ("operation", "slice_", "messages"),
    [
        # The finding: node A's token creates a slice of its own node, of another driver, named as node B's.
        ("CREATE", sliced(SQUAT, driver="squatter.example.com"), [_driver(SQUAT, "squatter.example.com"),
                                                                  _name(SQUAT)]),
        ("CREATE", sliced(SQUAT + "-x7k2q"), [_name(SQUAT + "-x7k2q")]),
        ("CREATE", sliced("anything"), [_name("anything")]),
        ("CREATE", sliced(f"{NODE}-{DRA_DRIVER}-gpu-0", pool=OTHER), [
            f"The gpushare DRA driver on node {NODE} may publish only the pool named after its node, not pool "
            f"{OTHER} (ResourceSlice {NODE}-{DRA_DRIVER}-gpu-0)."]),
        ("UPDATE", sliced(SQUAT, driver="squatter.example.com"), [_driver(SQUAT, "squatter.example.com"),
                                                                  _name(SQUAT)]),
        ("DELETE", sliced(f"{NODE}-other", driver="other.example.com"), [_driver(f"{NODE}-other",
                                                                                 "other.example.com")]),
        ("CREATE", generated(OTHER), [f"The gpushare DRA driver on node {NODE} may write only that node's "
                                      f"ResourceSlice, not one of node {OTHER}.",
                                      f"The gpushare DRA driver on node {NODE} may publish only the pool named after "
                                      f"its node, not pool {OTHER} (ResourceSlice {THEIRS}).", _name(THEIRS)]),
        ("DELETE", generated(OTHER), [f"The gpushare DRA driver on node {NODE} may write only that node's "
                                      f"ResourceSlice, not one of node {OTHER}."]),
    ],
    ids=["another driver named as node-b's", "ours named as node-b's", "ours named otherwise", "another node's pool",
         "update of another driver's", "delete of another driver's", "create of node-b's", "delete of node-b's"],
)
def test_the_driver_writes_nothing_but_its_keepers_slices(policy: Obj, operation: str, slice_: Obj,
                                                          messages: list[str]) -> None:
    assert admit(policy, operation, slice_) == messages


def test_a_token_without_a_node_writes_no_slice_and_other_identities_are_not_judged(policy: Obj) -> None:
    messages = admit(policy, "CREATE", generated(NODE), node=None)
    assert messages and messages[0].startswith("The gpushare DRA driver's token names no node")
    assert admit(policy, "CREATE", sliced(SQUAT, driver="squatter.example.com"), user="system:node:node-a") is None


def owned(slice_: Obj, *owners: Obj) -> Obj:
    return {**slice_, "metadata": {**slice_["metadata"], "ownerReferences": list(owners)}}


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_slice_owned_by_its_own_node_is_admitted(policy: Obj, operation: str) -> None:
    [body] = pool_slices(NODE, [Gpu(0, "GPU-0", 16)], set(), "GiB", node_uid="uid-a")
    stored = {**body, "metadata": {**body["metadata"], "name": generated(NODE)["metadata"]["name"]}}
    assert stored["metadata"]["ownerReferences"] == node_owner(NODE, "uid-a")
    assert admit(policy, operation, stored) == []


@pytest.mark.parametrize(
    ("owner", "named"),
    [({"apiVersion": "v1", "kind": "Node", "name": OTHER, "uid": "uid-b", "controller": True}, f"v1 Node {OTHER}"),
     ({"apiVersion": "apps/v1", "kind": "DaemonSet", "name": NODE, "uid": "uid-d"}, f"apps/v1 DaemonSet {NODE}"),
     ({"apiVersion": "v2", "kind": "Node", "name": NODE, "uid": "uid-a"}, f"v2 Node {NODE}")],
    ids=["another node", "another kind", "another apiVersion"],
)
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_slice_owned_by_anything_but_its_own_node_is_refused(policy: Obj, operation: str, owner: Obj,
                                                                named: str) -> None:
    name = generated(NODE)["metadata"]["name"]
    mine = node_owner(NODE, "uid-a")[0]
    assert admit(policy, operation, owned(generated(NODE), mine, owner)) == [
        f"The gpushare DRA driver on node {NODE} may make its ResourceSlice {name} owned only by its own Node "
        f"(ownerReferences apiVersion v1, kind Node, name {NODE}), not by {named}."]
