"""Pods being deleted, through the test kubelet: the scheduler extender frees a deleted pod's memory at once, so a
pod deleted while its image pulls holds nothing and its container is never started, and one deleted while it runs
holds its room until it stops, with a refusal that says the kubelet's retry will succeed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from contract import ASSIGNED, IDX
from tests.harness.plugin.rig import Rig, make_rig

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cdi_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    yield from make_rig(tmp_path_factory.mktemp("c"), GPUSHARE_DELIVERY="cdi", GPUSHARE_PLACEMENT="node")


def main_is(state: str) -> dict[str, Any]:
    """The status the kubelet writes with container `main` in `state`."""
    return {"phase": "Running", "containerStatuses": [{"name": "main", "state": {state: {}}}]}


def refusal(rig: Rig, pod: str) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        rig.kubelet.start_container("team", pod, "main")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return caught.value.details() or ""


def test_a_pod_deleted_while_its_image_pulls_holds_nothing_and_never_starts(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("old", {"main": 6})
    rig.kubelet.admit("team", "old", [("main", 6)])
    rig.api.update("team", "old", deleting=True)  # the extender frees its 6 GiB on GPU 0 at once ...
    rig.pod("new", {"main": 4})  # ... and places the replacement there
    rig.kubelet.admit("team", "new", [("main", 4)])
    rig.kubelet.start_container("team", "new", "main")
    assert rig.api.pod("team", "new")["metadata"]["annotations"][ASSIGNED] == "true"
    # The kubelet's sync that was pulling old's image goes on to start its container: refused.
    assert "pod team/old (container 'main') is being deleted, so the container is not started" in refusal(rig, "old")
    assert [e[1:3] for e in rig.api.events if e[0] == "team/old"] == [("Normal", "GpuSharePodDeleting")]
    assert not [e for e in rig.api.events if e[2] == "GpuShareNoRoom"]


def test_a_pod_deleted_while_it_runs_holds_its_room_until_it_stops(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("old", {"main": 6})
    rig.kubelet.admit("team", "old", [("main", 6)])
    rig.kubelet.start_container("team", "old", "main")
    rig.api.update("team", "old", deleting=True, status=main_is("running"))
    rig.pod("new", {"main": 4})
    rig.kubelet.admit("team", "new", [("main", 4)])
    message = refusal(rig, "new")
    assert "but 6 of its 8 GiB are still held, 6 GiB of them by the pod team/old (6), which is being deleted" in message
    assert message.endswith("the kubelet retries the start by itself, and it succeeds once that pod has stopped "
                            "(within its termination grace period): nothing to do")
    rig.api.update("team", "old", status=main_is("terminated"))
    rig.kubelet.start_container("team", "new", "main")  # the kubelet's retry
    assert rig.api.pod("team", "new")["metadata"]["annotations"][ASSIGNED] == "true"
    assert [e[1:3] for e in rig.api.events if e[0] == "team/new"] == [("Warning", "GpuShareNoRoom"),
                                                                       ("Normal", "GpuShareAllocated")]


def test_node_placement_waits_for_a_pod_being_deleted(cdi_rig: Rig) -> None:
    rig = cdi_rig
    rig.kubelet.wait_registrations(1)
    for name, units in (("old", 6), ("other", 3)):  # best fit: old on GPU 0, other on GPU 1
        rig.pod(name, {"main": units}, index=None)
        rig.kubelet.admit("team", name, [("main", units)])
        rig.kubelet.start_container("team", name, "main")
    rig.api.update("team", "old", deleting=True, status=main_is("running"))
    rig.pod("new", {"main": 6}, index=None)
    rig.kubelet.admit("team", "new", [("main", 6)])
    message = refusal(rig, "new")
    assert "no GPU of node node-a has that much room now (free GiB: GPU 0: 2, GPU 1: 5); GPU 0 will once " \
           "team/old (6), being deleted, has stopped" in message
    assert message.endswith("so there is nothing to do")
    rig.api.update("team", "old", status=main_is("terminated"))
    rig.kubelet.start_container("team", "new", "main")
    assert rig.api.pod("team", "new")["metadata"]["annotations"][IDX] == "0"
