"""Bearer tokens of the test API server, mapped to users so admission `userInfo` is real; impersonation."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.harness.apiserver.resources import Resource
from tests.harness.apiserver.status import bad_request, forbidden


@dataclass(frozen=True)
class User:
    username: str
    groups: tuple[str, ...] = ("system:authenticated",)
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict, hash=False, compare=False)

    def info(self) -> dict[str, Any]:
        """The AdmissionReview `userInfo` (authentication.k8s.io/v1 UserInfo)."""
        out: dict[str, Any] = {"username": self.username, "groups": list(self.groups)}
        if self.uid:
            out["uid"] = self.uid
        if self.extra:
            out["extra"] = self.extra
        return out


ADMIN = User("kubernetes-admin", ("system:masters", "system:authenticated"))


def service_account(namespace: str, name: str) -> User:
    """The user a ServiceAccount token authenticates as, with the groups the real token authenticator adds."""
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
        uid=f"sa-{namespace}-{name}",
    )


def pod_token(account: User, pod: str, node: str) -> User:
    """`account` as its pod's projected token authenticates it (Kubernetes >= 1.30): the token is bound to the pod
    and names the pod's node (k8s.io/apiserver pkg/authentication/serviceaccount, ServiceAccountInfo.UserInfo)."""
    extra = {
        "authentication.kubernetes.io/credential-id": [f"JTI={secrets.token_hex(8)}"],
        "authentication.kubernetes.io/node-name": [node],
        "authentication.kubernetes.io/node-uid": [f"node-{node}"],
        "authentication.kubernetes.io/pod-name": [pod],
        "authentication.kubernetes.io/pod-uid": [f"pod-{pod}"],
    }
    return User(account.username, account.groups, account.uid, extra)


def user(name: str, *groups: str) -> User:
    """An ordinary user in the given groups plus system:authenticated."""
    return User(name, (*groups, "system:authenticated"))


class Tokens:
    """Token -> user; thread-safe so tests can add identities while the server runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users: dict[str, User] = {}

    def add(self, who: User, token: str | None = None) -> str:
        token = token or secrets.token_urlsafe(24)
        with self._lock:
            self._users[token] = who
        return token

    def lookup(self, token: str) -> User | None:
        with self._lock:
            return self._users.get(token)


SA_PREFIX = "system:serviceaccount:"
IMPERSONATED = {"users": Resource("", "v1", "users", "User", False),
                "groups": Resource("", "v1", "groups", "Group", False)}
Authorize = Callable[..., "str | None"]  # ApiServer.authorize: (who, verb, resource, subresource, namespace, name)


def acting_as(found: User, name: str, groups: Sequence[str], authorize: Authorize) -> User:
    """Whom a request acts as, given its Impersonate-User and Impersonate-Group headers (k8s.io/apiserver
    pkg/endpoints/filters/impersonation.go): the authenticated user needs the `impersonate` verb on the user and on
    each group; the identity gets system:authenticated, and a ServiceAccount named without groups gets its own.

    Simplification: ServiceAccounts are authorized as `users`, and Impersonate-Uid and -Extra-* are not read."""
    if not name:
        if groups:
            raise bad_request(f"requested {list(groups)} without impersonating a user")
        return found
    for kind, value in [("users", name), *(("groups", g) for g in groups)]:
        problem = authorize(found, "impersonate", IMPERSONATED[kind], "", "", value)
        if problem:
            raise forbidden(problem)
    if name.startswith(SA_PREFIX) and not groups and name.count(":") == 3:
        namespace, account = name[len(SA_PREFIX):].split(":")
        return service_account(namespace, account)
    return user(name, *(g for g in groups if g != "system:authenticated"))
