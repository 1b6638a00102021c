"""Init containers on a kubelet that lists like the real one: PodResources v1 names app and sidecar containers only,
so a regular init container is resolved exactly from the kubelet's checkpoint, never guessed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import grpc
import pytest

from contract import ASSIGNED, parse_allocation
from deviceplugin.devices import slot_of
from node.cdiedits import FAKE_GPU_MOUNT
from tests.harness.plugin.rig import Rig, make_rig

pytestmark = pytest.mark.timeout(60)

# (name, app containers, init containers, sidecars): every GPU-share container must start on the pod's GPU.
SHAPES = [
    ("init-larger", {"app": 2}, {"setup": 5}, ()),
    ("init-smaller", {"app": 5}, {"setup": 2}, ()),
    ("init-only", {"app": 0}, {"setup": 3}, ()),
    ("sidecar", {"app": 2}, {"proxy": 1, "setup": 3}, ("proxy",)),
    ("two-apps", {"a": 2, "b": 3}, {"setup": 5}, ()),
]


@pytest.fixture(params=["env", "cdi"])
def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    yield from make_rig(tmp_path_factory.mktemp("i"), GPUSHARE_DELIVERY=request.param)


@pytest.mark.parametrize(("name", "apps", "inits", "sidecars"), SHAPES, ids=[s[0] for s in SHAPES])
def test_every_gpu_container_starts_on_its_pods_gpu(
    rig: Rig, name: str, apps: dict[str, int], inits: dict[str, int], sidecars: tuple[str, ...]
) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod(name, apps, index=1, init=inits, sidecars=sidecars)
    gpu_containers = [(c, u) for c, u in apps.items() if u]
    admitted = rig.kubelet.admit("team", name, gpu_containers, init=list(inits.items()), sidecars=sidecars)
    listed = {c.name for p in rig.kubelet.listing().pod_resources for c in p.containers}
    for regular in set(inits) - set(sidecars):
        assert regular not in listed  # as the real List: the init container is in the checkpoint only
    for container in [*inits, *(c for c, _ in gpu_containers)]:
        rig.kubelet.start_container("team", name, container)
    annotations = rig.api.pod("team", name)["metadata"]["annotations"]
    assert annotations[ASSIGNED] == "true"
    assert parse_allocation(annotations["gpushare.io/allocation"]).gpu_index == 1
    assert {e[1] for e in rig.api.events} == {"Normal"}
    if rig.contract.delivery == "cdi":
        gpu = rig.inventory.gpus[1]
        for entry in admitted:
            with open(rig.plugin.service.cdi.path_for(slot_of(entry.device_ids))) as handle:
                edits = json.load(handle)["devices"][0]["containerEdits"]
            assert f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}" in edits["env"]
            (mount,) = edits["mounts"]
            assert mount["containerPath"] == FAKE_GPU_MOUNT and "ro" in mount["options"]
            with open(mount["hostPath"]) as handle:
                assert handle.read() == f"index=1\nuuid={gpu.uuid}\n"


def test_an_init_container_without_a_checkpoint_is_refused_not_guessed(rig: Rig) -> None:
    rig.kubelet.wait_registrations(1)
    rig.pod("p", {"app": 2}, init={"setup": 5})
    rig.kubelet.admit("team", "p", [("app", 2)], init=[("setup", 5)])
    os.unlink(rig.kubelet.checkpoint_path)
    with pytest.raises(grpc.RpcError) as caught:
        rig.kubelet.start_container("team", "p", "setup")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    text = caught.value.details() or ""
    assert "no container in the kubelet's pod resources holds exactly these devices" in text
    assert "GPUSHARE_KUBELET_CHECKPOINT" in text
    assert rig.api.pod("team", "p")["metadata"]["annotations"][ASSIGNED] == "false"


def test_a_stale_checkpoint_entry_is_refused(rig: Rig) -> None:
    """The checkpoint still gives the IDs to an old pod that PodResources gives to another: no guess, no start."""
    rig.kubelet.wait_registrations(1)
    rig.pod("old", {"app": 0}, init={"setup": 3})
    (old,) = rig.kubelet.admit("team", "old", [], init=[("setup", 3)])
    rig.kubelet.forget("team", "old")
    rig.pod("new", {"app": 2})
    rig.kubelet.admit("team", "new", [("app", 2)], pick=old.device_ids[:2])
    rig.kubelet.hold("team", "old", "setup", old.device_ids, "init")  # as if the checkpoint were not yet rewritten
    with pytest.raises(grpc.RpcError) as caught:
        rig.kubelet.start_container("team", "old", "setup")
    text = caught.value.details() or ""
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "the kubelet's checkpoint says pod team/old holds the devices" in text and "team/new" in text
