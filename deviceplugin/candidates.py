"""Whether Allocate may hand out devices of a size: some pod of this node that the gpushare webhook admitted has a
container waiting for exactly that many units (the node index, else a fresh listing); else a refusal that says what
to check, and an Event on the pod when only one pod waits."""

from __future__ import annotations

from typing import Any

from contract import IDX
from deviceplugin.apiserver import ApiServer
from deviceplugin.blame import allocate_refusal, waiting_pods
from deviceplugin.errors import PluginError
from deviceplugin.events import EventRecorder
from deviceplugin.nodeindex import NodeIndex
from deviceplugin.offers import allocation_candidates
from node.apiclient import ApiServerError


class Candidates:
    def __init__(self, api: ApiServer, index: NodeIndex, events: EventRecorder) -> None:
        self.api = api
        self.index = index
        self.events = events

    def check(self, units: int, slot: str) -> None:
        """Return when a pod waits for `units` (or holds `slot`); else raise the refusal."""
        ctx = self.index.ctx
        if self.index.synced and self.index.suspects.waiting(units, slot):
            return
        try:
            found: list[str] = []
            notes: list[str] = []
            pods: list[dict[str, Any]] = []
            if not self.index.synced:
                found, notes = allocation_candidates(self.api.node_pods(), units, slot, ctx)
            if not found:  # the watch cache may lag behind the binding that made the kubelet admit this pod
                pods = self.api.list_node_pods()
                found, notes = allocation_candidates(pods, units, slot, ctx)
        except ApiServerError as exc:
            raise PluginError(
                "UNAVAILABLE",
                f"the gpushare device plugin could not read node {ctx.node_name}'s pods ({exc}); "
                "check the plugin's API server access (its ServiceAccount and network) and recreate the pod",
            ) from exc
        if found:
            return
        contract = ctx.contract
        unit = contract.unit
        message = (
            f"no pod on node {ctx.node_name} admitted by the gpushare webhook has a container asking for "
            f"exactly {units} {unit} of {contract.resource} that holds no devices yet, so these devices are not "
            f"handed out; check that the gpushare webhook is installed and was running when the pod was created "
            f"(pods need the {contract.intent_key} annotation) and that the scheduler extender is configured "
            f"(pods need {IDX})"
        )
        if notes:
            message += "; pods that came close: " + " | ".join(notes[:3])
        waiting = waiting_pods(pods, units, ctx)
        if len(waiting) != 1:
            raise PluginError("FAILED_PRECONDITION", f"{message} ({len(waiting)} pods on this node wait for {units} "
                              f"{unit}, so the refused one is not known)", "GpuShareNoCandidate")
        refusal = allocate_refusal(waiting[0], units, ctx)
        self.events.refused("Allocate", waiting[0], refusal.reason, refusal.message)
        raise PluginError("FAILED_PRECONDITION", message, refusal.reason, attributed=True)
