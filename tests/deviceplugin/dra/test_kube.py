from __future__ import annotations

from typing import Any

import pytest

from deviceplugin.apiserver import Conflict
from deviceplugin.dra.claims import ClaimError
from deviceplugin.dra.kube import KubeDra
from deviceplugin.dra.slice import SliceError, resource_slice
from tests.harness.dra.claims import GPUS, NODE, claim


class FakeResourceApi:
    """KubeApiServer.resource_v1 over a dict of objects by name; `conflicts` writes fail with 409 first."""

    def __init__(self, *objects: dict[str, Any], conflicts: int = 0) -> None:
        self.objects = {o["metadata"]["name"]: o for o in objects}
        self.conflicts = conflicts
        self.calls: list[str] = []

    def resource_v1(self, what: str, operation: str, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        self.calls.append(operation)
        if operation.startswith("read_"):
            return self.objects.get(args[0])
        if self.conflicts:
            self.conflicts -= 1
            raise Conflict(f"could not {what}: it changed meanwhile (409 Conflict)")
        body = dict(args[-1])
        body["metadata"] = {**body["metadata"], "resourceVersion": str(len(self.calls))}
        self.objects[body["metadata"]["name"]] = body
        return body


def test_get_claim_reads_by_namespace_and_name() -> None:
    doc = claim()
    assert KubeDra(FakeResourceApi(doc)).get_claim("team", "gpu-claim") == doc


def test_missing_claim_is_a_claim_error() -> None:
    with pytest.raises(ClaimError, match="ResourceClaim team/gone does not exist"):
        KubeDra(FakeResourceApi()).get_claim("team", "gone")


def test_publish_creates_then_leaves_alone_then_updates() -> None:
    api = FakeResourceApi()
    kube = KubeDra(api)
    created = kube.publish_slice(resource_slice(NODE, GPUS, set(), "GiB"))
    assert created["spec"]["pool"]["generation"] == 1
    kube.publish_slice(resource_slice(NODE, GPUS, set(), "GiB"))
    updated = kube.publish_slice(resource_slice(NODE, GPUS, {0}, "GiB"))
    assert api.calls == ["read_resource_slice", "create_resource_slice", "read_resource_slice",
                         "read_resource_slice", "replace_resource_slice"]
    assert updated["spec"]["pool"]["generation"] == 2
    assert [d["name"] for d in updated["spec"]["devices"]] == ["gpu-1"]


def test_publish_reads_again_after_a_conflict_and_gives_up_in_the_end() -> None:
    api = FakeResourceApi(conflicts=1)
    assert KubeDra(api).publish_slice(resource_slice(NODE, GPUS, set(), "GiB"))["spec"]["nodeName"] == NODE
    with pytest.raises(SliceError, match="kept changing"):
        KubeDra(FakeResourceApi(conflicts=10)).publish_slice(resource_slice(NODE, GPUS, set(), "GiB"))
