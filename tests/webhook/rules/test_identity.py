"""The device plugin identity's limits and the Binding rule, as the webhook enforces them."""

from __future__ import annotations

import pytest

from tests.harness.cases.plugin_cases import BINDINGS, PLUGIN_WRITES, SYSTEM
from tests.harness.pods import EXTENDER, KEY, NS, PLUGIN, USER, Pod, annotate
from webhook.rules.identity import changed_field, first_difference
from webhook.rules.validate import validate, validate_binding
from webhook.server.settings import settings_from

POLICY = settings_from({})


@pytest.mark.parametrize(("case", "old", "new", "node", "subresource", "denied", "_policy"), PLUGIN_WRITES,
                         ids=[c[0] for c in PLUGIN_WRITES])
def test_the_plugin_identity_changes_only_its_own_annotations_on_its_own_node(
    case: str, old: Pod, new: Pod, node: str | None, subresource: str, denied: str | None, _policy: str | None
) -> None:
    verdict = validate("UPDATE", old, new, PLUGIN, NS, POLICY, KEY.public_key(), token_node=node,
                       subresource=subresource)
    if denied is None:
        assert verdict.allowed, f"{case}: {verdict.message}"
    else:
        assert not verdict.allowed, case
        assert verdict.message.startswith(f"gpushare denied pod {NS}/"), verdict.message
        assert denied in verdict.message, verdict.message


def test_a_denial_says_what_the_plugin_may_change() -> None:
    case = next(c for c in PLUGIN_WRITES if c[0] == "image of another node's pod")
    verdict = validate("UPDATE", case[1], case[2], PLUGIN, NS, POLICY, KEY.public_key(), token_node=case[3])
    assert verdict.message == (
        "gpushare denied pod ml/coredns-0. The gpushare device plugin of node gpu-node-1 changed "
        "spec.containers[0].image of a pod bound to node gpu-node-2; a plugin may write only to pods bound to its "
        "own node (the node its ServiceAccount token is bound to). The gpushare device plugin changed "
        "spec.containers[0].image, but the plugin identity may change only its own annotations "
        "(ALIYUN_COM_GPU_MEM_ASSIGNED, gpushare.io/allocation, and the placement keys where the pod has none); leave "
        "spec.containers[0].image as it was."
    )
    assert verdict.reasons == ("not_authorized",)


@pytest.mark.parametrize("user", [USER, EXTENDER, "system:node:gpu-node-2"])
def test_other_identities_are_not_held_to_the_plugin_rules(user: str) -> None:
    case = next(c for c in PLUGIN_WRITES if c[0] == "an annotation added")
    assert validate("UPDATE", case[1], case[2], user, NS, POLICY, KEY.public_key(), token_node="elsewhere").allowed


def test_a_configured_plugin_identity_is_the_one_held() -> None:
    mine = "system:serviceaccount:gpu:agent"
    policy = settings_from({"GPUSHARE_PLUGIN_IDENTITIES": mine})
    old = SYSTEM
    new = annotate(SYSTEM, {"note": "x"})
    assert not validate("UPDATE", old, new, mine, NS, policy, KEY.public_key(), token_node="gpu-node-2").allowed
    assert validate("UPDATE", old, new, PLUGIN, NS, policy, KEY.public_key(), token_node="gpu-node-1").allowed


@pytest.mark.parametrize(
    ("old", "new", "path"),
    [
        ({"a": 1}, {"a": 1}, None),
        ({"a": {"b": [1, 2]}}, {"a": {"b": [1, 3]}}, "x.a.b[1]"),
        ({"a": [1]}, {"a": [1, 2]}, "x.a"),
        ({"a": 1}, {"a": 1, "app.kubernetes.io/name": "w"}, "x['app.kubernetes.io/name']"),
        ({"a": 1}, {}, "x.a"),
        (None, {"a": 1}, "x"),
    ],
)
def test_first_difference_names_the_deepest_field(old: object, new: object, path: str | None) -> None:
    assert first_difference(old, new, "x") == path


def test_absent_and_empty_parts_are_the_same() -> None:
    with_empty = {**SYSTEM, "metadata": {**SYSTEM["metadata"], "labels": {}, "finalizers": []}}
    assert changed_field(SYSTEM, with_empty) is None


@pytest.mark.parametrize(("case", "binding", "user", "denied"), BINDINGS, ids=[b[0] for b in BINDINGS])
def test_a_binding_carries_reserved_annotations_only_from_the_extender(
    case: str, binding: Pod, user: str, denied: str | None
) -> None:
    verdict = validate_binding(binding, user, NS, POLICY)
    if denied is None:
        assert verdict.allowed, f"{case}: {verdict.message}"
    else:
        assert not verdict.allowed and verdict.reasons == ("not_authorized",), case
        assert verdict.message.startswith(f"gpushare denied pod {NS}/job-0. The Binding "), verdict.message
        assert denied in verdict.message, verdict.message
