"""The driver's resource.k8s.io/v1 requests: which kubernetes client operation each typed method makes, and what its
failure would name."""

from __future__ import annotations

from typing import Any

from dra.resourceapi import ResourceV1
from tests.harness.dra.fakes import RecordingClient


def test_each_method_makes_one_request_named_for_its_object() -> None:
    client = RecordingClient({"items": []})
    api = ResourceV1(client)
    body: dict[str, Any] = {"metadata": {"generateName": "node-a-gpushare.io-gpu-0-"}}
    assert api.read_claim("team", "claim") == {"items": []}
    api.list_slices("node-a", "gpushare.io")
    api.create_slice(body)
    api.create_slice({"metadata": {"name": "fixed"}})
    api.replace_slice("stored", body)
    api.delete_slice("stored")
    assert client.requests == [
        ("read ResourceClaim team/claim", "read_namespaced_resource_claim", ("claim", "team"), {}),
        ("list the ResourceSlices of node node-a", "list_resource_slice", (),
         {"field_selector": "spec.nodeName=node-a,spec.driver=gpushare.io"}),
        ("create ResourceSlice node-a-gpushare.io-gpu-0-<generated>", "create_resource_slice", (body,), {}),
        ("create ResourceSlice fixed", "create_resource_slice", ({"metadata": {"name": "fixed"}},), {}),
        ("update ResourceSlice stored", "replace_resource_slice", ("stored", body), {}),
        ("delete ResourceSlice stored", "delete_resource_slice", ("stored",), {}),
    ]
