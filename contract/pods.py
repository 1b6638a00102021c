"""What both sides read of a pod: its annotations, its name for messages and its GPU-share containers."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from contract.demand import container_units
from contract.errors import ProtocolError


def read_annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in annotations.items()}


def pod_ref(pod: Mapping[str, Any], namespace: str | None = None) -> str:
    """namespace/name for messages; Deployment pods at admission have only generateName, and at admission the
    namespace is the request's (`namespace`), which the object may not carry yet."""
    meta = pod.get("metadata") or {}
    name = meta.get("name") or (str(meta.get("generateName") or "") + "<generated>")
    return f"{namespace or meta.get('namespace') or '<namespace>'}/{name}"


def gpu_containers(pod: Mapping[str, Any], resource: str) -> Sequence[Mapping[str, Any]]:
    """App and init containers whose limits name the GPU-share resource with a positive count."""
    spec = pod.get("spec") or {}
    out = []
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            try:
                units = container_units(c, resource, "container")
            except ProtocolError:
                units = 1  # malformed but present: still a GPU-share container for env checks
            if units:
                out.append(c)
    return out
