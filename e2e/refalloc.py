"""The reference device plugin's Allocate decision, as pure functions: it guesses the pod, and that is the bug.

Modelled on AliyunContainerService/gpushare-device-plugin, read for this purpose (no code taken):
- pkg/gpu/nvidia/allocate.go, `Allocate`: under one lock, sum the device IDs of every container request; list the
  candidate pods; take the first whose app containers' limits add up to that sum. Found: every container gets
  NVIDIA_VISIBLE_DEVICES=<the GPU's UUID for the pod's ALIYUN_COM_GPU_MEM_IDX> and the ALIYUN_COM_GPU_MEM_* envs,
  and the pod is patched ASSIGNED="true". Not found on a one-GPU node: that GPU. Otherwise, and on any error
  (listing, an unknown index, the patch), a *successful* answer whose NVIDIA_VISIBLE_DEVICES is
  `no-gpu-has-<N><unit>-to-run` (buildErrResponse), which the NVIDIA runtime hook later refuses.
- pkg/gpu/nvidia/podmanager.go, `getCandidatePods`: the node's *Pending* pods (by default listed from the API server
  with `spec.nodeName=<node>,status.phase=Pending`; a pod being deleted is still Pending), de-duplicated by UID,
  kept when "assumed", sorted by ALIYUN_COM_GPU_MEM_ASSUME_TIME.
- pkg/gpu/nvidia/podutils.go, `isGPUMemoryAssumedPod`: a GPU-memory limit on an app container, an
  ALIYUN_COM_GPU_MEM_ASSUME_TIME annotation, and ALIYUN_COM_GPU_MEM_ASSIGNED="false";
  `patchPodAnnotationSpecAssigned`: a strategic-merge patch of ASSIGNED="true" and a fresh ASSUME_TIME.
The simulated tier (tests/harness/sim/baseline.py) and the real-node process (e2e/refservice.py) both decide here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contract import ASSIGNED, ASSUME_TIME, IDX, ProtocolError, container_units, keys
from node.inventory import Gpu

Pod = dict[str, Any]

VISIBLE = keys.ENV_VISIBLE
# The reference's env names (pkg/gpu/nvidia/const.go), which the protocol shares.
ENV_INDEX, ENV_POD, ENV_CONTAINER, ENV_DEV = keys.ENV_IDX, keys.ENV_POD, keys.ENV_CONTAINER, keys.ENV_DEV


def _int(value: object, default: int) -> int:
    try:
        return int(str(value))
    except ValueError:
        return default


def _annotations(pod: Pod) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("annotations") or {})


def app_units(pod: Pod, resource: str) -> int:
    """getGPUMemoryFromPodResource: the sum over *app* containers' limits (init containers are ignored)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        with contextlib.suppress(ProtocolError):
            total += container_units(container, resource, "container")
    return total


def assumed(pod: Pod, resource: str) -> bool:
    """isGPUMemoryAssumedPod."""
    annotations = _annotations(pod)
    return app_units(pod, resource) > 0 and ASSUME_TIME in annotations and annotations.get(ASSIGNED) == "false"


def candidates(pods: Sequence[Pod], node: str, resource: str) -> list[Pod]:
    """getCandidatePods: this node's pending assumed pods, one per UID, oldest ASSUME_TIME first (a stable sort;
    Go's sort.Sort is not stable, so the reference may order equal times either way)."""
    seen: set[str] = set()
    found = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        uid = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
        if (pod.get("spec") or {}).get("nodeName") != node or uid in seen:
            continue
        seen.add(uid)
        if status.get("phase", "Pending") == "Pending" and assumed(pod, resource):
            found.append(pod)
    return sorted(found, key=lambda p: _int(_annotations(p).get(ASSUME_TIME), 0))


@dataclass(frozen=True)
class Decision:
    """What Allocate answers: the GPU every container sees, and the pod to mark ASSIGNED="true" (if any)."""

    visible: str  # a GPU UUID, or no-gpu-has-<N><unit>-to-run
    index: int  # -1 with no-gpu-has-…
    pod: Pod | None = None
    why: str = ""  # for the log: why nothing matched

    @property
    def made_up(self) -> bool:
        return self.index < 0


def no_gpu(pod_units: int, unit: str, why: str) -> Decision:
    """buildErrResponse: a successful answer naming a device that does not exist."""
    return Decision(f"no-gpu-has-{pod_units}{unit}-to-run", -1, None, why)


def decide(pods: Sequence[Pod], node: str, pod_units: int, gpus: Sequence[Gpu], *, resource: str,
           unit: str) -> Decision:
    """The pick: the oldest assumed pending pod whose app limits equal the device IDs requested in this call."""
    chosen = next((p for p in candidates(pods, node, resource) if app_units(p, resource) == pod_units), None)
    if chosen is None:
        if len(gpus) == 1:
            return Decision(gpus[0].uuid, gpus[0].index)
        return no_gpu(pod_units, unit, f"no assumed pod on node {node} requests {pod_units} {unit}")
    index = _int(_annotations(chosen).get(IDX), -1)
    gpu = next((g for g in gpus if g.index == index), None)
    if gpu is None:
        meta = chosen.get("metadata") or {}
        return no_gpu(pod_units, unit, f"pod {meta.get('namespace')}/{meta.get('name')} names GPU index "
                                       f"{_annotations(chosen).get(IDX)!r}, which this node does not have")
    return Decision(gpu.uuid, gpu.index, chosen)


def container_envs(decision: Decision, pod_units: int, container_units_: int, dev_units: int) -> dict[str, str]:
    """The envs of one ContainerAllocateResponse (both branches of allocate.go set the same five)."""
    return {VISIBLE: decision.visible, ENV_INDEX: str(decision.index), ENV_POD: str(pod_units),
            ENV_CONTAINER: str(container_units_), ENV_DEV: str(dev_units)}


def assigned_patch(now_ns: int) -> dict[str, Any]:
    """patchPodAnnotationSpecAssigned."""
    return {"metadata": {"annotations": {ASSIGNED: "true", ASSUME_TIME: str(now_ns)}}}
