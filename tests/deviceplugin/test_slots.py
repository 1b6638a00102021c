"""The same device IDs (the same slot) coming back for pod after pod, as the real kubelet hands them out."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from deviceplugin.devices import slot_of
from tests.harness.plugin.rig import Rig, make_rig
from tests.harness.pods import assigned, unit_pod

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cdi_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """cdi delivery with the extender's placement (the GPU comes from the annotations)."""
    yield from make_rig(tmp_path_factory.mktemp("c"), GPUSHARE_DELIVERY="cdi")


def _gone(rig: Rig, name: str) -> None:
    rig.kubelet.forget("team", name)
    rig.api.delete("team", name)


def test_preferred_allocation_hands_out_the_least_recently_used_ids(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    seen: list[set[str]] = []
    for name in ("first", "second", "third", "fourth"):
        rig.pod(name, {"main": 4})
        (admitted,) = rig.kubelet.admit("team", name, [("main", 4)])
        seen.append(set(admitted.device_ids))
        _gone(rig, name)  # the IDs are free again at once, yet the next pod gets others
    assert rig.kubelet.counts.preferred_calls == 4
    assert len(set.union(*seen)) == 16  # every one of the 16 units handed out once before any comes back
    rig.pod("fifth", {"main": 4})
    (again,) = rig.kubelet.admit("team", "fifth", [("main", 4)])
    assert set(again.device_ids) == seen[0]


def test_a_second_pod_with_the_same_ids_is_validated_again(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("first", {"main": 2})
    (first,) = rig.kubelet.admit("team", "first", [("main", 2)])
    rig.kubelet.start_container("team", "first", "main")
    _gone(rig, "first")
    rig.api.add(assigned(unit_pod("raw", {"main": 2}), 0, 8))  # created past the webhook: no intent
    with pytest.raises(grpc.RpcError) as caught:
        rig.kubelet.admit("team", "raw", [("main", 2)], pick=first.device_ids)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "team/raw has no gpushare.io/intent" in (caught.value.details() or "")


def _edits(rig: Rig, slot: str) -> dict[str, Any]:
    with open(rig.plugin.service.cdi.path_for(slot)) as handle:
        edits: dict[str, Any] = json.load(handle)["devices"][0]["containerEdits"]
    return edits


def test_a_reused_slot_gets_the_new_owners_spec(cdi_rig: Rig) -> None:
    rig = cdi_rig
    rig.kubelet.wait_registrations(1)
    gpu0, gpu1 = rig.inventory.gpus
    rig.pod("first", {"main": 2}, index=0)
    (first,) = rig.kubelet.admit("team", "first", [("main", 2)])
    slot = slot_of(first.device_ids)
    rig.kubelet.start_container("team", "first", "main")
    assert f"NVIDIA_VISIBLE_DEVICES={gpu0.uuid}" in _edits(rig, slot)["env"]
    _gone(rig, "first")
    rig.pod("second", {"main": 2}, index=1)
    (second,) = rig.kubelet.admit("team", "second", [("main", 2)], pick=first.device_ids)
    assert slot_of(second.device_ids) == slot
    # Between Allocate and PreStart no spec of the old owner is left for the runtime to find.
    assert not os.path.exists(rig.plugin.service.cdi.path_for(slot))
    rig.kubelet.start_container("team", "second", "main")
    assert f"NVIDIA_VISIBLE_DEVICES={gpu1.uuid}" in _edits(rig, slot)["env"]
    assert _edits(rig, slot)["mounts"][0]["hostPath"].endswith(f"{gpu1.uuid}.txt")


def test_garbage_collection_keeps_what_the_kubelet_still_assigns(cdi_rig: Rig) -> None:
    rig = cdi_rig
    rig.kubelet.wait_registrations(1)
    rig.pod("p", {"app": 0}, init={"setup": 3})
    (setup,) = rig.kubelet.admit("team", "p", [], init=[("setup", 3)])
    rig.kubelet.start_container("team", "p", "setup")
    slot = slot_of(setup.device_ids)
    rig.plugin.service.clock = lambda: 1e12  # far past the grace period
    assert rig.plugin.service.collect_garbage() == []  # only the checkpoint lists the init container
    assert os.path.exists(rig.plugin.service.cdi.path_for(slot))
    rig.kubelet.forget("team", "p")
    assert rig.plugin.service.collect_garbage() == [slot]


def test_no_garbage_collection_without_the_checkpoint(cdi_rig: Rig) -> None:
    rig = cdi_rig
    rig.kubelet.wait_registrations(1)
    rig.pod("p", {"main": 2})
    rig.kubelet.admit("team", "p", [("main", 2)])
    rig.kubelet.start_container("team", "p", "main")
    rig.kubelet.forget("team", "p")
    os.unlink(rig.kubelet.checkpoint_path)
    rig.plugin.service.clock = lambda: 1e12
    assert rig.plugin.service.collect_garbage() == []  # it cannot tell what init containers hold: keep all
