"""The admission chain of the test API server: mutating then validating webhooks, as kube-apiserver runs them."""

from __future__ import annotations

import base64
import copy
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from tests.harness.apiserver import cel
from tests.harness.apiserver.auth import User
from tests.harness.apiserver.resources import MUTATING, VALIDATING, Resource
from tests.harness.apiserver.selectors import selector_matches
from tests.harness.apiserver.status import ApiError, bad_request, internal
from tests.harness.apiserver.store import Store
from tests.harness.apiserver.webhookcall import CallError, ServiceMap, post_review

log = logging.getLogger(__name__)

Obj = dict[str, Any]
NamespaceLabels = Callable[[str], Mapping[str, str]]


@dataclass
class Attributes:
    """One request as admission sees it (admission.Attributes in kube-apiserver)."""

    resource: Resource
    operation: str  # CREATE | UPDATE | DELETE | CONNECT
    namespace: str
    name: str
    obj: Obj | None
    old: Obj | None
    user: User
    subresource: str = ""
    kind: str = ""
    dry_run: bool = False
    options: Obj | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def kind_ref(self) -> Obj:
        return {"group": self.resource.group, "version": self.resource.version,
                "kind": self.kind or self.resource.kind}

    @property
    def resource_ref(self) -> Obj:
        return {"group": self.resource.group, "version": self.resource.version, "resource": self.resource.plural}


def _rule_matches(rule: Mapping[str, Any], attrs: Attributes) -> bool:
    def has(values: Any, item: str) -> bool:
        return isinstance(values, list) and ("*" in values or item in values)

    if not has(rule.get("operations"), attrs.operation):
        return False
    if not has(rule.get("apiGroups"), attrs.resource.group) or not has(rule.get("apiVersions"), attrs.resource.version):
        return False
    scope = rule.get("scope") or "*"
    if scope == "Namespaced" and not attrs.resource.namespaced:
        return False
    if scope == "Cluster" and attrs.resource.namespaced:
        return False
    plural, sub = attrs.resource.plural, attrs.subresource
    for entry in rule.get("resources") or []:
        res, _, entry_sub = str(entry).partition("/")
        if entry == "*/*" or (entry == "*" and not sub):
            return True
        if res in ("*", plural) and ((not entry_sub and not sub) or (entry_sub in ("*", sub) and sub)):
            return True
    return False


