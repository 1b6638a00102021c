"""The Events the DRA driver records about its node (core/v1, pure: the body, not the request)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from contract.keys import DRA_DRIVER

# Node Events live in the default namespace, as the kubelet's do (a Node has no namespace of its own), so
# `kubectl describe node` lists them.
NAMESPACE = "default"
COMPONENT = "gpushare-dra-plugin"
CAPACITY_OFF = "DRAConsumableCapacityOff"


def node_event(node: str, uid: str, reason: str, message: str, now: datetime) -> dict[str, Any]:
    """A Warning Event about Node `node` (its metadata.uid `uid`), named from the node (generateName)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node}.", "namespace": NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid},
        "reason": reason,
        "message": message,
        "type": "Warning",
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": f"{DRA_DRIVER}/{COMPONENT}",
        "reportingInstance": node,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
