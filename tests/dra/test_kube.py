from __future__ import annotations

from typing import Any

import pytest

from deviceplugin.dra.claims import ClaimError
from deviceplugin.dra.kube import KubeDra
from deviceplugin.dra.slice import pool_slices
from tests.harness.dra.claims import GPUS, NODE, claim


class FakeResourceApi:
    """KubeApiServer.resource_v1 over a dict of objects by name, recording each call with its arguments."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {o["metadata"]["name"]: o for o in objects}
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.whats: list[str] = []

    def resource_v1(self, what: str, operation: str, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        self.calls.append((operation, args[:1] if operation.startswith(("read_", "delete_")) else (), kwargs))
        if operation.startswith("read_"):
            return self.objects.get(args[0])
        if operation.startswith("list_"):
            return {"items": list(self.objects.values())}
        if operation.startswith("delete_"):
            self.objects.pop(args[0], None)
            return None
        body = dict(args[-1])
        metadata = body["metadata"]
        name = metadata.get("name") or f"{metadata['generateName']}{len(self.objects):05d}"
        body["metadata"] = {**metadata, "name": name}
        self.objects[name] = body
        self.whats.append(what)
        return body


def test_get_claim_reads_by_namespace_and_name() -> None:
    doc = claim()
    assert KubeDra(FakeResourceApi(doc)).get_claim("team", "gpu-claim") == doc


def test_missing_claim_is_a_claim_error() -> None:
    with pytest.raises(ClaimError, match="ResourceClaim team/gone does not exist"):
        KubeDra(FakeResourceApi()).get_claim("team", "gone")


def test_slices_are_created_by_generate_name_listed_by_node_and_driver_replaced_and_deleted() -> None:
    api = FakeResourceApi()
    kube = KubeDra(api)
    first, second = pool_slices(NODE, GPUS, set(), "GiB")
    created = kube.write_slice(first)
    assert created is not None
    assert created["metadata"]["name"] == f"{NODE}-gpushare.io-gpu-0-00000", "the slice as the API server answered"
    kube.write_slice({**second, "metadata": {"name": "stored-gpu-1", "resourceVersion": "3"}})
    assert [s["metadata"]["name"] for s in kube.list_slices(NODE)] == [created["metadata"]["name"], "stored-gpu-1"]
    kube.delete_slice(created["metadata"]["name"])
    assert api.calls == [
        ("create_resource_slice", (), {}),
        ("replace_resource_slice", (), {}),
        ("list_resource_slice", (), {"field_selector": f"spec.nodeName={NODE},spec.driver=gpushare.io"}),
        ("delete_resource_slice", (created["metadata"]["name"],), {}),
    ]
    assert api.whats == [f"create ResourceSlice {NODE}-gpushare.io-gpu-0-<generated>",
                         "update ResourceSlice stored-gpu-1"]
