"""An RBAC authorizer built from rendered manifests, for the simulated API server (`ApiServer(authorize=...)`).

Users in the system:masters group may do anything; ServiceAccounts get exactly what the rendered Roles,
ClusterRoles and their bindings grant; everyone else is denied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Obj = dict[str, Any]
Authorizer = Callable[..., "str | None"]


def _subject_user(subject: Obj, binding_namespace: str) -> str | None:
    if subject.get("kind") != "ServiceAccount":
        return None
    return f"system:serviceaccount:{subject.get('namespace', binding_namespace)}:{subject['name']}"


def _allows(rule: Obj, verb: str, group: str, resource: str, name: str) -> bool:
    return (
        (verb in rule.get("verbs", []) or "*" in rule.get("verbs", []))
        and (group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", []))
        and (resource in rule.get("resources", []) or "*" in rule.get("resources", []))
        and (not rule.get("resourceNames") or name in rule["resourceNames"])
    )


def grants(objs: Iterable[Obj]) -> dict[str, list[tuple[str | None, Obj]]]:
    """username -> [(namespace the rule applies in, or None for cluster-wide; rule)]."""
    objs = list(objs)
    roles = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    out: dict[str, list[tuple[str | None, Obj]]] = {}
    for binding in objs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ns = binding["metadata"].get("namespace", "")
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], ns if ref["kind"] == "Role" else "", ref["name"]))
        if role is None:
            continue
        scope = ns if binding["kind"] == "RoleBinding" else None
        for subject in binding.get("subjects", []):
            username = _subject_user(subject, ns)
            if username:
                out.setdefault(username, []).extend((scope, rule) for rule in role.get("rules", []))
    return out


def authorizer(objs: Iterable[Obj]) -> Authorizer:
    """`(user, verb, resource, subresource, namespace, name) -> None | reason`, as the simulated API server expects."""
    table = grants(objs)

    def authorize(who: Any, verb: str, res: Any, sub: str, namespace: str, name: str) -> str | None:
        if "system:masters" in who.groups:
            return None
        resource = f"{res.plural}/{sub}" if sub else res.plural
        for scope, rule in table.get(who.username, []):
            if (scope is None or scope == namespace) and _allows(rule, verb, res.group, resource, name):
                return None
        where = f' in namespace "{namespace}"' if namespace else " at the cluster scope"
        group = f' in API group "{res.group}"' if res.group else ""
        return f'User "{who.username}" cannot {verb} resource "{resource}"{group}{where}'

    return authorize
