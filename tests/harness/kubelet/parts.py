"""The simulated kubelet's settings, per-pod state and the pod-status pieces it writes (no I/O)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contract import DEFAULT_RESOURCE, ProtocolError, container_units
from node.inventory import Gpu
from tests.harness.apiserver.ports import Pod, now_rfc3339


def _no_delay(pod: Pod) -> float:
    return 0.0


@dataclass(frozen=True)
class KubeletConfig:
    node: str
    root: str  # this node's private directory: device-plugins/, pod-resources/, cdi/
    gpus: tuple[Gpu, ...]
    resource: str = DEFAULT_RESOURCE
    pull_delay: Callable[[Pod], float] = _no_delay  # how long pulling this pod's images takes when absent
    seed: int = 0
    start_attempts: int = 4  # container start retries (the real kubelet backs off forever; bounded here)
    backoff_s: float = 0.05
    rpc_timeout_s: float = 30.0  # the real kubelet has none on Allocate; the simulation must never hang
    register_wait_s: float = 15.0
    # Older kubelets cannot cancel an image pull: a pod deleted while pulling keeps its devices and stays
    # Pending (with a deletionTimestamp) until the pull ends. That window is where the reference plugin fails.
    cancel_pull: bool = False
    # The kubelet's sync that pulled the image of a pod deleted meanwhile may go on to create its first container
    # (PreStartContainer included) before the deletion stops it; the scheduler extender has given that pod's GPU
    # memory away already, so the device plugin must refuse that start.
    start_deleted: bool = False
    # Whether the NVIDIA runtime honours NVIDIA_VISIBLE_DEVICES of unprivileged containers; cdi delivery runs with
    # it off (docs/security.md), so a container's GPUs come from its CDI devices alone.
    env_interface: bool = True

    @property
    def plugin_dir(self) -> str:
        return os.path.join(self.root, "device-plugins")

    @property
    def pod_resources_socket(self) -> str:
        return os.path.join(self.root, "pod-resources", "kubelet.sock")

    @property
    def checkpoint(self) -> str:
        return os.path.join(self.plugin_dir, "kubelet_internal_checkpoint")

    @property
    def cdi_dir(self) -> str:
        return os.path.join(self.root, "cdi")

    @property
    def fake_gpu_dir(self) -> str:
        """Where the plugin writes the files naming fake GPUs, which its CDI specs mount into containers."""
        return os.path.join(self.root, "fake-gpus")


@dataclass
class PodState:
    pod: Pod
    cancel: threading.Event = field(default_factory=threading.Event)
    admitted: bool = False
    terminating: bool = False
    worker: threading.Thread | None = None


def meta_of(pod: Pod) -> dict[str, Any]:
    meta: dict[str, Any] = pod.get("metadata") or {}
    return meta


def containers_of(resource: str, pod: Pod) -> list[tuple[dict[str, Any], bool, int]]:
    """(container, is init container, GPU-share units) in start order: init containers first."""
    spec = pod.get("spec") or {}
    out = []
    for kind, init in (("initContainers", True), ("containers", False)):
        for container in spec.get(kind) or []:
            try:
                units = container_units(container, resource, "container")
            except ProtocolError:
                units = 0  # the API server's validation would have refused it; treat it as no request
            out.append((container, init, units))
    return out


def waiting_status(name: str, reason: str, message: str) -> dict[str, Any]:
    return {"name": name, "ready": False, "restartCount": 0, "image": "",
            "state": {"waiting": {"reason": reason, "message": message}}}


def started_status(container: dict[str, Any], init: bool) -> dict[str, Any]:
    """A running container, or a finished (Completed) non-restartable init container."""
    now = now_rfc3339()
    if init and container.get("restartPolicy") != "Always":
        return {"name": container["name"], "ready": False, "restartCount": 0, "image": "",
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}}
    return {"name": container["name"], "ready": True, "started": True, "restartCount": 0, "image": "",
            "state": {"running": {"startedAt": now}}}
