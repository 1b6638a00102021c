"""MutatingAdmissionPolicies evaluated with cel-python the way kube-apiserver runs them: a policy object and a
request in, the object its mutations leave out.

What it models, after k8s.io/apiserver v0.37.2 pkg/admission/plugin/policy/mutating:
- matching (resource rules, namespaceSelector), matchConditions and variables, evaluated as for a
  ValidatingAdmissionPolicy (policies.evaluate: the generic matcher and composited variables both plugins share);
- the mutations in order, each on the object the one before left (dispatcher.go, dispatchInvocations);
- JSONPatch mutations (patch/json_patch.go): the expression yields a list of JSONPatch values (cellib.py), applied
  as RFC 6902 to the object's JSON; a failed `test` operation leaves the object as it was, and any other failure
  is an error, which the policy's failurePolicy Fail turns into a refusal (PatchFailed here);
- reinvocation (dispatcher.go, reinvocationcontext.go; k8s.io/apiserver pkg/admission/reinvocation.go): `admit`
  runs the policies, then the webhooks (admission.Chain, which reinvokes its own IfNeeded webhooks), then, where
  the webhooks changed the object, the IfNeeded policies that applied once more; kube-apiserver's plugin order is
  MutatingAdmissionPolicy before MutatingAdmissionWebhook (pkg/kubeapiserver/options/plugins.go).
Not modelled: ApplyConfiguration (structured merge diff) mutations, params, a binding's matchResources (a binding
is assumed to exist for each policy, without them), failurePolicy Ignore, and the defaulting of the patched object
(kube-apiserver defaults it after each patch; an env entry with a literal value has no default field).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import jsonpatch

from tests.harness.apiserver import policies
from tests.harness.apiserver.admission import Attributes, Chain
from tests.harness.apiserver.cellib import JSONPatch
from tests.harness.pods import USER

Obj = dict[str, Any]


class PatchFailed(Exception):
    """A mutation whose patch cannot be applied: with failurePolicy Fail the API server refuses the request."""


def operations(policy: Obj, operation: str, obj: Obj, old: Obj | None = None, *, user: str = USER,
               subresource: str = "", namespace: str = policies.NAMESPACE) -> list[Obj] | None:
    """None when the policy does not apply; else the JSON Patch operations of its first mutation, on `obj`."""
    evaluated = policies.evaluate(policy, operation, obj, old, user=user, subresource=subresource,
                                  namespace=namespace)
    if evaluated is None:
        return None
    spec, activation = evaluated
    return _patch(spec["mutations"][0], activation)


def _patch(mutation: Obj, activation: Obj) -> list[Obj]:
    if mutation.get("patchType") != "JSONPatch":
        raise NotImplementedError(f"patchType {mutation.get('patchType')!r} is not modelled; only JSONPatch is")
    result = policies.run(mutation["jsonPatch"]["expression"], activation, mutating=True)
    if not all(isinstance(op, JSONPatch) for op in result):
        raise PatchFailed("type mismatch: JSONPatchType.expression should evaluate to array of JSONPatch")
    return [op.operation() for op in result]


def mutate(policy: Obj, operation: str, obj: Obj, old: Obj | None = None, *, user: str = USER,
           subresource: str = "", namespace: str = policies.NAMESPACE) -> Obj | None:
    """None when the policy does not apply; else the object after its mutations (PatchFailed: refused)."""
    evaluated = policies.evaluate(policy, operation, obj, old, user=user, subresource=subresource,
                                  namespace=namespace)
    if evaluated is None:
        return None
    spec, activation = evaluated
    out = copy.deepcopy(obj)
    for index, mutation in enumerate(spec["mutations"]):
        # Matched once; each mutation's expressions see the object the mutations before it left.
        bound = activation if index == 0 else policies.rebind(policy, activation, out)
        out = _apply(out, _patch(mutation, bound))
    return out


def _apply(obj: Obj, ops: list[Obj]) -> Obj:
    try:
        patched: Obj = jsonpatch.apply_patch(copy.deepcopy(obj), ops)
    except jsonpatch.JsonPatchTestFailed:
        return obj  # patch/json_patch.go: a failed test operation leaves the object unpatched
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise PatchFailed(f"JSON Patch: {exc}") from exc
    return patched


def admit(maps: Sequence[Obj], chain: Chain, attrs: Attributes) -> Obj | None:
    """The mutating admission of one request: the policies `maps`, then the chain's webhooks, then the IfNeeded
    policies that applied once more where the webhooks changed the object. Returns the final object."""
    def run_policies(which: Sequence[Obj]) -> list[Obj]:
        applied = []
        for policy in which:
            if attrs.obj is None:
                break
            mutated = mutate(policy, attrs.operation, attrs.obj, attrs.old, user=attrs.user.username,
                             subresource=attrs.subresource, namespace=attrs.namespace)
            if mutated is not None:
                applied.append(policy)
                attrs.obj = mutated
        return applied

    applied = run_policies(maps)
    after_policies = copy.deepcopy(attrs.obj)
    chain.admit(attrs)
    if attrs.obj != after_policies:
        run_policies([p for p in applied if p["spec"].get("reinvocationPolicy") == "IfNeeded"])
    return attrs.obj
