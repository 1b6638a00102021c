"""The API server, seen by the DRA driver: claims read fresh, and the node's ResourceSlices listed, written, deleted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from contract.keys import DRA_DRIVER
from deviceplugin.dra.claims import ClaimError


class ResourceApi(Protocol):
    """deviceplugin.apiserver.KubeApiServer's one generic method the driver uses (tests fake exactly this)."""

    def resource_v1(self, what: str, operation: str, *args: Any, **kwargs: Any) -> dict[str, Any] | None: ...


class KubeDra:
    """The ClaimSource of the driver, and the node's slices, over the plugin's API client."""

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

    def list_slices(self, node: str) -> list[dict[str, Any]]:
        """This driver's ResourceSlices of `node`, as the API server holds them."""
        found = self.api.resource_v1(
            f"list the ResourceSlices of node {node}", "list_resource_slice",
            field_selector=f"spec.nodeName={node},spec.driver={DRA_DRIVER}",
        )
        items = (found or {}).get("items") or []
        return [item for item in items if isinstance(item, dict)]

    def write_slice(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create `body` (from deviceplugin.dra.slice.pool_plan) under a name the API server generates, or replace
        the slice whose name and resourceVersion it carries (Conflict, an ApiServerError, when another writer came
        first: the keeper's next step reads again). Returns the slice as the API server stored it (None when it was
        deleted meanwhile): what its feature gates kept of the body."""
        metadata = body["metadata"]
        if metadata.get("resourceVersion"):
            name = str(metadata["name"])
            return self.api.resource_v1(f"update ResourceSlice {name}", "replace_resource_slice", name, body)
        name = str(metadata.get("name") or f"{metadata.get('generateName')}<generated>")
        return self.api.resource_v1(f"create ResourceSlice {name}", "create_resource_slice", body)

    def delete_slice(self, name: str) -> None:
        """Delete a slice of ours no GPU stands for any more (gone already: nothing to do)."""
        self.api.resource_v1(f"delete ResourceSlice {name}", "delete_resource_slice", name)
