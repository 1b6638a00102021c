"""The env a GPU-share container gets in `env` delivery: what the webhook injects and the device plugin checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract.keys import DEV, ENV_CONTAINER, ENV_DEV, ENV_IDX, ENV_POD, ENV_VISIBLE, IDX


def annotation_ref(key: str) -> dict[str, Any]:
    # apiVersion "v1" is what the API server defaults a fieldRef to; writing it keeps the stored pod equal to
    # expected_env, so the validator and the device plugin can compare definitions exactly.
    return {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{key}']"}}}


def expected_env(container_units: int, intent_total: int) -> list[dict[str, Any]]:
    """The env entries a GPU-share container gets in `env` delivery mode, in injection order.

    NVIDIA_VISIBLE_DEVICES and the index/device variables come from the pod's own annotations through the
    downward API, which kubelet resolves at each container creation (after the extender wrote them).
    """
    return [
        {"name": ENV_VISIBLE, **annotation_ref(IDX)},
        {"name": ENV_IDX, **annotation_ref(IDX)},
        {"name": ENV_DEV, **annotation_ref(DEV)},
        {"name": ENV_CONTAINER, "value": str(container_units)},
        {"name": ENV_POD, "value": str(intent_total)},
    ]


def normal_env(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An env definition as the API server stores it (an empty value dropped, a fieldRef's apiVersion defaulted to
    v1), so that the webhook and the device plugin compare definitions the same way."""
    out = {k: v for k, v in entry.items() if not (k == "value" and v in ("", None))}
    value_from = out.get("valueFrom")
    if isinstance(value_from, Mapping) and isinstance(value_from.get("fieldRef"), Mapping):
        out["valueFrom"] = {**value_from, "fieldRef": {"apiVersion": "v1", **value_from["fieldRef"]}}
    return out
