"""Which webhooks the admission chain calls: rules, namespace and object selectors, matchConditions, dry run."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.apiserver.admission import Attributes, _rule_matches
from tests.harness.apiserver.auth import User
from tests.harness.apiserver.client import SimClient
from tests.harness.apiserver.fakehook import POD_RULE, FakeWebhook, configuration, webhook
from tests.harness.apiserver.resources import BY_KEY, NODES
from tests.harness.apiserver.server import ApiServer
from tests.harness.apiserver.status import ApiError
from tests.harness.tls import Authority
from tests.sim.test_admission import install, pod

pytestmark = pytest.mark.timeout(60)

Obj = dict[str, Any]


def test_namespace_selector(api: ApiServer, hook: FakeWebhook, authority: Authority, admin: SimClient) -> None:
    selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                      "values": ["gpushare-system"]}]}
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          namespaceSelector=selector)))
    admin.create_pod("gpushare-system", pod())
    assert hook.calls == []
    api.add_namespace("team-a", {"gpu": "yes"})
    admin.create_pod("team-a", pod())
    assert len(hook.calls) == 1


def test_namespace_selector_by_label(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                     admin: SimClient) -> None:
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          namespaceSelector={"matchLabels": {"gpu": "yes"}})))
    api.add_namespace("team-a", {"gpu": "yes"})
    admin.create_pod("team-a", pod())
    admin.create_pod("default", pod())
    assert [request["namespace"] for _, request in hook.calls] == ["team-a"]


def test_object_selector_matches_new_or_old(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                            admin: SimClient) -> None:
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          objectSelector={"matchLabels": {"app": "demo"}})))
    admin.create_pod("default", pod("with-label"))
    admin.create_pod("default", {**pod("no-label"), "metadata": {"name": "no-label"}})
    assert [request["name"] for _, request in hook.calls] == ["with-label"]
    admin.patch_pod("default", "with-label", {"metadata": {"labels": {"app": None}}})  # old object matches
    assert len(hook.calls) == 2


@pytest.mark.parametrize(
    ("expression", "called"),
    [
        ("object.metadata.name == 'p'", True),
        ("object.metadata.name == 'q'", False),
        ("request.userInfo.username == 'kubernetes-admin' && oldObject == null", True),
        ("has(object.metadata.annotations) && 'x' in object.metadata.annotations", False),
        ("object.spec.containers.exists(c, c.image.startsWith('busy'))", True),
    ],
)
def test_match_conditions(api: ApiServer, hook: FakeWebhook, authority: Authority, admin: SimClient,
                          expression: str, called: bool) -> None:
    conditions = [{"name": "only", "expression": expression}]
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          matchConditions=conditions)))
    admin.create_pod("default", pod())
    assert bool(hook.calls) is called


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_match_condition_error_follows_failure_policy(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                                      admin: SimClient, policy: str) -> None:
    conditions = [{"name": "broken", "expression": "object.metadata.nosuchfield == 'x'"}]
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          matchConditions=conditions, failurePolicy=policy)))
    if policy == "Ignore":
        admin.create_pod("default", pod())
        assert hook.calls == []
        return
    with pytest.raises(ApiError) as caught:
        admin.create_pod("default", pod())
    assert caught.value.code == 500
    assert "match condition 'broken'" in caught.value.message


def test_false_condition_wins_over_an_error(api: ApiServer, hook: FakeWebhook, authority: Authority,
                                            admin: SimClient) -> None:
    conditions = [{"name": "broken", "expression": "object.nosuch == 1"}, {"name": "no", "expression": "false"}]
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          matchConditions=conditions)))
    admin.create_pod("default", pod())
    assert hook.calls == []


@pytest.mark.parametrize(("side_effects", "allowed"), [("None", True), ("NoneOnDryRun", True),
                                                       ("Some", False), ("Unknown", False)])
def test_dry_run_and_side_effects(api: ApiServer, hook: FakeWebhook, authority: Authority, admin: SimClient,
                                  side_effects: str, allowed: bool) -> None:
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          sideEffects=side_effects)))
    if allowed:
        admin.create("pods", pod(), "default", dry_run=True)
        assert hook.calls[0][1]["dryRun"] is True
    else:
        with pytest.raises(ApiError, match=r'admission webhook "validate\.test" does not support dry run'):
            admin.create("pods", pod(), "default", dry_run=True)
    assert admin.get_pod("default", "p") is None


def _attrs(resource: str, operation: str, subresource: str = "") -> Attributes:
    return Attributes(BY_KEY[resource], operation, "default", "x", {}, None, User("u"), subresource=subresource)


@pytest.mark.parametrize(
    ("rule", "attrs", "matches"),
    [
        (POD_RULE, _attrs("pods", "CREATE"), True),
        (POD_RULE, _attrs("pods", "DELETE"), False),
        (POD_RULE, _attrs("pods", "CREATE", "binding"), False),
        ({**POD_RULE, "resources": ["pods/binding"]}, _attrs("pods", "CREATE", "binding"), True),
        ({**POD_RULE, "resources": ["pods/*"]}, _attrs("pods", "UPDATE", "status"), True),
        ({**POD_RULE, "resources": ["pods/*"]}, _attrs("pods", "UPDATE"), False),
        ({**POD_RULE, "resources": ["*"]}, _attrs("pods", "CREATE"), True),
        ({**POD_RULE, "resources": ["*"]}, _attrs("pods", "CREATE", "binding"), False),
        ({**POD_RULE, "resources": ["*/*"]}, _attrs("pods", "CREATE", "binding"), True),
        ({**POD_RULE, "resources": ["*/binding"]}, _attrs("pods", "CREATE", "binding"), True),
        ({**POD_RULE, "operations": ["*"]}, _attrs("pods", "DELETE"), True),
        ({**POD_RULE, "resources": ["nodes"]}, _attrs("nodes", "CREATE"), False),  # scope Namespaced
        ({**POD_RULE, "resources": ["nodes"], "scope": "*"}, _attrs("nodes", "CREATE"), True),
        ({**POD_RULE, "resources": ["nodes"], "scope": "Cluster"}, _attrs("nodes", "CREATE"), True),
        ({**POD_RULE, "scope": "Cluster"}, _attrs("pods", "CREATE"), False),
        ({**POD_RULE, "apiGroups": ["apps"]}, _attrs("pods", "CREATE"), False),
        ({**POD_RULE, "apiVersions": ["v2"]}, _attrs("pods", "CREATE"), False),
        ({**POD_RULE, "apiGroups": ["*"], "apiVersions": ["*"]}, _attrs("pods", "CREATE"), True),
    ],
)
def test_rules(rule: Obj, attrs: Attributes, matches: bool) -> None:
    assert _rule_matches(rule, attrs) is matches


def test_cluster_scoped_resources_ignore_namespace_selector(api: ApiServer, hook: FakeWebhook,
                                                            authority: Authority, admin: SimClient) -> None:
    rule = {**POD_RULE, "resources": ["nodes"], "scope": "*"}
    install(api, configuration("Validating", "v", webhook("validate.test", "/validate", authority.cert_pem,
                                                          rules=[rule],
                                                          namespaceSelector={"matchLabels": {"never": "x"}})))
    admin.create("nodes", {"metadata": {"name": "n1"}})
    [(_, request)] = hook.calls
    assert "namespace" not in request
    assert request["kind"]["kind"] == NODES.kind

