"""The kinds the test API server serves: group, version, plural, kind, scope and subresources."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ("create", "delete", "get", "list", "patch", "update", "watch")

    @property
    def key(self) -> str:
        """The name the client and the store use: the plural, qualified by the group outside the core group."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


ADMISSION = "admissionregistration.k8s.io"
EVENTS = "events.k8s.io"

RESOURCES: tuple[Resource, ...] = (
    Resource("", "v1", "pods", "Pod", True, ("po",), ("binding", "status")),
    Resource("", "v1", "nodes", "Node", False, ("no",), ("status",)),
    Resource("", "v1", "namespaces", "Namespace", False, ("ns",), ("status",)),
    Resource("", "v1", "events", "Event", True, ("ev",)),
    Resource("", "v1", "secrets", "Secret", True),
    Resource("", "v1", "configmaps", "ConfigMap", True, ("cm",)),
    Resource(EVENTS, "v1", "events", "Event", True, ("ev",)),
    Resource(ADMISSION, "v1", "mutatingwebhookconfigurations", "MutatingWebhookConfiguration", False),
    Resource(ADMISSION, "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", False),
)

BY_KEY: dict[str, Resource] = {r.key: r for r in RESOURCES}
BY_PATH: dict[tuple[str, str, str], Resource] = {(r.group, r.version, r.plural): r for r in RESOURCES}
PODS = BY_KEY["pods"]
NODES = BY_KEY["nodes"]
NAMESPACES = BY_KEY["namespaces"]
MUTATING = BY_KEY[f"mutatingwebhookconfigurations.{ADMISSION}"]
VALIDATING = BY_KEY[f"validatingwebhookconfigurations.{ADMISSION}"]


def resource(key: str) -> Resource:
    """The resource for a store key such as `pods` or `events.events.k8s.io`; a KeyError names the choices."""
    try:
        return BY_KEY[key]
    except KeyError:
        raise KeyError(f"the test API server has no resource {key!r}; it serves {', '.join(sorted(BY_KEY))}") from None

