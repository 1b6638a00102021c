"""The two admission paths of the chart, run as kube-apiserver runs them, for the tables that hold them to one result.

The webhook path is the chart as `helm install` renders it on a cluster without MutatingAdmissionPolicy v1
(Kubernetes 1.35): every pod goes to a webhook entry. The in-process path is the chart where the cluster serves it
(`--api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy`, 1.36 and newer): ordinary pods go to the
policy gpushare-neutralise and the ValidatingAdmissionPolicies only. A request is admitted in kube-apiserver's order
(pkg/kubeapiserver/options/plugins.go): mutating admission policies (tests/harness/apiserver/mutating.py), mutating
webhooks (the test API server's chain, calling the real webhook), validating admission policies
(tests/harness/apiserver/policies.py), validating webhooks; the first refusal ends it.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

from charts.knobs import CAPABILITIES
from tests.harness.apiserver import mutating, policies
from tests.harness.apiserver.admission import Attributes
from tests.harness.apiserver.auth import User
from tests.harness.apiserver.resources import PODS
from tests.harness.apiserver.server import ApiServer
from tests.harness.apiserver.status import ApiError
from tests.harness.manifests import helm
from tests.harness.pods import Pod

Obj = dict[str, Any]
WEBHOOK, IN_PROCESS = "webhook", "in-process"
PATHS = (WEBHOOK, IN_PROCESS)
MAP_API = CAPABILITIES["in-process"]
SELF = "gpushare-system"
STAMP_KEYS = ("gpushare.io/intent", "gpushare.io/intent-signature")


@functools.cache
def _rendered(path: str, sets: tuple[str, ...], set_json: tuple[str, ...]) -> tuple[Obj, ...]:
    return tuple(helm.template(sets=sets, set_json=set_json, api_versions=[MAP_API] if path == IN_PROCESS else []))


def rendered(path: str, sets: tuple[str, ...] = (), set_json: tuple[str, ...] = ()) -> list[Obj]:
    """The chart's objects on a cluster of that path, with the given --set and --set-json (a fresh copy)."""
    return copy.deepcopy(list(_rendered(path, sets, set_json)))


def of_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


@dataclass
class Admitted:
    """The pod admission leaves, and the refusal the client sees (None: admitted)."""

    pod: Pod
    refusal: str | None


class RenderedAdmission:
    """The test API server with one render's webhook configurations, routed to a webhook at `url` (a dead port: the
    webhook is down), and that render's admission policies."""

    def __init__(self, objs: list[Obj], url: str, ca_pem: bytes) -> None:
        self.api = ApiServer()
        self.api.add_service(SELF, "gpushare-webhook", 443, url)
        self.api.load_webhook_configurations(objs, ca_pem)
        self.mutating = of_kind(objs, "MutatingAdmissionPolicy")
        self.validating = of_kind(objs, "ValidatingAdmissionPolicy")

    def stop(self) -> None:
        self.api.stop()

    def admit(self, attrs: Attributes) -> Admitted:
        self.api.add_namespace(attrs.namespace)
        sent = copy.deepcopy(attrs.obj)
        try:
            mutated = mutating.admit(self.mutating, self.api.chain, attrs)
        except mutating.PatchFailed as exc:
            return Admitted(sent or {}, f"MutatingAdmissionPolicy failed: {exc}")
        except ApiError as exc:
            return Admitted(sent or {}, exc.message)
        assert mutated is not None
        for policy in self.validating:
            name = policy["metadata"]["name"]
            messages = policies.admit(policy, attrs.operation, mutated, attrs.old, user=attrs.user.username,
                                      subresource=attrs.subresource, namespace=attrs.namespace)
            if messages:
                # pkg/admission/plugin/policy/validating/dispatcher.go: the first failed validation's message.
                return Admitted(mutated, f"ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: "
                                         f"{messages[0]}")
        try:
            self.api.chain.validate(attrs)
        except ApiError as exc:
            return Admitted(mutated, exc.message)
        return Admitted(mutated, None)

    def create(self, sent: Pod, namespace: str, user: User) -> Admitted:
        obj = copy.deepcopy(sent)
        obj["metadata"]["namespace"] = namespace
        return self.admit(Attributes(PODS, "CREATE", namespace, obj["metadata"].get("name", ""), obj, None, user))

    def add_ephemeral(self, old: Pod, added: Obj, user: User) -> Admitted:
        """A pods/ephemeralcontainers UPDATE of `old` (as admitted) that adds the container `added`."""
        new = copy.deepcopy(old)
        new["spec"]["ephemeralContainers"] = [*new["spec"].get("ephemeralContainers", []), copy.deepcopy(added)]
        namespace = old["metadata"]["namespace"]
        return self.admit(Attributes(PODS, "UPDATE", namespace, old["metadata"]["name"], new, copy.deepcopy(old),
                                     user, subresource="ephemeralcontainers"))


def comparable(p: Pod) -> Pod:
    """`p` with the stamp's values (a fresh allocation id and its signature at each CREATE) replaced by a mark: the
    paths stamp the same pods, not with the same id."""
    out = copy.deepcopy(p)
    annotations = out.get("metadata", {}).get("annotations", {})
    for key in STAMP_KEYS:
        if key in annotations:
            annotations[key] = "<stamped>"
    return out
