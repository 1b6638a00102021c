from __future__ import annotations

import pytest

from dra.claims import ClaimError
from dra.kube import KubeDra
from dra.slice import pool_slices
from tests.harness.dra.claims import GPUS, NODE, claim
from tests.harness.dra.resourceapi import FakeCoreApi, FakeResourceApi


def test_the_node_uid_is_read_and_none_while_the_node_does_not_exist() -> None:
    kube = KubeDra(FakeResourceApi(), FakeCoreApi(**{NODE: {"metadata": {"name": NODE, "uid": "u-1"}}}))
    assert kube.node_uid(NODE) == "u-1"
    assert kube.node_uid("gone") is None


def test_an_event_is_created_in_its_own_namespace() -> None:
    core = FakeCoreApi()
    body = {"metadata": {"generateName": f"{NODE}.", "namespace": "default"}, "reason": "R"}
    KubeDra(FakeResourceApi(), core).record_event(body)
    assert core.events == [("default", body)]


def test_get_claim_reads_by_namespace_and_name() -> None:
    doc = claim()
    assert KubeDra(FakeResourceApi(doc), FakeCoreApi()).get_claim("team", "gpu-claim") == doc


def test_missing_claim_is_a_claim_error() -> None:
    with pytest.raises(ClaimError, match="ResourceClaim team/gone does not exist"):
        KubeDra(FakeResourceApi(), FakeCoreApi()).get_claim("team", "gone")


def test_slices_are_created_by_generate_name_listed_by_node_and_driver_replaced_and_deleted() -> None:
    api = FakeResourceApi()
    kube = KubeDra(api, FakeCoreApi())
    first, second = pool_slices(NODE, GPUS, set(), "GiB")
    created = kube.write_slice(first)
    assert created is not None
    assert created["metadata"]["name"] == f"{NODE}-gpushare.io-gpu-0-00000", "the slice as the API server answered"
    kube.write_slice({**second, "metadata": {"name": "stored-gpu-1", "resourceVersion": "3"}})
    assert [s["metadata"]["name"] for s in kube.list_slices(NODE)] == [created["metadata"]["name"], "stored-gpu-1"]
    kube.delete_slice(created["metadata"]["name"])
    assert api.calls == [
        ("create_slice", ()),
        ("replace_slice", ("stored-gpu-1",)),
        ("list_slices", (NODE, "gpushare.io")),
        ("delete_slice", (created["metadata"]["name"],)),
    ]