class Chain:
    """Reads the webhook configurations from the store at each request and runs them."""

    def __init__(self, store: Store, services: ServiceMap, namespace_labels: NamespaceLabels) -> None:
        self.store = store
        self.services = services
        self.namespace_labels = namespace_labels

    def _webhooks(self, resource: Resource) -> list[Obj]:
        configs, _ = self.store.list(resource.key)
        configs.sort(key=lambda c: str(c["metadata"]["name"]))
        return [hook for config in configs for hook in config.get("webhooks") or []]

    def _selected(self, hook: Obj, attrs: Attributes) -> bool:
        if not any(_rule_matches(rule, attrs) for rule in hook.get("rules") or []):
            return False
        if attrs.resource.namespaced:
            if not selector_matches(hook.get("namespaceSelector"), self.namespace_labels(attrs.namespace)):
                return False
        elif attrs.resource.plural == "namespaces" and not attrs.resource.group:
            labels = ((attrs.obj or attrs.old or {}).get("metadata") or {}).get("labels") or {}
            if not selector_matches(hook.get("namespaceSelector"), labels):
                return False
        selector = hook.get("objectSelector")
        if selector:
            # The real server matches when either the new or the old object's labels match.
            candidates = [o for o in (attrs.obj, attrs.old) if o is not None]
            if not any(selector_matches(selector, (o.get("metadata") or {}).get("labels") or {}) for o in candidates):
                return False
        return True

    def _request(self, attrs: Attributes) -> Obj:
        request: Obj = {
            "uid": str(uuid.uuid4()),
            "kind": attrs.kind_ref,
            "resource": attrs.resource_ref,
            "requestKind": attrs.kind_ref,
            "requestResource": attrs.resource_ref,
            "name": attrs.name,
            "namespace": attrs.namespace,
            "operation": attrs.operation,
            "userInfo": attrs.user.info(),
            "object": attrs.obj,
            "oldObject": attrs.old,
            "dryRun": attrs.dry_run,
            "options": attrs.options,
        }
        if attrs.subresource:
            request["subResource"] = attrs.subresource
            request["requestSubResource"] = attrs.subresource
        if not attrs.resource.namespaced:
            del request["namespace"]
        return request

    def _call(self, hook: Obj, attrs: Attributes, mutating: bool) -> Obj | None:
        """The webhook's response, or None when it does not apply or failed under failurePolicy Ignore."""
        name = str(hook.get("name", ""))
        if not self._selected(hook, attrs):
            return None
        fail = (hook.get("failurePolicy") or "Fail") == "Fail"
        request = self._request(attrs)
        verdict = cel.match_conditions(hook.get("matchConditions") or [],
                                       {"object": attrs.obj, "oldObject": attrs.old, "request": request})
        if verdict.error:
            if fail:
                raise internal(f'failed calling webhook "{name}": failed to evaluate match conditions: {verdict.error}')
            log.warning("webhook %s skipped under failurePolicy Ignore: %s", name, verdict.error)
            return None
        if not verdict.matches:
            return None
        if attrs.dry_run and hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            raise bad_request(f'admission webhook "{name}" does not support dry run')
        try:
            if "v1" not in (hook.get("admissionReviewVersions") or []):
                raise CallError("webhook does not accept known AdmissionReview versions (the simulation speaks v1)")
            timeout = int(hook.get("timeoutSeconds") or 10)
            review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
            response = post_review(hook.get("clientConfig") or {}, self.services, review, timeout)
            if not mutating and response.get("patch"):
                raise CallError("validating webhooks may not return patches")
            if response.get("patch") and response.get("patchType") != "JSONPatch":
                raise CallError(f"unsupported patch type {response.get('patchType')!r}")
        except CallError as exc:
            if fail:
                raise internal(f'failed calling webhook "{name}": {exc}') from exc
            log.warning('failed calling webhook "%s" (failurePolicy Ignore): %s', name, exc)
            return None
        attrs.warnings.extend(str(w) for w in response.get("warnings") or [])
        if not response.get("allowed"):
            raise denial(name, response.get("status") or {})
        return response

    def admit(self, attrs: Attributes) -> Obj | None:
        """Run the mutating webhooks in order, re-invoking IfNeeded ones once; return the final object."""
        hooks = self._webhooks(MUTATING)
        reinvoke: list[int] = []
        invoked_before_change: set[int] = set()
        for index, hook in enumerate(hooks):
            called, changed = self._mutate(hook, attrs)
            if changed:
                # Every IfNeeded webhook called before this change must see the new object once more.
                reinvoke.extend(i for i in sorted(invoked_before_change) if i not in reinvoke)
                invoked_before_change.clear()
            if called and hook.get("reinvocationPolicy") == "IfNeeded":
                invoked_before_change.add(index)
        for index in sorted(reinvoke):
            self._mutate(hooks[index], attrs)
        return attrs.obj

    def _mutate(self, hook: Obj, attrs: Attributes) -> tuple[bool, bool]:
        """(called, changed the object)."""
        response = self._call(hook, attrs, mutating=True)
        if response is None:
            return False, False
        if not response.get("patch") or attrs.obj is None:
            return True, False
        name = str(hook.get("name", ""))
        try:
            ops = jsonpatch.JsonPatch.from_string(base64.b64decode(str(response["patch"])).decode())
            patched = ops.apply(copy.deepcopy(attrs.obj))
        except Exception as exc:  # any malformed patch is the webhook's fault; the real server answers 500
            raise internal(f'admission webhook "{name}" returned a patch that cannot be applied: {exc}') from exc
        if patched == attrs.obj:
            return True, False
        attrs.obj = patched
        return True, True

    def validate(self, attrs: Attributes) -> None:
        """Run the validating webhooks. Simplification: in order, one at a time (the real server runs them
        in parallel); the first denial or failure is returned."""
        for hook in self._webhooks(VALIDATING):
            self._call(hook, attrs, mutating=False)


def denial(name: str, result: Mapping[str, Any]) -> ApiError:
    """The error the client sees for a denial, built like apiserver's webhookerrors.ToStatusErr."""
    denied_by = f'admission webhook "{name}" denied the request'
    raw = result.get("code")
    code = raw if isinstance(raw, int) and raw >= 400 else 400
    message, reason = str(result.get("message") or ""), str(result.get("reason") or "")
    if message:
        text = f"{denied_by}: {message}"
    elif reason:
        text = f"{denied_by}: {reason}"
    else:
        text = f"{denied_by} without explanation"
    return ApiError(code, text, reason or None, result.get("details"))
