"""Table tests for finding the owner of a device-ID set: slots, exact matches, checkpoint holdings (pure parts of
deviceplugin/owners.py and deviceplugin/kubelet.py)."""

from __future__ import annotations

import json

import pytest

from deviceplugin.devices import slot_of
from deviceplugin.errors import Refusal
from deviceplugin.kubelet import Holding, holdings_from_checkpoint
from deviceplugin.owners import Owner, find_owner, other_holders


@pytest.mark.parametrize(
    ("ids", "same_as"),
    [
        (["b", "a", "c"], ["a", "b", "c"]),
        (["c", "b", "a"], ["a", "c", "b"]),
    ],
)
def test_slot_does_not_depend_on_order(ids: list[str], same_as: list[str]) -> None:
    assert slot_of(ids) == slot_of(same_as)
    assert len(slot_of(ids)) == 16


def test_slots_differ_for_different_sets() -> None:
    assert slot_of(["a", "b"]) != slot_of(["a", "c"])
    assert slot_of(["ab"]) != slot_of(["a", "b"])


HOLDINGS = [
    Holding("team", "p1", "main", ("d1", "d2")),
    Holding("team", "p2", "init", ("d3", "d4")),
    Holding("team", "p2", "app", ("d3", "d4")),  # the init container's IDs reused by the app container
    Holding("team", "p3", "main", ("d5",)),
    Holding("other", "p4", "main", ("d6",)),
    Holding("other", "p5", "main", ("d6",)),  # never happens in a kubelet: must be refused
]


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        (["d2", "d1"], ("team", "p1", ("main",))),
        (["d4", "d3"], ("team", "p2", ("init", "app"))),
        (["d5"], ("team", "p3", ("main",))),
        (["d1"], "no pod on this node holds exactly"),
        (["d1", "d2", "d5"], "no pod on this node holds exactly"),
        (["d6"], "held by several pods"),
    ],
)
def test_find_owner(ids: list[str], expected: tuple[str, str, tuple[str, ...]] | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(Refusal, match=expected):
            find_owner(HOLDINGS, ids)
    else:
        owner = find_owner(HOLDINGS, ids)
        assert (owner.namespace, owner.name, owner.containers) == expected


@pytest.mark.parametrize(
    ("device_ids", "expected"),
    [
        ({"0": ["a", "b"], "1": ["c"]}, ("a", "b", "c")),
        (["a", "b"], ("a", "b")),
        (None, None),
    ],
)
def test_checkpoint_entries(device_ids: object, expected: tuple[str, ...] | None) -> None:
    doc = {
        "Data": {
            "PodDeviceEntries": [
                {"PodUID": "u1", "ContainerName": "main", "ResourceName": "aliyun.com/gpu-mem",
                 "DeviceIDs": device_ids, "AllocResp": "e30="},
                {"PodUID": "u2", "ContainerName": "x", "ResourceName": "nvidia.com/gpu", "DeviceIDs": ["z"]},
            ],
            "RegisteredDevices": {"aliyun.com/gpu-mem": ["a", "b", "c"]},
        },
        "Checksum": 1234,
    }
    holdings = holdings_from_checkpoint(json.dumps(doc), "aliyun.com/gpu-mem")
    if expected is None:
        assert holdings == []
    else:
        assert holdings == [Holding("", "", "main", expected, "u1")]


@pytest.mark.parametrize(
    ("owner", "ids", "expected"),
    [
        (Owner("team", "p2", "u2", ("init",)), ["d3", "d4", "d9"], []),  # its own app container reuses them
        (Owner("team", "p2", "u2", ("init",)), ["d1", "d9"], ["team/p1"]),  # the checkpoint entry is stale
        (Owner("team", "p9", "u9", ("init",)), ["d9"], []),
    ],
)
def test_other_holders(owner: Owner, ids: list[str], expected: list[str]) -> None:
    assert other_holders(HOLDINGS, ids, owner) == expected
    by_uid = [Holding("", "", "main", ("d1",), "u1"), Holding("", "", "app", ("d3",), "u2")]
    assert other_holders(by_uid, ["d3"], Owner("team", "p2", "u2", ("init",))) == []
    assert other_holders(by_uid, ["d1"], Owner("team", "p2", "u2", ("init",))) == ["the pod with UID u1"]


@pytest.mark.parametrize("text", ["", "{", "[]", '{"Data": 3}', '{"Data": {"PodDeviceEntries": 7}}',
                                  '{"Data": {"PodDeviceEntries": "x"}}', "[" * 100_000 + "]" * 100_000])
def test_checkpoint_garbage_is_an_error_not_a_guess(text: str) -> None:
    with pytest.raises(ValueError, match="checkpoint"):
        holdings_from_checkpoint(text, "aliyun.com/gpu-mem")
