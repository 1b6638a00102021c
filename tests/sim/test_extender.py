"""The simulated scheduler extender models the real one: it books the app containers' sum, frees a pod's memory at
its deletionTimestamp, patches with a strategic merge, and fails every bind of a pod it cannot place."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from contract import IDX, POD
from node.inventory import fake_gpus
from tests.harness.apiserver.ports import MemoryStore, Pod
from tests.harness.scenarios import PodShape
from tests.harness.sim.extender import EXTENDER_USER, Extender, Placement, SimNode, node_room, used_units

pytestmark = pytest.mark.timeout(30)
NODE = SimNode("node-0", tuple(fake_gpus("2x8GiB", "node-0", "GiB")))


def placed(name: str, units: int, index: int, **meta: Any) -> Pod:
    pod = PodShape((units,)).pod(name=name)
    pod["metadata"].update(annotations={IDX: str(index), POD: str(units), "ALIYUN_COM_GPU_MEM_DEV": "8"}, **meta)
    pod["spec"]["nodeName"] = NODE.name
    pod["status"] = {"phase": "Running"}
    return pod


@pytest.mark.parametrize(("pod", "gpu", "node"), [
    (placed("running", 6, 0), 6, 6),
    (placed("deleting", 6, 0, deletionTimestamp="2026-01-02T03:04:05Z"), 0, 6),  # freed at once by the extender
    ({**placed("done", 6, 0), "status": {"phase": "Succeeded"}}, 0, 0),
])
def test_the_extender_frees_a_pod_at_its_deletion_the_scheduler_when_it_is_gone(pod: Pod, gpu: int,
                                                                                 node: int) -> None:
    assert used_units([pod], []).get((NODE.name, 0), 0) == gpu
    ((left, _),) = node_room([NODE], [pod], [], 0, "aliyun.com/gpu-mem")
    assert 16 - left == node
    assert used_units([], [Placement(NODE.name, 1, 8, 3, 5)]) == {(NODE.name, 1): 3}


@pytest.fixture
def cluster() -> Iterator[tuple[MemoryStore, Extender]]:
    store = MemoryStore()
    extender = Extender(store.client(EXTENDER_USER), [NODE], max_jitter_s=0.0)
    extender.start()
    try:
        yield store, extender
    finally:
        extender.close()


def wait_for(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_the_extender_books_the_app_containers_and_places_beside_a_pod_being_deleted(
    cluster: tuple[MemoryStore, Extender],
) -> None:
    store, extender = cluster
    user = store.client("alice")
    first = PodShape((8,), (6,)).pod(name="first")
    first["metadata"]["annotations"] = {"gpushare.io/intent": "kept"}
    user.create_pod("team", first)
    wait_for("first bound", lambda: bool((user.get_pod("team", "first") or {})["spec"].get("nodeName")))
    annotations = (user.get_pod("team", "first") or {})["metadata"]["annotations"]
    assert (annotations[IDX], annotations[POD], annotations["gpushare.io/intent"]) == ("0", "8", "kept")
    user.delete_pod("team", "first")  # bound: it terminates, with a deletionTimestamp
    user.create_pod("team", PodShape((4,)).pod(name="second"))
    wait_for("second bound", lambda: IDX in ((user.get_pod("team", "second") or {})["metadata"].get("annotations")
                                             or {}))
    # The extender gave GPU 0's 8 GiB back at first's deletion, and best fit puts the replacement there.
    assert (user.get_pod("team", "second") or {})["metadata"]["annotations"][IDX] == "0"
    assert "first" in {p["metadata"]["name"] for p in user.list_pods()[0]}  # still terminating
    assert not extender.bind_errors


def test_a_pod_with_gpu_memory_only_in_init_containers_never_binds(cluster: tuple[MemoryStore, Extender]) -> None:
    store, extender = cluster
    user = store.client("alice")
    created = user.create_pod("team", PodShape((0,), (4,)).pod(name="init-only"))
    uid = created["metadata"]["uid"]
    wait_for("the bind error", lambda: uid in extender.bind_errors)
    assert extender.bind_errors[uid] == "The node node-0 can't place the pod init-only in ns team"
    pod = user.get_pod("team", "init-only") or {}
    assert not pod["spec"].get("nodeName") and IDX not in (pod["metadata"].get("annotations") or {})
