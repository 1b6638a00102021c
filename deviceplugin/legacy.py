"""Pods from the previous device plugin: whether a container of such a pod, created before the gpushare webhook and
started by the plugin this one replaced, may start again on this node (pure).

When such a container is restarted (it crashed, or its pod's sandbox was recreated), the kubelet calls no Allocate:
it finds the container's devices in its checkpoint (pkg/kubelet/cm/devicemanager/manager.go, devicesToAllocate:
"Found pre-allocated devices"), calls PreStartContainer of the plugin registered now with those device IDs
(callPreStartContainerIfNeeded), and hands the runtime the Allocate answer it stored for that container
(pod_devices.go, deviceRunContainerOptions). So the GPU the container gets is the one the previous plugin named,
fixed by the kubelet; this plugin can only let the start go on or stop it. It lets it go on only when that GPU is
a healthy GPU of this node and the one the pod's ALIYUN_COM_GPU_MEM_IDX records (the scheduler extender's placement,
where the extender and this plugin count the pod): an IDX written by anyone else can make it refuse, never choose
a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contract import ENV_VISIBLE, IDX, ProtocolError, pod_ref, read_annotations
from contract.assignment import int_annotation
from contract.errors import shown
from deviceplugin.checkpoint import visible_gpu
from deviceplugin.errors import PluginError, Refusal
from deviceplugin.trust import Context, no_intent
from node.inventory import Gpu

_RECREATE = ("the kubelet would start it again with that same answer, so the container is not started; delete the "
             "pod so that it is created again through the gpushare webhook (its controller recreates it; create a "
             "bare pod again yourself), which places and allocates it anew")


@dataclass(frozen=True)
class LegacyAccepted:
    """A container of a pod from before the webhook starts again with what the kubelet stored for it: nothing is
    delivered and nothing is recorded on the pod."""

    ref: str
    gpu: Gpu
    containers: tuple[str, ...]


def legacy_restart(
    pod: Mapping[str, Any], containers: Sequence[str], device_ids: Sequence[str], ctx: Context, who: str
) -> LegacyAccepted:
    """Accept the start of these containers of a pod without an intent only if the kubelet's checkpoint keeps, for
    each of them with exactly these devices, an answer of a previous device plugin that names one healthy GPU of
    this node, and that GPU is the one the pod's IDX records; otherwise refuse, saying what the plugin gave it."""
    key = ctx.contract.intent_key
    checkpoint = ctx.checkpoint()
    if checkpoint.problem:
        raise PluginError(
            "UNAVAILABLE",
            f"{who} has no {key} annotation, and what a previous device plugin gave it cannot be told: the kubelet's "
            f"device checkpoint cannot be read ({checkpoint.problem}); mount /var/lib/kubelet/device-plugins into "
            "the plugin and check GPUSHARE_KUBELET_CHECKPOINT; the kubelet retries the start",
        )
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    wanted = frozenset(device_ids)
    given = [e.visible for e in checkpoint.entries
             if e.pod_uid == uid and e.container in containers and frozenset(e.device_ids) == wanted]
    if not given or None in given:
        raise Refusal(no_intent(who, key, why=", and the kubelet keeps no answer of a previous device plugin for "
                                              "this container (it was not started before the switch)"),
                      reason="GpuShareNoIntent")
    values = sorted({v for v in given if v is not None})
    # Shown whole up to 80 characters: a GPU UUID has 40, a value the reference plugin wrote is never longer.
    gave = "the previous device plugin gave it " + " and ".join(f"{ENV_VISIBLE}={shown(v, 80)}" for v in values)
    head = f"{who} was created before the gpushare webhook was installed, and {gave}"
    gpus = {visible_gpu(v, ctx.gpus) for v in values}
    gpu = gpus.pop() if len(gpus) == 1 else None
    if gpu is None:
        raise Refusal(f"{head}, which names no single GPU of node {ctx.node_name} (it has GPUs {sorted(ctx.gpus)}); "
                      f"{_RECREATE}", reason="GpuShareLegacyWrongGpu")
    recorded = _recorded_index(pod)
    if recorded != gpu.index:
        named = f"GPU {recorded}" if isinstance(recorded, int) else recorded
        raise Refusal(f"{head}, GPU {gpu.index}, but its {IDX} annotation records {named}, where the scheduler "
                      f"extender counts it; {_RECREATE}", reason="GpuShareLegacyWrongGpu")
    if not ctx.healthy(gpu.index):
        raise Refusal(f"{head}, GPU {gpu.index}, which is unhealthy (critical XID); {_RECREATE}",
                      reason="GpuShareUnhealthy")
    return LegacyAccepted(pod_ref(pod), gpu, tuple(containers))


def _recorded_index(pod: Mapping[str, Any]) -> int | str:
    """The GPU index the pod's IDX annotation records, or words saying there is none."""
    try:
        index = int_annotation(read_annotations(pod), IDX)
    except ProtocolError:
        return "a value that is not a GPU index"
    return "no GPU" if index is None else index
