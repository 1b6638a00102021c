"""The ValidatingAdmissionPolicies of policy.yaml, evaluated with cel-python the way kube-apiserver runs them."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import celpy
import pytest
import yaml
from celpy import celtypes
from celpy.adapter import json_to_cel

from tests.manifests.render import MANIFESTS
from tests.webhook.pods import EXTENDER, PLUGIN, USER, Pod, annotate, container, pod, stamped
from tests.webhook.test_envrules import ATTACKS, HARMLESS, ephemeral
from webhook.protocol import IDX, Contract

pytestmark = pytest.mark.timeout(120)

ENV = celpy.Environment()
Obj = dict[str, Any]


def documents() -> list[Obj]:
    return [d for d in yaml.safe_load_all((MANIFESTS / "base" / "policy.yaml").read_text()) if d]


def policy(name: str) -> Obj:
    return next(d for d in documents() if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == name)


def run(expression: str, activation: Mapping[str, Any]) -> Any:
    result = ENV.program(ENV.compile(expression)).evaluate(dict(activation))
    # An expression that errors denies the request (failurePolicy Fail): on every pod of the cluster.
    assert not isinstance(result, Exception), f"{expression!r} failed: {result!r}"
    return result


def _rule_matches(spec: Obj, operation: str, subresource: str) -> bool:
    resource = "pods" + (f"/{subresource}" if subresource else "")
    return any(operation in rule["operations"] and resource in rule["resources"]
               for rule in spec["matchConstraints"]["resourceRules"])


def admit(name: str, operation: str, obj: Pod, old: Pod | None = None, *, user: str = USER,
          subresource: str = "", node: str | None = None) -> list[str] | None:
    """None when the policy does not apply; else the messages of the validations that fail ([] = allowed)."""
    spec = policy(name)["spec"]
    if not _rule_matches(spec, operation, subresource):
        return None
    user_info: dict[str, Any] = {"username": user, "groups": ["system:authenticated"]}
    if node is not None:
        user_info["extra"] = {"authentication.kubernetes.io/node-name": [node]}
    request = {"operation": operation, "namespace": "ml", "subResource": subresource, "userInfo": user_info}
    activation: dict[str, Any] = {"object": json_to_cel(obj), "oldObject": json_to_cel(old),
                                  "request": json_to_cel(request)}
    for condition in spec.get("matchConditions", []):
        if not bool(run(condition["expression"], activation)):
            return None
    variables: dict[celtypes.StringType, Any] = {}
    for variable in spec.get("variables", []):
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = run(variable["expression"], activation)
    activation["variables"] = celtypes.MapType(variables)
    return [str(run(v["messageExpression"], activation)) for v in spec["validations"]
            if not bool(run(v["expression"], activation))]


@pytest.mark.parametrize(("case", "spec", "fragments"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_container_env_policy_refuses_what_the_webhook_refuses(case: str, spec: Pod, fragments: list[str]) -> None:
    # As created with the webhook up (mutated) and down (not mutated): the policy needs no webhook.
    for candidate in (stamped(spec), spec):
        messages = admit("gpushare-container-env", "CREATE", candidate)
        assert messages, case
        assert messages[0].startswith("gpushare denied pod ml/job-0. Container "), case
        name = fragments[0].split("'")[1]
        assert f"Container {name} " in " ".join(messages), case


@pytest.mark.parametrize(("case", "spec"), HARMLESS, ids=[h[0] for h in HARMLESS])
def test_container_env_policy_allows_harmless_pods(case: str, spec: Pod) -> None:
    assert admit("gpushare-container-env", "CREATE", spec) == [], case
    assert admit("gpushare-container-env", "CREATE", stamped(spec)) == [], case


def test_container_env_policy_checks_only_added_ephemeral_containers() -> None:
    bad = {"name": "dbg", "image": "cuda", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
    old = pod(container("a"))
    messages = admit("gpushare-container-env", "UPDATE", ephemeral(old, bad), old, subresource="ephemeralcontainers")
    assert messages and "Container dbg sets" in messages[0]
    legacy = ephemeral(old, bad)  # added while no policy was installed: later additions are not blamed for it
    later = ephemeral(legacy, {"name": "dbg2", "image": "busybox"})
    assert admit("gpushare-container-env", "UPDATE", later, legacy, subresource="ephemeralcontainers") == []
    assert admit("gpushare-container-env", "UPDATE", later, legacy) is None  # plain pods UPDATE: not matched


GPU = stamped(pod(container("a", 2)))
PLACED = annotate(GPU, {IDX: "0", "ALIYUN_COM_GPU_MEM_DEV": "16", "ALIYUN_COM_GPU_MEM_POD": "2"})
INTENT = Contract().intent_key


def bound(p: Pod, node: str = "n1") -> Pod:
    out = copy.deepcopy(p)
    out["spec"]["nodeName"] = node
    return out


BOUND_GPU, BOUND = bound(GPU), bound(PLACED)
ALLOCATED = annotate(BOUND, {"ALIYUN_COM_GPU_MEM_ASSIGNED": "true", "gpushare.io/allocation": "{}"})


@pytest.mark.parametrize(
    ("case", "new", "old", "node", "denied"),
    [
        ("plugin of the pod's node records the allocation", ALLOCATED, BOUND, "n1", None),
        ("plugin of another node", ALLOCATED, BOUND, "n2", "of node n2 changed"),
        ("plugin token that names no node", ALLOCATED, BOUND, None, "with a token that names no node"),
        ("plugin moves the GPU", annotate(BOUND, {IDX: "1"}), BOUND, "n1", "changed ALIYUN_COM_GPU_MEM_IDX, but"),
        ("plugin removes the placement", annotate(BOUND, {IDX: None}), BOUND, "n1", "changed ALIYUN_COM_GPU_MEM_IDX"),
        ("plugin adds a missing placement (node-local)", annotate(BOUND_GPU, {IDX: "0"}), BOUND_GPU, "n1", None),
        ("plugin edits the intent", annotate(BOUND, {INTENT: "{}"}), BOUND, "n1", "changed gpushare.io/intent"),
        ("plugin on a pod not bound yet", annotate(PLACED, {"ALIYUN_COM_GPU_MEM_ASSIGNED": "true"}), PLACED, "n1",
         "not bound to any node"),
    ],
)
def test_the_plugin_identity_writes_only_its_job_on_its_node(case: str, new: Pod, old: Pod, node: str | None,
                                                             denied: str | None) -> None:
    messages = admit("gpushare-reserved-annotations", "UPDATE", copy.deepcopy(new), old, user=PLUGIN, node=node)
    if denied is None:
        assert not messages, f"{case}: {messages}"
    else:
        assert messages and denied in " ".join(messages), f"{case}: {messages}"


@pytest.mark.parametrize(
    ("case", "operation", "new", "old", "user", "subresource", "denied"),
    [
        ("user-supplied placement at CREATE", "CREATE", annotate(pod(container("a")), {IDX: "1"}), None, USER, "",
         "are reserved"),
        ("stamped pod at CREATE", "CREATE", GPU, None, USER, "", None),
        ("status update moves the GPU", "UPDATE", annotate(PLACED, {IDX: "1"}), PLACED, "system:node:n1", "status",
         "system:node:n1 changed ALIYUN_COM_GPU_MEM_IDX, a reserved annotation"),
        ("status update gives a plain pod a placement", "UPDATE", annotate(pod(container("a")), {IDX: "1"}),
         pod(container("a")), "operator", "status", "operator changed ALIYUN_COM_GPU_MEM_IDX, a reserved"),
        ("status update removes the allocation state", "UPDATE", annotate(PLACED, {IDX: None}), PLACED, USER,
         "status", "changed ALIYUN_COM_GPU_MEM_IDX, a reserved annotation"),
        ("extender writes the placement", "UPDATE", PLACED, GPU, EXTENDER, "", None),
        ("plugin marks the pod assigned", "UPDATE", annotate(BOUND, {"ALIYUN_COM_GPU_MEM_ASSIGNED": "true"}),
         BOUND, PLUGIN, "", None),
        ("extender edits the intent", "UPDATE", annotate(GPU, {INTENT: "{}"}), GPU, EXTENDER, "",
         "stamped once at creation"),
        ("status update that leaves annotations alone", "UPDATE", PLACED, PLACED, "system:node:n1", "status", None),
        ("label change by anyone", "UPDATE", annotate(PLACED, {"team": "a"}), PLACED, USER, "", None),
    ],
)
def test_reserved_annotations_policy(case: str, operation: str, new: Pod, old: Pod | None, user: str,
                                     subresource: str, denied: str | None) -> None:
    messages = admit("gpushare-reserved-annotations", operation, copy.deepcopy(new), old, user=user,
                     subresource=subresource, node="n1" if user == PLUGIN else None)
    if denied is None:
        assert not messages, f"{case}: {messages}"
    else:
        assert messages, case
        assert messages[0].startswith("gpushare denied pod ml/job-0. "), case
        assert denied in " ".join(messages), case


def test_every_policy_has_a_binding_that_denies() -> None:
    docs = documents()
    policies = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {d["spec"]["policyName"]: d["spec"]["validationActions"] for d in docs
                if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert policies == set(bindings) == {"gpushare-container-env", "gpushare-reserved-annotations"}
    assert all(actions == ["Deny"] for actions in bindings.values())


def test_trusted_identities_equal_the_configured_ones() -> None:
    config = yaml.safe_load((MANIFESTS / "base" / "config.yaml").read_text())["data"]
    trusted = {config["GPUSHARE_EXTENDER_IDENTITIES"], config["GPUSHARE_PLUGIN_IDENTITIES"]}
    expression = next(v["expression"] for v in policy("gpushare-reserved-annotations")["spec"]["variables"]
                      if v["name"] == "trusted")
    assert all(f"'{identity}'" in expression for identity in trusted)
