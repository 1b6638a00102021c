"""Node-local placement (cdi mode, GPUSHARE_PLACEMENT=node): best fit over what this node's pods hold, one at a time."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from deviceplugin.apiserver import ApiServer
from deviceplugin.inventory import Inventory
from deviceplugin.placement import best_fit, placement_annotations
from deviceplugin.trust import Context, Refusal
from deviceplugin.usage import node_usage
from webhook.protocol import IDX, Intent, pod_ref

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
        node, unit = self.context.node_name, self.context.contract.unit
        with self._lock:
            pods = self.api.list_node_pods()
            used = node_usage(pods, self.context, exclude_uid=uid).used
            unplaced = {p["metadata"].get("uid") for p in pods if IDX not in (p["metadata"].get("annotations") or {})}
            for other, (index, units) in list(self._in_flight.items()):
                if other == uid or other not in unplaced:
                    del self._in_flight[other]  # visible in the listing now, or gone
                else:
                    used[index] = used.get(index, 0) + units
            gpu = best_fit(self.inventory.gpus, used, intent.total, self.inventory.healthy)
            if gpu is None:
                free = ", ".join(f"GPU {g.index}: {g.memory_units - used.get(g.index, 0)}" for g in self.inventory.gpus)
                raise Refusal(
                    f"pod {pod_ref(pod)} needs {intent.total} {unit} on one GPU but no GPU of node {node} has that "
                    f"much room (free {unit}: {free}); delete pods or recreate this one so it lands on another node",
                    reason="GpuShareNoRoom",
                )
            annotations = placement_annotations(gpu, intent, time.time_ns())
            self.api.patch_pod_annotations(meta["namespace"], meta["name"], annotations, meta["resourceVersion"])
            self._in_flight[uid] = (gpu.index, intent.total)
        log.info("placed pod %s on GPU %s of this node (best fit)", pod_ref(pod), gpu.index)
