"""The API server, seen by the DRA driver: claims read fresh, the node's ResourceSlices listed, written, deleted, the
Node's UID read (the slices' owner) and Events recorded.

The requests themselves are dra/resourceapi.py's and dra/coreapi.py's; tests fake ResourceApi and CoreApi."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from contract.keys import DRA_DRIVER
from dra.claims import ClaimError


class ResourceApi(Protocol):
    """dra.resourceapi.ResourceV1's requests (tests fake exactly these)."""

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def list_slices(self, node: str, driver: str) -> dict[str, Any] | None: ...

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any] | None: ...

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None: ...

    def delete_slice(self, name: str) -> None: ...


class CoreApi(Protocol):
    """dra.coreapi.CoreV1's requests (tests fake exactly these)."""

    def read_node(self, name: str) -> dict[str, Any] | None: ...

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None: ...


class KubeDra:
    """The ClaimSource of the driver, and the node's slices, over the driver's resource and core APIs."""

    def __init__(self, api: ResourceApi, core: CoreApi) -> None:
        self.api = api
        self.core = core

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        claim = self.api.read_claim(namespace, name)
        if claim is None:
            raise ClaimError(
                f"ResourceClaim {namespace}/{name} does not exist (404 Not Found): it was deleted after the kubelet "
                "read it; the pod's claim is created again from its template, and the kubelet retries"
            )
        return claim

    def list_slices(self, node: str) -> list[dict[str, Any]]:
        """This driver's ResourceSlices of `node`, as the API server holds them."""
        items = (self.api.list_slices(node, DRA_DRIVER) or {}).get("items") or []
        return [item for item in items if isinstance(item, dict)]

    def write_slice(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Create `body` (from dra.slice.pool_plan) under a name the API server generates, or replace
        the slice whose name and resourceVersion it carries (Conflict, an ApiServerError, when another writer came
        first: the keeper's next step reads again). Returns the slice as the API server stored it (None when it was
        deleted meanwhile): what its feature gates kept of the body."""
        metadata = body["metadata"]
        if metadata.get("resourceVersion"):
            return self.api.replace_slice(str(metadata["name"]), body)
        return self.api.create_slice(body)

    def delete_slice(self, name: str) -> None:
        """Delete a slice of ours no GPU stands for any more (gone already: nothing to do)."""
        self.api.delete_slice(name)

    def node_uid(self, node: str) -> str | None:
        """The metadata.uid of Node `node` (None while it does not exist: deleted, and not yet registered again by
        its kubelet)."""
        uid = ((self.core.read_node(node) or {}).get("metadata") or {}).get("uid")
        return str(uid) if uid else None

    def record_event(self, body: Mapping[str, Any]) -> None:
        """Create the Event `body` (from dra.events) in its namespace."""
        self.core.create_event(str(body["metadata"]["namespace"]), body)
