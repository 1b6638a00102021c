"""ValidatingAdmissionPolicies evaluated with cel-python the way kube-apiserver runs them: a policy object and a
request in, the messages of the validations that fail out. Matching, match conditions and variables are the same
for a MutatingAdmissionPolicy (k8s.io/apiserver pkg/admission/plugin/policy/generic and matching), which
tests/harness/apiserver/mutating.py evaluates with `evaluate` here and its own mutations."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel

from tests.harness.apiserver import cellib
from tests.harness.apiserver.selectors import selector_matches
from tests.harness.pods import USER

ENV = celpy.Environment()
# A MutatingAdmissionPolicy's expressions may also build JSONPatch values (cellib.py).
MUTATING_ENV = celpy.Environment(annotations=dict(cellib.TYPES))
NAMESPACE = "ml"
# Cluster-scoped resources the policies match; a namespaceSelector never skips a request for one of them.
CLUSTER_SCOPED = ("nodes", "resourceslices")
Obj = dict[str, Any]


@functools.lru_cache(maxsize=1024)
def _program(expression: str, mutating: bool) -> Any:
    env = MUTATING_ENV if mutating else ENV
    return env.program(env.compile(expression), functions=dict(cellib.FUNCTIONS))


def run(expression: str, activation: Mapping[str, Any], *, mutating: bool = False) -> Any:
    result = _program(expression, mutating).evaluate({**cellib.NAMESPACES, **activation})
    # An expression that errors denies the request (failurePolicy Fail): on every pod of the cluster.
    assert not isinstance(result, Exception), f"{expression!r} failed: {result!r}"
    return result


def _rule_matches(spec: Obj, operation: str, resource: str) -> bool:
    def names(rule: Obj, item: str) -> bool:
        return item in rule["resources"] or ("/" in item and f"{item.partition('/')[0]}/*" in rule["resources"])

    return any(operation in rule["operations"] and names(rule, resource)
               for rule in spec["matchConstraints"]["resourceRules"])


def _namespace_matches(spec: Obj, namespace: str) -> bool:
    # The API server sets kubernetes.io/metadata.name on every namespace, equal to its name.
    return selector_matches(spec["matchConstraints"].get("namespaceSelector"),
                            {"kubernetes.io/metadata.name": namespace})


def evaluate(policy: Obj, operation: str, obj: Obj | None, old: Obj | None = None, *, user: str = USER,
             subresource: str = "", node: str | None = None, resource: str = "pods",
             namespace: str = NAMESPACE) -> tuple[Obj, Obj] | None:
    """None when the policy does not apply; else (its spec, the activation with every variable evaluated).
    A MutatingAdmissionPolicy's expressions run in MUTATING_ENV.

    The request is built as kube-apiserver builds it for CEL (k8s.io/apiserver pkg/admission/plugin/cel,
    CreateAdmissionRequest): empty fields such as subResource and userInfo.extra are absent, not empty. A DELETE
    has no object (None) and the request names the old one.
    """
    spec = policy["spec"]
    if not _rule_matches(spec, operation, resource + (f"/{subresource}" if subresource else "")):
        return None
    if resource not in CLUSTER_SCOPED and not _namespace_matches(spec, namespace):
        return None
    user_info: dict[str, Any] = {"username": user, "groups": ["system:authenticated"]}
    if node is not None:
        user_info["extra"] = {"authentication.kubernetes.io/node-name": [node]}
    request: dict[str, Any] = {"operation": operation, "userInfo": user_info,
                               "name": ((obj or old or {}).get("metadata") or {}).get("name", ""),
                               "resource": {"group": "", "version": "v1", "resource": resource}}
    if resource not in CLUSTER_SCOPED:
        request["namespace"] = namespace
    if subresource:
        request["subResource"] = subresource
    activation: dict[str, Any] = {"object": json_to_cel(obj), "oldObject": json_to_cel(old),
                                  "request": json_to_cel(request)}
    for condition in spec.get("matchConditions", []):
        if not bool(run(condition["expression"], activation, mutating=_mutating(policy))):
            return None
    return spec, _bind_variables(policy, activation)


def _mutating(policy: Obj) -> bool:
    return policy.get("kind") == "MutatingAdmissionPolicy"


def _bind_variables(policy: Obj, activation: dict[str, Any]) -> dict[str, Any]:
    """`activation` with `variables` holding each of the policy's variables, evaluated in order."""
    variables: dict[celtypes.StringType, Any] = {}
    for variable in policy["spec"].get("variables", []):
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(variable["name"])] = run(variable["expression"], activation,
                                                               mutating=_mutating(policy))
    activation["variables"] = celtypes.MapType(variables)
    return activation


def rebind(policy: Obj, activation: Obj, obj: Obj) -> dict[str, Any]:
    """The activation of an evaluated policy with `object` replaced by `obj` and the variables evaluated again:
    what a MutatingAdmissionPolicy's later mutation sees after the earlier ones changed the object."""
    return _bind_variables(policy, {**activation, "object": json_to_cel(obj)})


def admit(policy: Obj, operation: str, obj: Obj | None, old: Obj | None = None, *, user: str = USER,
          subresource: str = "", node: str | None = None, resource: str = "pods",
          namespace: str = NAMESPACE) -> list[str] | None:
    """None when the policy does not apply; else the messages of the validations that fail ([] = allowed)."""
    evaluated = evaluate(policy, operation, obj, old, user=user, subresource=subresource, node=node,
                         resource=resource, namespace=namespace)
    if evaluated is None:
        return None
    spec, activation = evaluated
    return [str(run(v["messageExpression"], activation)) if "messageExpression" in v else str(v["message"])
            for v in spec["validations"] if not bool(run(v["expression"], activation))]
