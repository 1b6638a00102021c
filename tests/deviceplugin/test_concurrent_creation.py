"""The reference failure (bug-report-concurrent-creation.txt) at plugin level: many same-size pods on one
node, admitted in an order different from their bind order, some deleted before their containers start.
Every started container must get its own pod's GPU, and no answer may contain a made-up device id."""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import re
from collections.abc import Iterator, Mapping
from typing import Any

import grpc
import pytest

from contract import IDX, Assignment, parse_allocation
from deviceplugin.devices import slot_of
from tests.harness.kubelet.scripted import Admitted
from tests.harness.plugin.fakes import NODE
from tests.harness.plugin.rig import Rig, make_rig
from tests.harness.pods import admitted, unit_pod

pytestmark = pytest.mark.timeout(120)

PODS = 14  # of 2 GiB each, on 4 GPUs of 8 GiB: the node is nearly full
UNITS = 2
DELETED_BEFORE_START = {"job-02", "job-07", "job-11"}
DELETED_BEFORE_ADMISSION = {"job-05"}
SLOT_RE = re.compile(r"^[0-9a-f]{16}$")


@pytest.fixture(params=["env", "cdi"])
def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    yield from make_rig(tmp_path_factory.mktemp("r"), gpus="4x8GiB", GPUSHARE_DELIVERY=request.param)


def resolved_env(pod: Mapping[str, Any], container: str) -> dict[str, str]:
    """The env the kubelet gives the container: downward-API references resolved from the pod's annotations."""
    annotations = pod["metadata"].get("annotations") or {}
    spec = next(c for c in pod["spec"]["containers"] if c["name"] == container)
    env = {}
    for entry in spec.get("env") or []:
        ref = ((entry.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if ref:
            key = re.fullmatch(r"metadata\.annotations\['(.+)'\]", ref)
            env[entry["name"]] = annotations.get(key.group(1), "") if key else ""
        else:
            env[entry["name"]] = entry.get("value", "")
    return env


def extender_binds(rig: Rig, order: list[str]) -> dict[str, int]:
    """Bind pods in `order`, first GPU with room, as the scheduler extender does; returns name -> GPU index."""
    used = [0] * len(rig.inventory.gpus)
    chosen = {}
    for n, name in enumerate(order):
        index = next(i for i, u in enumerate(used) if u + UNITS <= 8)
        used[index] += UNITS
        chosen[name] = index
        pod = admitted(unit_pod(name, {"main": UNITS}), rig.contract, rig.signer)
        pod["metadata"]["annotations"].update(Assignment(index, 8, UNITS, 1_592_387_683_318_737_367 + n, False)
                                              .annotations())
        rig.api.add(pod)
    return chosen


def check_answers(rig: Rig, admitted: Mapping[str, Admitted]) -> None:
    # No answer contains a made-up device id or any GPU at all: only the slot of the IDs it was given.
    for name, a in admitted.items():
        slot = slot_of(a.device_ids)
        assert dict(a.response.envs) == {"GPUSHARE_SLOT": slot}, name
        assert SLOT_RE.match(slot)
        if rig.contract.delivery == "cdi":
            assert [d.name for d in a.response.cdi_devices] == [f"gpushare.io/gpu={slot}"]
        assert not a.response.devices and not a.response.mounts and not a.response.annotations


def check_started(
    rig: Rig, started: set[str], chosen: Mapping[str, int], admitted: Mapping[str, Admitted]
) -> dict[int, int]:
    """Each started container's pod records, and its container receives, the GPU the extender chose for it."""
    per_gpu: dict[int, int] = {}
    for name in started:
        pod = rig.api.pod("team", name)
        index = chosen[name]
        assert pod["metadata"]["annotations"][IDX] == str(index)
        record = parse_allocation(pod["metadata"]["annotations"]["gpushare.io/allocation"])
        assert (record.gpu_index, record.gpu_uuid) == (index, rig.inventory.gpus[index].uuid)
        assert record.containers["main"].slot == slot_of(admitted[name].device_ids)
        per_gpu[index] = per_gpu.get(index, 0) + UNITS
        if rig.contract.delivery == "env":
            env = resolved_env(pod, "main")
            assert env["NVIDIA_VISIBLE_DEVICES"] == str(index)
            assert (env["ALIYUN_COM_GPU_MEM_IDX"], env["ALIYUN_COM_GPU_MEM_DEV"]) == (str(index), "8")
            assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == str(UNITS)
        else:
            path = os.path.join(rig.plugin.settings.cdi_dir, f"gpushare-{record.containers['main'].slot}.json")
            with open(path) as handle:
                edits = json.load(handle)["devices"][0]["containerEdits"]
            assert f"NVIDIA_VISIBLE_DEVICES={rig.inventory.gpus[index].uuid}" in edits["env"]
            assert f"ALIYUN_COM_GPU_MEM_IDX={index}" in edits["env"]
    return per_gpu


def test_every_started_container_gets_its_own_pods_gpu(rig: Rig) -> None:
    rng = random.Random(26)
    names = [f"job-{n:02d}" for n in range(PODS)]
    rig.kubelet.wait_registrations(1)
    bind_order = names[:]
    rng.shuffle(bind_order)
    chosen = extender_binds(rig, bind_order)
    for name in DELETED_BEFORE_ADMISSION:
        rig.api.delete("team", name)

    admit_order = [n for n in names if n not in DELETED_BEFORE_ADMISSION]
    while admit_order == [n for n in bind_order if n in admit_order]:
        rng.shuffle(admit_order)
    rng.shuffle(admit_order)
    admitted: dict[str, Admitted] = {}
    for name in admit_order:
        (admitted[name],) = rig.kubelet.admit("team", name, [("main", UNITS)])

    check_answers(rig, admitted)

    # Image pulls finish in any order; some pods are deleted meanwhile (the kubelet still lists them).
    for name in DELETED_BEFORE_START:
        rig.api.delete("team", name)
    start_order = list(admitted)
    rng.shuffle(start_order)
    outcomes: dict[str, str] = {}

    def start(name: str) -> None:
        try:
            rig.kubelet.start_container("team", name, "main")
            outcomes[name] = "started"
        except grpc.RpcError as exc:
            outcomes[name] = f"{exc.code().name}: {exc.details()}"

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(start, start_order))

    for name in DELETED_BEFORE_START:
        assert outcomes[name].startswith("FAILED_PRECONDITION"), outcomes[name]
        assert f"pod team/{name}, which holds these devices, no longer exists" in outcomes[name]
    started = {n for n, o in outcomes.items() if o == "started"}
    assert started == set(admitted) - DELETED_BEFORE_START, outcomes

    per_gpu = check_started(rig, started, chosen, admitted)
    assert all(units <= 8 for units in per_gpu.values())
    # No recorded slot belongs to a pod that was deleted before it started.
    deleted_slots = {slot_of(admitted[n].device_ids) for n in DELETED_BEFORE_START}
    for name in started:
        record = parse_allocation(rig.api.pod("team", name)["metadata"]["annotations"]["gpushare.io/allocation"])
        assert record.containers["main"].slot not in deleted_slots
    assert all(e[1] == "Normal" for e in rig.api.events)
    assert len([e for e in rig.api.events if e[2] == "GpuShareAllocated"]) == len(started)
    assert rig.api.pod("team", sorted(started)[0])["spec"]["nodeName"] == NODE
