"""What the plugin takes as the word of the pod holding a container's devices, before any judgement (pure): a pod
bound to this node and not being deleted, with the webhook's signed intent (deviceplugin/trust.py), or, for a pod
from before the webhook, the answer of the previous device plugin that the kubelet stored for the container.

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

from contract import ENV_VISIBLE, IDX, Intent, ProtocolError, pod_ref, read_annotations
from contract.assignment import int_annotation
from contract.errors import shown
from contract.holding import terminating
from deviceplugin.checkpoint import visible_gpu
from deviceplugin.errors import PluginError, Refusal
from deviceplugin.trust import Context, no_intent, stamped_intent
from node.inventory import Gpu

_RECREATE = ("the kubelet would start it again with that same answer, so the container is not started; delete the "
             "pod so that it is created again through the gpushare webhook (its controller recreates it; create a "
             "bare pod again yourself), which places and allocates it anew")


@dataclass(frozen=True)
class Trusted:
    """A pod bound to this node, not being deleted, whose intent the webhook signed and which it describes."""

    ref: str
    who: str  # the pod and the containers starting, as refusals name them
    intent: Intent


@dataclass(frozen=True)
class LegacyAccepted:
    """A container of a pod from before the webhook starts again with what the kubelet stored for it: nothing is
    delivered and nothing is recorded on the pod."""

    ref: str
    gpu: Gpu
    containers: tuple[str, ...]


def believe(
    pod: Mapping[str, Any], containers: Sequence[str], device_ids: Sequence[str], ctx: Context
) -> Trusted | LegacyAccepted:
    """The pod's word for these containers: refused when it is bound elsewhere or being deleted; a pod without an
    intent, from before the webhook, accepted only as legacy_restart says; else its intent, only if it verifies."""
    ref = pod_ref(pod)
    who = f"pod {ref} (container {', '.join(repr(c) for c in containers)})"
    node = (pod.get("spec") or {}).get("nodeName")
    if node != ctx.node_name:
        raise Refusal(f"{who} is bound to node {node!r}, not to this node {ctx.node_name!r}; restart the kubelet")
    if terminating(pod):
        raise deleting_refusal(who, ctx)
    if ctx.contract.intent_key not in read_annotations(pod):
        return legacy_restart(pod, containers, device_ids, ctx, who)  # a pod from before the webhook
    return Trusted(ref, who, stamped_intent(pod, ctx, who))


def deleting_refusal(who: str, ctx: Context) -> Refusal:
    """A container of a pod being deleted is never started: the kubelet may still start one whose image pull went on
    after the deletion, and the memory the pod was given already counts as free."""
    if ctx.placement == "extender":
        freed = ("the scheduler extender counts a deleted pod's GPU memory as free at once and may have placed another "
                 "pod there")
    else:
        freed = "this node's plugin counts a deleted pod's GPU memory as free once none of its GPU containers runs"
    return Refusal(
        f"{who} is being deleted, so the container is not started: {freed}, and starting it could put more on the GPU "
        "than it holds; nothing to do, the pod goes away by itself",
        reason="GpuSharePodDeleting",
    )


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
