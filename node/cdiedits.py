"""The container edits of a GPU in a CDI spec: its device nodes or a fake GPU's file, and the env naming it (pure)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contract import ENV_CONTAINER, ENV_DEV, ENV_IDX, ENV_POD, ENV_VISIBLE
from node.inventory import Gpu

CDI_VERSION = "0.6.0"
CDI_KIND = "gpushare.io/gpu"
# Control devices a CUDA process needs beside its GPU, added to the CDI spec where the node has them.
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
# A fake GPU has no device node; its CDI spec bind-mounts a small file naming it here instead.
FAKE_GPU_MOUNT = "/run/gpushare/gpu"


def cdi_device_name(slot: str) -> str:
    return f"{CDI_KIND}={slot}"


def device_nodes(gpu: Gpu, present: Sequence[str]) -> list[str]:
    """The device nodes of a real GPU (its minor number, not its NVML index) and the control devices
    that exist on this node; a fake GPU has none."""
    if gpu.minor is None:
        return []
    return [f"/dev/nvidia{gpu.minor}", *[p for p in CONTROL_DEVICES if p in present]]


def cdi_env(gpu: Gpu, container_units: int, pod_units: int) -> list[str]:
    return [
        f"{ENV_VISIBLE}={gpu.uuid}",
        f"{ENV_IDX}={gpu.index}",
        f"{ENV_DEV}={gpu.memory_units}",
        f"{ENV_CONTAINER}={container_units}",
        f"{ENV_POD}={pod_units}",
    ]


def fake_gpu_file(gpu: Gpu) -> tuple[str, str]:
    """The file name and text of the host file that names a fake GPU (index and UUID)."""
    return f"{gpu.uuid}.txt", f"index={gpu.index}\nuuid={gpu.uuid}\n"


def cdi_spec(
    slot: str, gpu: Gpu, nodes: Sequence[str], container_units: int, pod_units: int, *, gpu_file: str = ""
) -> dict[str, Any]:
    """The CDI spec that gives the container of this slot its GPU: a real GPU's device nodes, or for a fake GPU a
    read-only bind mount of `gpu_file` (CDI 0.6.0 mounts: hostPath, containerPath, options)."""
    edits: dict[str, Any] = {"env": cdi_env(gpu, container_units, pod_units)}
    if nodes:
        edits["deviceNodes"] = [{"path": path} for path in nodes]
    if gpu_file:
        edits["mounts"] = [
            {"hostPath": gpu_file, "containerPath": FAKE_GPU_MOUNT, "options": ["ro", "nosuid", "nodev", "bind"]}
        ]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": slot, "containerEdits": edits}],
    }


@dataclass(frozen=True)
class SlotEdits:
    """All that one slot's container gets, decided before anything is written: its CDI spec, the control devices
    the spec lists that are kept only where the node has them, and a fake GPU's host file (path, text), which must
    exist before the spec that mounts it."""

    slot: str
    spec: dict[str, Any]
    optional_nodes: tuple[str, ...] = ()
    host_file: tuple[str, str] | None = None


def slot_edits(slot: str, gpu: Gpu, container_units: int, pod_units: int, fake_gpu_dir: str) -> SlotEdits:
    """The edits of the slot's container: a real GPU's device nodes and control devices, or a fake GPU's file in
    `fake_gpu_dir`, and the env naming the GPU."""
    if gpu.minor is not None:
        nodes = device_nodes(gpu, CONTROL_DEVICES)
        return SlotEdits(slot, cdi_spec(slot, gpu, nodes, container_units, pod_units), CONTROL_DEVICES)
    name, text = fake_gpu_file(gpu)
    path = os.path.join(fake_gpu_dir, name)
    return SlotEdits(slot, cdi_spec(slot, gpu, [], container_units, pod_units, gpu_file=path), host_file=(path, text))
