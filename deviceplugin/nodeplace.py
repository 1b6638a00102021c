"""Node-local placement (cdi mode, GPUSHARE_PLACEMENT=node): best fit over what this node's pods hold, one at a time."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from contract import IDX, Intent, pod_ref
from deviceplugin.apiserver import ApiServer
from deviceplugin.placement import choose_gpu, placement_annotations
from deviceplugin.trust import Context
from deviceplugin.usage import node_usage
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
            gpu = choose_gpu(self.inventory, used, usage.holders, need=intent.total, who=f"pod {pod_ref(pod)}",
                             ctx=self.context)
            annotations = placement_annotations(gpu, intent, time.time_ns())
            self.api.patch_pod_annotations(meta["namespace"], meta["name"], annotations, meta["resourceVersion"])
            self._in_flight[uid] = (gpu.index, intent.total)
        log.info("placed pod %s on GPU %s of this node (best fit)", pod_ref(pod), gpu.index)
