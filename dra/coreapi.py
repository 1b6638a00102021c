"""The API server's core/v1 API, as the DRA driver calls it: its Node read (the slices' owner) and Events created."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from node.apiclient import KubeClient


class CoreV1:
    """One typed method per request (each needs its rule in the driver's ClusterRole), over the kubernetes client's
    CoreV1Api: the API's JSON, bounded like every request of node.apiclient.KubeClient; None where the object does
    not exist."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self._api = client.api("CoreV1Api", "install the kubernetes client in the driver's image")

    def read_node(self, name: str) -> dict[str, Any] | None:
        return self.client.read(f"read Node {name}", self._api.read_node, name)

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        self.client.read(f"create an Event in namespace {namespace}", self._api.create_namespaced_event, namespace,
                         body)
