"""What PreStartContainer keeps once a container may start: the allocation record on the pod (a patch that holds
only while the pod is unchanged), the pod's pin in the node index, and the Normal Event; and the pins rebuilt from
those records after the plugin (re)starts."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from deviceplugin.apiserver import ApiServer
from deviceplugin.events import EventRecorder
from deviceplugin.evidence import LegacyAccepted
from deviceplugin.judge import Accepted
from deviceplugin.nodeindex import NodeIndex
from deviceplugin.pins import Pin
from deviceplugin.usage import recorded_pin
from node.apiclient import ApiServerError

log = logging.getLogger(__name__)


class Records:
    def __init__(self, api: ApiServer, index: NodeIndex, events: EventRecorder) -> None:
        self.api = api
        self.index = index
        self.events = events

    def keep(self, pod: Mapping[str, Any], verdict: Accepted | LegacyAccepted) -> None:
        """Record the allocation (raises Conflict when the pod changed since it was read), then pin the pod; a pod of
        the previous device plugin is only pinned: nothing is written on it."""
        if isinstance(verdict, Accepted) and verdict.patch:
            meta = pod["metadata"]
            self.api.patch_pod_annotations(meta["namespace"], meta["name"], verdict.patch, meta["resourceVersion"])
            ctx = self.index.ctx
            unit = ctx.contract.unit
            containers = ", ".join(f"{n!r} ({s.units} {unit})" for n, s in verdict.allocation.containers.items())
            self.events.allocated(pod, f"Pod {verdict.ref} runs on GPU {verdict.gpu.index} ({verdict.gpu.uuid}) of "
                                       f"node {ctx.node_name}: containers {containers}.")
        intent = verdict.intent if isinstance(verdict, Accepted) else None
        self.index.record(str(pod["metadata"].get("uid")), Pin(verdict.gpu.index, verdict.gpu.uuid), intent)

    def remember_pins(self) -> None:
        """Pin the pods this node's plugin allocated before it (re)started, from their allocation records, and
        forget the pins of pods that are gone; at start and with every garbage collection."""
        try:
            pods = self.api.list_node_pods()
        except ApiServerError as exc:
            log.info("pins not refreshed (each pod is pinned at its next container start): %s", exc)
            return
        for pod in pods:
            pin = recorded_pin(pod, self.index.ctx)
            if pin is not None:
                self.index.pin(str(pod["metadata"].get("uid")), pin)
        self.index.keep_pins({str((p.get("metadata") or {}).get("uid")) for p in pods})
