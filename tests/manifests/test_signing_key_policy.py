"""The signing-key Job's identity creates the key pair and nothing else: its Role may create any Secret or ConfigMap
of the namespace (RBAC cannot name what a create makes), and the policy beside it, as the API server evaluates it
(tests/harness/apiserver/policies.py), refuses every other create, a ServiceAccount token Secret above all."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from certs import commands
from certs.commands import Run, Target
from certs.plan import SIGNING_SECRET, VERIFY_CONFIGMAP
from tests.harness.apiserver import policies
from tests.harness.apiserver.certs_cluster import FakeCluster
from tests.harness.manifests.render import NAMESPACE, find, objects, render

JOB_USER = f"system:serviceaccount:{NAMESPACE}:gpushare-certs"
POLICY = "gpushare-certs-creates-only-the-key-pair"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def policy() -> Obj:
    return find(render("cert-manager"), "ValidatingAdmissionPolicy", POLICY)


def admit(policy: Obj, resource: str, obj: Obj, *, user: str = JOB_USER) -> list[str] | None:
    return policies.admit(policy, "CREATE", obj, user=user, resource=resource, namespace=NAMESPACE)


def secret(name: str, kind: str | None = "Opaque", **annotations: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "annotations": annotations},
            **({"type": kind} if kind else {})}


def configmap(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {}}


def test_what_the_job_creates_is_admitted(policy: Obj) -> None:
    """The objects `gpushare-certs signing-key` writes on a fresh cluster, by name and type."""
    cluster = FakeCluster(namespaces={NAMESPACE})
    commands.signing_key(Run(cluster, Target(namespace=NAMESPACE), datetime.datetime.now(datetime.UTC),
                             lambda line: None))
    [(namespace, name)] = cluster.secrets
    assert (namespace, name) == (NAMESPACE, SIGNING_SECRET) and list(cluster.configmaps) == [(NAMESPACE,
                                                                                             VERIFY_CONFIGMAP)]
    assert admit(policy, "secrets", secret(name, cluster.secrets[namespace, name][1])) == []
    assert admit(policy, "secrets", secret(name, None)) == [], "a Secret without a type is Opaque"
    assert admit(policy, "configmaps", configmap(VERIFY_CONFIGMAP)) == []


def _refused(what: str) -> list[str]:
    return [f"The signing-key Job's identity gpushare-certs may create only Secret gpushare-signing-key (type Opaque) "
            f"and ConfigMap gpushare-verify-key, not {what}."]


@pytest.mark.parametrize(
    ("resource", "obj", "messages"),
    [
        # The finding: a token Secret for another identity of the namespace (read all pods, all claims).
        ("secrets", secret("plugin-token", "kubernetes.io/service-account-token",
                           **{"kubernetes.io/service-account.name": "gpushare-device-plugin"}),
         _refused("Secret plugin-token of type kubernetes.io/service-account-token")),
        ("secrets", secret(SIGNING_SECRET, "kubernetes.io/service-account-token",
                           **{"kubernetes.io/service-account.name": "gpushare-dra-plugin"}),
         _refused(f"Secret {SIGNING_SECRET} of type kubernetes.io/service-account-token")),
        ("secrets", secret("gpushare-webhook-tls"), _refused("Secret gpushare-webhook-tls of type Opaque")),
        ("configmaps", configmap("gpushare-config"), _refused("ConfigMap gpushare-config")),
    ],
    ids=["token of another identity", "token under the key's name", "another Secret", "another ConfigMap"],
)
def test_any_other_create_is_refused(policy: Obj, resource: str, obj: Obj, messages: list[str]) -> None:
    assert admit(policy, resource, obj) == messages


def test_the_policy_covers_every_create_the_role_grants_and_judges_no_one_else(policy: Obj) -> None:
    objs = render("cert-manager")
    creatable = {r for rule in find(objs, "Role", "gpushare-certs")["rules"] if "create" in rule["verbs"]
                 for r in rule["resources"]}
    assert creatable == {"secrets", "configmaps"}
    assert all(admit(policy, r, secret("x") if r == "secrets" else configmap("x")) for r in creatable)
    assert admit(policy, "secrets", secret("x"), user="kubernetes-admin") is None
    [binding] = [b for b in objects(objs, "ValidatingAdmissionPolicyBinding") if b["spec"]["policyName"] == POLICY]
    assert binding["spec"]["validationActions"] == ["Deny"] and policy["spec"]["failurePolicy"] == "Fail"
    assert not [o for o in render("self-signed") if o["metadata"]["name"] == POLICY], "no Job, no policy"
