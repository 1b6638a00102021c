"""What a container receives: the Allocate answer for a slot, the CDI spec for a slot, and the env-mode check."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contract import ENV_CONTAINER, ENV_DEV, ENV_IDX, ENV_POD, ENV_VISIBLE, RESERVED_ENV
from contract.env import expected_env, normal_env
from contract.modes import Delivery
from deviceplugin.inventory import Gpu

SLOT_ENV = "GPUSHARE_SLOT"
CDI_VERSION = "0.6.0"
CDI_KIND = "gpushare.io/gpu"
# Control devices a CUDA process needs beside its GPU, added to the CDI spec where the node has them.
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
# A fake GPU has no device node; its CDI spec bind-mounts a small file naming it here instead.
FAKE_GPU_MOUNT = "/run/gpushare/gpu"


@dataclass(frozen=True)
class ContainerDelivery:
    """One ContainerAllocateResponse, as plain data: it depends on the slot only, never on a guessed pod."""

    envs: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


def cdi_device_name(slot: str) -> str:
    return f"{CDI_KIND}={slot}"


def allocate_delivery(slot: str, delivery: Delivery) -> ContainerDelivery:
    """env mode: only GPUSHARE_SLOT (the GPU arrives through the webhook's downward-API env, and the
    plugin never sets a name the webhook injects); cdi mode: the slot's CDI device, written at PreStart."""
    if delivery == "cdi":
        return ContainerDelivery(envs={SLOT_ENV: slot}, cdi_devices=(cdi_device_name(slot),))
    return ContainerDelivery(envs={SLOT_ENV: slot})


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


def find_container(pod: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    spec = pod.get("spec") or {}
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or []:
            if isinstance(container, Mapping) and container.get("name") == name:
                return container
    return None


def env_problems(container: Mapping[str, Any], container_units: int, pod_units: int) -> list[str]:
    """Where the container's env differs from what the webhook injects in env mode (empty when it matches)."""
    env = [e for e in container.get("env") or [] if isinstance(e, Mapping)]
    problems: list[str] = []
    for wanted in expected_env(container_units, pod_units):
        name = wanted["name"]
        found = [e for e in env if e.get("name") == name]
        if not found:
            problems.append(f"{name} is missing")
        elif len(found) > 1:
            problems.append(f"{name} is defined {len(found)} times")
        elif normal_env(found[0]) != normal_env(wanted):
            problems.append(f"{name} is not the webhook's definition")
    expected_names = {e["name"] for e in expected_env(container_units, pod_units)}
    for name in RESERVED_ENV:
        if name not in expected_names and any(e.get("name") == name for e in env):
            problems.append(f"{name} is set, which gpushare reserves")
    return problems
