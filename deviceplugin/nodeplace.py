"""Node-local placement (cdi mode, GPUSHARE_PLACEMENT=node): best fit over what this node's pods hold, one at a time."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from contract import IDX, Intent, pod_ref
from deviceplugin.apiserver import ApiServer
from deviceplugin.errors import Refusal
from deviceplugin.placement import best_fit, placement_annotations
from deviceplugin.trust import Context
from deviceplugin.usage import Holder, node_usage
from node.inventory import Inventory

log = logging.getLogger(__name__)


class NodePlacer:
    def __init__(self, api: ApiServer, inventory: Inventory, context: Context) -> None:
        self.api = api
        self.inventory = inventory
        self.context = context
        self._lock = threading.Lock()
        self._in_flight: dict[str, tuple[int, int]] = {}  # pod uid -> (GPU index, units) placed here

    def place(self, pod: Mapping[str, Any], intent: Intent) -> None:
        """Write IDX, DEV, POD, ASSUME_TIME and ASSIGNED=false for the best-fitting GPU, or refuse."""
        meta = pod["metadata"]
        uid = str(meta.get("uid"))
        with self._lock:
            pods = self.api.list_node_pods()
            usage = node_usage(pods, self.context, exclude_uid=uid)
            used = dict(usage.used)
            unplaced = {p["metadata"].get("uid") for p in pods if IDX not in (p["metadata"].get("annotations") or {})}
            for other, (index, units) in list(self._in_flight.items()):
                if other == uid or other not in unplaced:
                    del self._in_flight[other]  # visible in the listing now, or gone
                else:
                    used[index] = used.get(index, 0) + units
            gpu = best_fit(self.inventory.gpus, used, intent.total, self.inventory.healthy)
            if gpu is None:
                raise self._no_room(pod, intent, used, usage.holders)
            annotations = placement_annotations(gpu, intent, time.time_ns())
            self.api.patch_pod_annotations(meta["namespace"], meta["name"], annotations, meta["resourceVersion"])
            self._in_flight[uid] = (gpu.index, intent.total)
        log.info("placed pod %s on GPU %s of this node (best fit)", pod_ref(pod), gpu.index)

    def _no_room(self, pod: Mapping[str, Any], intent: Intent, used: Mapping[int, int],
                 holders: Mapping[int, list[Holder]]) -> Refusal:
        """No GPU has room: the refusal says whether one will once the pods being deleted there have stopped."""
        node, unit = self.context.node_name, self.context.contract.unit
        free = ", ".join(f"GPU {g.index}: {g.memory_units - used.get(g.index, 0)}" for g in self.inventory.gpus)
        head = f"pod {pod_ref(pod)} needs {intent.total} {unit} on one GPU but no GPU of node {node} has that much room"
        staying = {**used}
        for index, held in holders.items():
            staying[index] = staying.get(index, 0) - sum(h.units for h in held if h.leaving)
        later = best_fit(self.inventory.gpus, staying, intent.total, self.inventory.healthy)
        if later is not None:
            leaving = [str(h) for h in holders.get(later.index, []) if h.leaving]
            several = len(leaving) > 1
            return Refusal(
                f"{head} now (free {unit}: {free}); GPU {later.index} will once {', '.join(leaving[:5])}, being "
                f"deleted, {'have' if several else 'has'} stopped (within {'their' if several else 'its'} termination "
                "grace period): the container is not started yet and the kubelet retries the start by itself, so "
                "there is nothing to do",
                reason="GpuShareNoRoom",
            )
        return Refusal(f"{head} (free {unit}: {free}); delete pods or recreate this one so it lands on another node",
                       reason="GpuShareNoRoom")
