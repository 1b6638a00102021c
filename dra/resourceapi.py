"""The API server's resource.k8s.io/v1 API, as the DRA driver calls it: claims read, the node's slices written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from node.apiclient import KubeClient


class ResourceV1:
    """One typed method per request the driver makes (each needs its rule in the driver's ClusterRole), over the
    kubernetes client's ResourceV1Api (from version 34): the API's JSON, bounded like every request of
    node.apiclient.KubeClient; None where the object does not exist."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self._api = client.api("ResourceV1Api", "install kubernetes>=34 in the driver's image")

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.client.read(
            f"read ResourceClaim {namespace}/{name}", self._api.read_namespaced_resource_claim, name, namespace
        )

    def list_slices(self, node: str, driver: str) -> dict[str, Any] | None:
        """The slices of `node` published by `driver`."""
        return self.client.read(f"list the ResourceSlices of node {node}", self._api.list_resource_slice,
                                field_selector=f"spec.nodeName={node},spec.driver={driver}")

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        metadata = body["metadata"]
        name = str(metadata.get("name") or f"{metadata.get('generateName')}<generated>")
        return self.client.read(f"create ResourceSlice {name}", self._api.create_resource_slice, body)

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        return self.client.read(f"update ResourceSlice {name}", self._api.replace_resource_slice, name, body)

    def delete_slice(self, name: str) -> None:
        self.client.read(f"delete ResourceSlice {name}", self._api.delete_resource_slice, name)
