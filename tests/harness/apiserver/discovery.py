"""Discovery documents (legacy, non-aggregated) and the Table view `kubectl get` prints."""

from __future__ import annotations

import datetime
from typing import Any

from tests.harness.apiserver.resources import RESOURCES, Resource, groups

Obj = dict[str, Any]

VERSION: Obj = {
    "major": "1", "minor": "32", "gitVersion": "v1.32.0-gpushare-sim", "gitCommit": "simulation",
    "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23", "compiler": "gc",
    "platform": "linux/amd64",
}


def api_versions(address: str) -> Obj:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]}


def _group(name: str, versions: list[str]) -> Obj:
    refs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": refs, "preferredVersion": refs[0]}


def api_group_list() -> Obj:
    """Simplification: no aggregated discovery; kubectl falls back to these legacy documents."""
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [_group(name, versions) for name, versions in groups().items() if name]}


def api_group(name: str) -> Obj | None:
    versions = groups().get(name)
    if not name or not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def _entry(r: Resource, sub: str = "") -> Obj:
    entry: Obj = {"name": f"{r.plural}/{sub}" if sub else r.plural, "singularName": "" if sub else r.kind.lower(),
                  "namespaced": r.namespaced, "kind": "Binding" if sub == "binding" else r.kind,
                  "verbs": (["create"] if sub == "binding" else ["get", "patch", "update"]) if sub else list(r.verbs)}
    if r.short_names and not sub:
        entry["shortNames"] = list(r.short_names)
    if not sub:
        entry["categories"] = ["all"] if r.kind == "Pod" else []
    return entry


def api_resource_list(group: str, version: str) -> Obj | None:
    chosen = [r for r in RESOURCES if r.group == group and r.version == version]
    if not chosen:
        return None
    entries = [e for r in chosen for e in [_entry(r), *(_entry(r, s) for s in r.subresources)]]
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": entries}


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def _age(obj: Obj) -> str:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return "<unknown>"
    created = datetime.datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    seconds = int((datetime.datetime.now(datetime.UTC) - created).total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def _pod_cells(pod: Obj) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount") or 0) for s in statuses)
    phase = status.get("reason") or status.get("phase") or "Unknown"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        phase = "Terminating"
    ready_text = f"{ready}/{len(spec.get('containers') or [])}"
    return [ready_text, phase, restarts, _age(pod), spec.get("nodeName") or "<none>"]


def table(resource: Resource, items: list[Obj], resource_version: str) -> Obj:
    """A meta.k8s.io/v1 Table with the columns kubectl shows for pods; other kinds get name and age."""
    columns: list[Obj] = [{"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0}]
    if resource.kind == "Pod":
        columns += [{"name": n, "type": t, "format": "", "description": "", "priority": p}
                    for n, t, p in (("Ready", "string", 0), ("Status", "string", 0), ("Restarts", "integer", 0),
                                    ("Age", "string", 0), ("Node", "string", 1))]
    else:
        columns.append({"name": "Age", "type": "string", "format": "", "description": "", "priority": 0})
    rows = []
    for obj in items:
        name = (obj.get("metadata") or {}).get("name", "")
        cells = [name, *_pod_cells(obj)] if resource.kind == "Pod" else [name, _age(obj)]
        rows.append({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                                "metadata": obj.get("metadata") or {}}})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": columns, "rows": rows}
