"""The invariant checker on hand-made observations: each violation class is caught, a clean run passes."""

from __future__ import annotations

from typing import Any

import pytest

from node.inventory import fake_gpus
from tests.harness.apiserver.ports import Pod
from tests.harness.judge import Observation, check, summarize
from tests.harness.kubelet.runtime import ContainerRun

GPUS = {"n": fake_gpus("2x8GiB", "n", "GiB")}


def pod(uid: str, idx: int | None = 0, units: int = 4, phase: str = "Running", node: str | None = "n",
        **status: Any) -> Pod:
    annotations = {} if idx is None else {"ALIYUN_COM_GPU_MEM_IDX": str(idx), "ALIYUN_COM_GPU_MEM_POD": str(units),
                                          "ALIYUN_COM_GPU_MEM_DEV": "8"}
    return {"metadata": {"uid": uid, "name": uid, "namespace": "ns", "annotations": annotations},
            "spec": {"nodeName": node}, "status": {"phase": phase, **status}}


def run(uid: str, gpus: tuple[int, ...] = (0,), units: int = 4, made_up: tuple[str, ...] = (),
        annotations: dict[str, str] | None = None, mounted: tuple[int, ...] | None = None) -> ContainerRun:
    visible = ",".join([*map(str, gpus), *made_up])
    return ContainerRun("n", "ns", uid, uid, "c", False, units, {"NVIDIA_VISIBLE_DEVICES": visible}, visible, gpus,
                        made_up, not made_up, "unknown device id" if made_up else None, dict(annotations or {}),
                        mounted=mounted)


def observe(pods: list[Pod], runs: list[ContainerRun], **kwargs: Any) -> Observation:
    return Observation(pods=pods, runs=runs, gpus=GPUS, held=kwargs.pop("held", {"n": set()}), **kwargs)


WAITING: dict[str, Any] = {
    "containerStatuses": [{"state": {"waiting": {"reason": "CreateContainerError", "message": "why"}}}]}
ALLOCATION = '{"allocationId":"a","containers":{},"gpu":{"index":1,"uuid":"GPU-x"},"node":"n","version":1}'


@pytest.mark.parametrize(("pods", "runs", "extra", "kinds"), [
    ([pod("a")], [run("a")], {}, []),
    ([pod("a", idx=1)], [run("a", gpus=(0,))], {}, ["wrong-gpu"]),
    ([pod("a")], [run("a", gpus=(0, 1))], {}, ["wrong-gpu"]),
    ([pod("a")], [run("a", mounted=(0,))], {}, []),
    ([pod("a")], [run("a", mounted=(1,))], {}, ["wrong-gpu"]),  # the CDI-mounted file names another GPU
    ([pod("a")], [run("a", mounted=())], {}, ["wrong-gpu"]),  # the mounted file is missing
    ([pod("a", idx=None)], [run("a", gpus=(0,))], {}, ["wrong-gpu"]),
    ([pod("a", phase="Pending", **WAITING)], [run("a", gpus=(), made_up=("no-gpu-has-4GiB-to-run",))], {},
     ["made-up-device"]),
    ([pod("a", units=6), pod("b", units=6)], [run("a", units=6), run("b", units=6)], {}, ["overcommit", "overcommit"]),
    ([pod("a", phase="Pending")], [], {}, ["no-message"]),
    ([pod("a", phase="Pending", **WAITING)], [], {}, []),
    ([pod("a", phase="Failed", message="Allocate failed due to x, which is unexpected")], [], {}, []),
    ([pod("a", idx=None, phase="Pending", node=None)], [], {"unschedulable": {"a": "no room"}}, []),
    ([pod("a", idx=None, phase="Pending", node=None)], [], {}, ["no-message"]),
    ([pod("a")], [run("a")], {"deleted": {"a"}}, ["not-released"]),
    ([], [], {"deleted": {"a"}, "held": {"n": {"a"}}}, ["not-released"]),
    ([], [run("gone", gpus=(1,), annotations={"ALIYUN_COM_GPU_MEM_IDX": "1"})], {}, []),
    ([{**pod("a"), "metadata": {**pod("a")["metadata"], "annotations": {
        **pod("a")["metadata"]["annotations"], "gpushare.io/allocation": ALLOCATION}}}], [run("a")], {},
     ["wrong-gpu"]),
])
def test_each_violation_class_is_caught(pods: list[Pod], runs: list[ContainerRun], extra: dict[str, Any],
                                        kinds: list[str]) -> None:
    assert sorted(v.kind for v in check(observe(pods, runs, **extra))) == sorted(kinds)


def test_summary_columns() -> None:
    pods = [pod("a"), pod("b", idx=1), pod("c", phase="Pending", **WAITING),
            pod("d", phase="Pending", **WAITING)]
    runs = [run("a"), run("b", gpus=(0,)), run("d", gpus=(), made_up=("x",))]
    summary = summarize(observe(pods, runs))
    assert (summary.pods, summary.started, summary.right_gpu, summary.made_up_ids) == (4, 2, 1, 1)
    assert (summary.failed_clearly, summary.other) == (1, 1)


def bare(visible: str | None = None, gpus: tuple[int, ...] = (), cdi: tuple[str, ...] = (),
         mounted: tuple[int, ...] | None = None, env_interface: bool = True, init: bool = False,
         started: bool = True) -> ContainerRun:
    """A container of pod `a` that requests no GPU memory, as the runtime started it."""
    env = {} if visible is None else {"NVIDIA_VISIBLE_DEVICES": visible}
    return ContainerRun("n", "ns", "a", "a", "side", init, 0, env, visible if env_interface else None, gpus, (),
                        started, None if started else "failed", {}, mounted=mounted, cdi_devices=cdi,
                        env_interface=env_interface)


@pytest.mark.parametrize(("runs", "kinds"), [
    ([bare()], []),  # no variable at all
    ([bare("void")], []),  # neutralised by the webhook
    ([bare("void", init=True)], []),
    ([bare("all", gpus=(0, 1))], ["unrequested-gpu"]),  # an nvidia/cuda image's env
    ([bare("1", gpus=(1,), init=True)], ["unrequested-gpu"]),
    ([bare("none")], ["unrequested-gpu"]),  # no device, but the driver is mounted
    ([bare("")], ["unrequested-gpu"]),
    ([bare("all", env_interface=False)], []),  # cdi mode: the runtime ignores the variable
    ([bare(cdi=("gpushare.io/gpu=slot-0",), env_interface=False)], ["unrequested-gpu"]),
    ([bare(mounted=(0,), env_interface=False)], ["unrequested-gpu"]),
    ([bare("all", gpus=(0, 1), started=False)], []),  # never started: nothing was seen
    ([run("a"), bare("void")], []),  # a GPU container and its neutralised sidecar
    ([run("a"), bare("all", gpus=(0, 1))], ["unrequested-gpu"]),
])
def test_containers_without_gpu_memory_see_no_gpu(runs: list[ContainerRun], kinds: list[str]) -> None:
    assert sorted(v.kind for v in check(observe([pod("a")], runs))) == sorted(kinds)
