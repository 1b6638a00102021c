"""dra.resourceapi.ResourceV1 in memory (objects by name, each call recorded), and the core API the driver uses
(Nodes by name, Events kept)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class FakeResourceApi:
    """dra.resourceapi.ResourceV1 over a dict of objects by name, recording each call with its arguments."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {o["metadata"]["name"]: o for o in objects}
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("read_claim", (namespace, name)))
        return self.objects.get(name)

    def list_slices(self, node: str, driver: str) -> dict[str, Any] | None:
        self.calls.append(("list_slices", (node, driver)))
        return {"items": list(self.objects.values())}

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("create_slice", ()))
        metadata = body["metadata"]
        return self._store({**body, "metadata": {**metadata, "name": f"{metadata['generateName']}"
                                                 f"{len(self.objects):05d}"}})

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("replace_slice", (name,)))
        return self._store(dict(body))

    def delete_slice(self, name: str) -> None:
        self.calls.append(("delete_slice", (name,)))
        self.objects.pop(name, None)

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        self.objects[body["metadata"]["name"]] = body
        return body


class FakeCoreApi:
    """dra.coreapi.CoreV1 over Nodes by name, keeping the Events created."""

    def __init__(self, **nodes: dict[str, Any]) -> None:
        self.nodes = nodes
        self.events: list[tuple[str, Mapping[str, Any]]] = []

    def read_node(self, name: str) -> dict[str, Any] | None:
        return self.nodes.get(name)

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        self.events.append((namespace, body))
