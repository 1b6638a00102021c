"""A node switched from the reference device plugin while its pods run, through the test kubelet: the kubelet's
checkpoint keeps the reference plugin's answers, a crashed container of such a pod starts again only on the GPU its
pod records, and what those pods use blocks the room of new pods, in the watch-fed index, the fresh listing and
node-local placement."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from contract import ASSIGNED, IDX
from deviceplugin.devices import device_ids
from deviceplugin.nodeindex import NodeIndex
from tests.harness.kubelet.devices import reference_answer
from tests.harness.plugin.rig import Rig, make_rig
from tests.harness.pods import assigned, unit_pod

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cdi_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    yield from make_rig(tmp_path_factory.mktemp("m"), GPUSHARE_DELIVERY="cdi", GPUSHARE_PLACEMENT="node")


def started_before(rig: Rig, name: str, units: int, index: int | None, visible: str | None,
                   gpu: int = 1) -> list[str]:
    """A pod created before the webhook (no intent), placed by the extender on GPU `index`, whose container the
    reference plugin answered with NVIDIA_VISIBLE_DEVICES=`visible` (None: no answer of its own) before the switch;
    the kubelet keeps that answer in its checkpoint. Returns the container's device IDs (of GPU `gpu`'s units)."""
    pod = unit_pod(name, {"main": units})
    rig.api.add(assigned(pod, index, 8) if index is not None else pod, phase="Running")
    ids = device_ids(rig.inventory.gpus[gpu])[:units]
    rig.kubelet.hold("team", name, "main", ids,
                     response=reference_answer(visible, units) if visible is not None else None)
    return ids


def refusal(rig: Rig, pod: str) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        rig.kubelet.start_container("team", pod, "main")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return caught.value.details() or ""


def main_is(state: str) -> dict[str, Any]:
    return {"phase": "Running", "containerStatuses": [{"name": "main", "state": {state: {}}}]}


def test_a_crashed_container_starts_again_on_its_recorded_gpu(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    started_before(rig, "old", 6, 1, "1")
    before = rig.api.pod("team", "old")
    rig.kubelet.start_container("team", "old", "main")  # the kubelet restarts it after a crash
    assert rig.api.pod("team", "old") == before and rig.api.events == []  # nothing delivered, nothing recorded
    assert rig.plugin.service.pins.get(rig.api.pod("team", "old")["metadata"]["uid"]) is not None


def test_it_holds_its_room_until_it_stops(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    started_before(rig, "old", 6, 1, "1")
    rig.pod("new", {"main": 4}, index=1)  # the extender freed nothing there: it was placed wrongly
    rig.kubelet.admit("team", "new", [("main", 4)])
    message = refusal(rig, "new")
    assert "needs 4 GiB on GPU 1, but 6 of its 8 GiB are already promised to team/old (6)" in message
    assert [e[1:3] for e in rig.api.events if e[0] == "team/new"] == [("Warning", "GpuShareNoRoom")]
    rig.api.update("team", "old", deleting=True, status=main_is("running"))
    assert "by the pod team/old (6), which is being deleted while GPU containers of it still run" in \
        refusal(rig, "new")
    rig.api.update("team", "old", status=main_is("terminated"))
    rig.kubelet.start_container("team", "new", "main")  # the kubelet's retry
    assert rig.api.pod("team", "new")["metadata"]["annotations"][ASSIGNED] == "true"


def test_the_fresh_listing_counts_it_too(rig: Rig) -> None:
    """While the watch is broken the room is judged on a fresh listing of the node's pods."""
    rig.kubelet.wait_registrations(1)
    started_before(rig, "old", 6, 1, "1")
    rig.pod("new", {"main": 4}, index=1)
    rig.kubelet.admit("team", "new", [("main", 4)])
    index: NodeIndex = rig.plugin.service.index
    index.stale()
    assert "already promised to team/old (6)" in refusal(rig, "new")


@pytest.mark.parametrize(
    ("visible", "index", "reason", "fragment"),
    [
        ("no-gpu-has-6GiB-to-run", 1, "GpuShareLegacyWrongGpu",
         "the previous device plugin gave it NVIDIA_VISIBLE_DEVICES='no-gpu-has-6GiB-to-run', which names no single "
         "GPU of node node-a"),
        ("0", 1, "GpuShareLegacyWrongGpu", "NVIDIA_VISIBLE_DEVICES='0', GPU 0, but its ALIYUN_COM_GPU_MEM_IDX "
                                           "annotation records GPU 1"),
        ("GPU-8d2c5a8e-0000-4000-8000-000000000000", 1, "GpuShareLegacyWrongGpu", "which names no single GPU"),
        (None, 1, "GpuShareNoIntent", "has no gpushare.io/intent annotation: it was created before the gpushare "
                                      "webhook was installed"),
    ],
)
def test_it_is_refused_on_any_other_gpu(
    rig: Rig, visible: str | None, index: int, reason: str, fragment: str
) -> None:
    rig.kubelet.wait_registrations(1)
    started_before(rig, "old", 6, index, visible)
    message = refusal(rig, "old")
    assert message.startswith("pod team/old (container 'main') ") and fragment in message, message
    [(ref, kind, got, posted)] = rig.api.events
    assert (ref, kind, got, posted) == ("team/old", "Warning", reason, message)
    assert rig.api.patches == []


def test_node_placement_avoids_the_gpu_it_uses(cdi_rig: Rig) -> None:
    rig = cdi_rig
    rig.kubelet.wait_registrations(1)
    started_before(rig, "old", 6, 0, "0", gpu=0)
    rig.pod("new", {"main": 4}, index=None)  # best fit would take GPU 0 on an empty node
    rig.kubelet.admit("team", "new", [("main", 4)])
    rig.kubelet.start_container("team", "new", "main")
    assert rig.api.pod("team", "new")["metadata"]["annotations"][IDX] == "1"
    rig.kubelet.start_container("team", "old", "main")  # and the old container still starts again
