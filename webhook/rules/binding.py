"""(Binding, user) -> problems: the reserved annotations a pods/binding may carry onto the pod it binds (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract import ASSIGNED, COMPAT_KEYS, COMPAT_PREFIX, Contract, is_reserved_annotation

# kube-apiserver copies every annotation of a Binding onto the pod it binds, over the pod's own, and no pods UPDATE
# rule sees it (pkg/registry/core/pod/storage/storage.go, BindingREST.setPodNodeAndMetadata). The kube-scheduler and
# the gpushare scheduler extender bind with no annotations at all (the extender writes its placement with a PATCH
# first: gpushare-scheduler-extender pkg/cache/nodeinfo.go, Allocate).


def reserved_keys(annotations: Mapping[str, str], contract: Contract) -> list[str]:
    return [k for k in annotations if is_reserved_annotation(k, contract)]


def binding_problems(
    binding: Mapping[str, Any], username: str, extender_identities: tuple[str, ...], contract: Contract
) -> list[str]:
    """Sentences, without the pod's name, for each reserved annotation the Binding may not carry.

    Only a scheduler extender identity may carry any, and then only its placement keys with ASSIGNED "false": the
    webhook cannot see the pod here, so the values are checked again by the device plugin against the intent.
    """
    annotations = (binding.get("metadata") or {}).get("annotations") or {}
    problems: list[str] = []
    for key in reserved_keys(annotations, contract):
        if username not in extender_identities:
            problems.append(
                f"the Binding carries annotation {key}, which the API server would copy onto the pod, but only the "
                f"scheduler extender may place a pod's GPU and {username or 'an anonymous user'} is not it; bind "
                f"without annotations under {COMPAT_PREFIX} and {contract.prefix}"
            )
        elif key not in COMPAT_KEYS:
            problems.append(
                f"the Binding carries annotation {key}, which the API server would copy onto the pod; a scheduler "
                f"extender's Binding may carry only the placement keys ({', '.join(COMPAT_KEYS)}); remove {key}"
            )
        elif key == ASSIGNED and annotations[key] != "false":
            problems.append(
                f'the Binding sets annotation {ASSIGNED} to {annotations[key]!r}; at binding a pod is not allocated '
                f'yet, so a Binding may only set it to "false" (the device plugin sets "true")'
            )
    return problems
