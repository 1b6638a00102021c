"""The API server, seen by the DRA driver: claims read fresh, and the node's ResourceSlice created or updated."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from deviceplugin.apiserver import Conflict
from deviceplugin.dra.claims import ClaimError
from deviceplugin.dra.slice import SliceError, slice_update

log = logging.getLogger(__name__)

# A slice update that meets a concurrent writer (409) reads the slice again; past this many tries it gives up.
_SLICE_TRIES = 3


class ResourceApi(Protocol):
    """deviceplugin.apiserver.KubeApiServer's one generic method the driver uses (tests fake exactly this)."""

    def resource_v1(self, what: str, operation: str, *args: Any, **kwargs: Any) -> dict[str, Any] | None: ...


class KubeDra:
    """The ClaimSource of the driver, and the publisher of the node's slice, over the plugin's API client."""

    def __init__(self, api: ResourceApi) -> None:
        self.api = api

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        claim = self.api.resource_v1(
            f"read ResourceClaim {namespace}/{name}", "read_namespaced_resource_claim", name, namespace
        )
        if claim is None:
            raise ClaimError(
                f"ResourceClaim {namespace}/{name} does not exist (404 Not Found): it was deleted after the kubelet "
                "read it; the pod's claim is created again from its template, and the kubelet retries"
            )
        return claim

    def publish_slice(self, wanted: Mapping[str, Any]) -> dict[str, Any]:
        """Make the API server hold `wanted` (from deviceplugin.dra.slice): created, updated with the next pool
        generation, or left alone when it already says the same; the slice as the API server holds it."""
        name = str(wanted["metadata"]["name"])
        for _ in range(_SLICE_TRIES):
            existing = self.api.resource_v1(f"read ResourceSlice {name}", "read_resource_slice", name)
            body = slice_update(existing, wanted)
            if body is None and existing is not None:
                return existing
            try:
                if existing is None:
                    written = self.api.resource_v1(f"create ResourceSlice {name}", "create_resource_slice", body)
                else:
                    written = self.api.resource_v1(
                        f"update ResourceSlice {name}", "replace_resource_slice", name, body
                    )
            except Conflict as exc:  # created or changed meanwhile (a driver restart racing the kubelet's wipe)
                log.info("ResourceSlice %s changed while being written (%s); reading it again", name, exc)
                continue
            if written is not None:
                log.info("published ResourceSlice %s (pool generation %s)", name,
                         (written.get("spec") or {}).get("pool", {}).get("generation"))
                return written
        raise SliceError(
            f"ResourceSlice {name} kept changing while this driver wrote it ({_SLICE_TRIES} tries); another writer "
            "updates it: run one gpushare DRA driver per node"
        )
