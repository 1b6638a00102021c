"""What a container sees: env order, downward API, CDI edits, NVIDIA_VISIBLE_DEVICES; the PodResources limiter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from node.inventory import fake_gpus
from tests.harness.kubelet.runtime import (
    CUDA_IMAGE_ENV,
    CdiError,
    cdi_edits,
    container_env,
    create_container,
    field_value,
    image_env,
    last_wins,
    visible_gpus,
)
from tests.harness.kubelet.wire import TokenBucket

GPUS = fake_gpus("2x8GiB", "node-a", "GiB")
POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "1"},
                 "labels": {"app": "x"}},
    "spec": {"nodeName": "node-a"},
}


@pytest.mark.parametrize(("path", "value"), [
    ("metadata.annotations['ALIYUN_COM_GPU_MEM_IDX']", "1"),
    ("metadata.annotations['absent']", ""),
    ("metadata.labels['app']", "x"),
    ("metadata.name", "p"),
    ("metadata.namespace", "ns"),
    ("metadata.uid", "u1"),
    ("spec.nodeName", "node-a"),
])
def test_downward_api_fields(path: str, value: str) -> None:
    assert field_value(POD, path) == value


def _ref(key: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}}


@pytest.mark.parametrize(("plugin_envs", "container", "expected"), [
    ({}, [{"name": "A", "value": "1"}], {"A": "1"}),
    ({"A": "plugin"}, [{"name": "A", "value": "mine"}], {"A": "mine"}),  # the container's own env comes last
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-x"}, [{"name": "NVIDIA_VISIBLE_DEVICES", **_ref("ALIYUN_COM_GPU_MEM_IDX")}],
     {"NVIDIA_VISIBLE_DEVICES": "1"}),
    ({}, [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}], {"A": "2"}),
    ({"K": "v"}, [{"name": "M", **_ref("missing")}], {"K": "v", "M": ""}),
])
def test_env_order_and_last_value_wins(plugin_envs: dict[str, str], container: list[dict[str, Any]],
                                       expected: dict[str, str]) -> None:
    env = container_env({"name": "c", "env": container}, POD, [plugin_envs])
    assert list(env)[: len(plugin_envs)] == list(plugin_envs.items())
    assert last_wins(env) == expected


@pytest.mark.parametrize(("image", "env"), [
    ("nvidia/cuda:12.4.1-base-ubuntu22.04", CUDA_IMAGE_ENV),
    ("registry.example/ns/nvidia/cuda:app-0", CUDA_IMAGE_ENV),
    ("localhost:5000/nvidia/cuda@sha256:00", CUDA_IMAGE_ENV),
    ("registry.example/ns/app:app-0", {}),
    ("nvidia/cuda-like:1", {}),
    ("", {}),
])
def test_image_env(image: str, env: dict[str, str]) -> None:
    assert image_env(image) == env


@pytest.mark.parametrize(("container_env_", "env_interface", "visible", "gpus"), [
    ([], True, "all", (0, 1)),  # the image's env, read by the runtime
    ([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}], True, "void", ()),  # the webhook's entry comes last
    ([], False, None, ()),  # a runtime set to ignore the variable
])
def test_an_image_env_selecting_every_gpu(container_env_: list[dict[str, Any]], env_interface: bool,
                                          visible: str | None, gpus: tuple[int, ...], tmp_path: Path) -> None:
    container = {"name": "c", "image": "nvidia/cuda:12", "env": container_env_}
    run = create_container("node-a", GPUS, str(tmp_path), POD, container, False, 0, None, env_interface)
    assert (run.visible, run.gpus, run.started) == (visible, gpus, True)
    assert run.env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"


@pytest.mark.parametrize(("value", "gpus", "made_up"), [
    (None, (), ()),
    ("", (), ()),
    ("none", (), ()),
    ("void", (), ()),
    ("all", (0, 1), ()),
    ("1", (1,), ()),
    ("0,1", (0, 1), ()),
    (GPUS[1].uuid, (1,), ()),
    ("7", (), ("7",)),
    ("no-gpu-has-8MiB-to-run", (), ("no-gpu-has-8MiB-to-run",)),
])
def test_visible_devices_resolve_like_nvidia_container_cli(value: str | None, gpus: tuple[int, ...],
                                                           made_up: tuple[str, ...]) -> None:
    seen = visible_gpus(value, GPUS)
    assert (seen.gpus, seen.made_up) == (gpus, made_up)


def test_cdi_edits_read_at_creation_time(tmp_path: Path) -> None:
    with pytest.raises(CdiError, match=r"unresolvable CDI devices gpushare\.io/gpu=s1"):
        cdi_edits(["gpushare.io/gpu=s1"], str(tmp_path))
    spec = {"cdiVersion": "0.6.0", "kind": "gpushare.io/gpu", "containerEdits": {"env": ["COMMON=1"]},
            "devices": [{"name": "s1", "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-a"],
                                                          "deviceNodes": [{"path": "/dev/nvidia0"}]}}]}
    (tmp_path / "gpushare-s1.json").write_text(json.dumps(spec))
    (tmp_path / "broken.json").write_text("{not json")
    edits = cdi_edits(["gpushare.io/gpu=s1"], str(tmp_path))
    assert edits.env == (("COMMON", "1"), ("NVIDIA_VISIBLE_DEVICES", "GPU-a"))
    assert edits.device_nodes == ("/dev/nvidia0",)


def test_pod_resources_rate_limit_is_a_token_bucket() -> None:
    now = [0.0]
    bucket = TokenBucket(100.0, 10, clock=lambda: now[0])
    assert [bucket.allow() for _ in range(11)] == [True] * 10 + [False]
    now[0] += 0.05  # five tokens come back in 50 ms at 100/s
    assert [bucket.allow() for _ in range(6)] == [True] * 5 + [False]
    now[0] += 10.0  # never more than the burst
    assert sum(bucket.allow() for _ in range(20)) == 10
    assert bucket.rejected == 12
