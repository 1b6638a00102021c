"""Which Events `kubectl gpushare` believes, and what they may say (pure).

An Event proves nothing about who wrote it: whoever may create Events in a namespace (the edit and admin roles, most
controllers) writes any source, reason, message and time into one. What no client sets is the API server's
creationTimestamp. So the pod's state comes from its annotations and its status, never from an Event; an Event that
may be the device plugin's (`believed`) only words the reason of a refusal the kubelet recorded.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from contract import ASSUME_TIME, ProtocolError, int_annotation, read_annotations

Obj = Mapping[str, Any]

# The Events our device plugin posts carry this component (deviceplugin/apiserver.py COMPONENT).
PLUGIN_COMPONENT: Final = "gpushare-device-plugin"
ALLOCATED_REASON: Final = "GpuShareAllocated"
# How far an Event's own time may run ahead of the clock that judges it (the API server's when it stored the Event,
# this machine's now), or before the pod was created or placed: the clocks of nodes and of this machine drift a little.
CLOCK_SKEW: Final = datetime.timedelta(minutes=2)


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def _time(value: object) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, OverflowError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.UTC)


def _timestamp(event: Obj) -> datetime.datetime | None:
    """When an Event says it last happened; core/v1 Events carry lastTimestamp, events.k8s.io ones eventTime."""
    for value in (event.get("lastTimestamp"), event.get("eventTime"), event.get("firstTimestamp")):
        when = _time(value)
        if when is not None:
            return when
    return None


def _placed_at(pod: Obj) -> datetime.datetime | None:
    """The later of the pod's creation (set by the API server) and its placement (ASSUME_TIME, unix ns)."""
    created = _time(_meta(pod).get("creationTimestamp"))
    try:
        nanos = int_annotation(read_annotations(pod), ASSUME_TIME)
        placed = None if nanos is None else datetime.datetime.fromtimestamp(nanos / 1e9, datetime.UTC)
    except (ProtocolError, ValueError, OverflowError, OSError):
        placed = None
    return max((t for t in (created, placed) if t is not None), default=None)


def _involved(event: Obj) -> Obj:
    involved: Obj = event.get("involvedObject") or event.get("regarding") or {}
    return involved


def _ours(event: Obj) -> bool:
    """An Event that says our device plugin posted it about a pod: every component it names (core/v1 `source`,
    events.k8s.io's reporting fields; the plugin sets both) is the plugin."""
    named = {c for c in ((event.get("source") or {}).get("component"), event.get("reportingComponent"),
                         event.get("reportingController")) if c}
    return named == {PLUGIN_COMPONENT} and _involved(event).get("kind") == "Pod"


def believed(event: Obj, pod: Obj, now: datetime.datetime) -> bool:
    """Whether an Event may be our device plugin's about this pod: it names the plugin as its source, the pod's uid,
    and the pod's node as its host (the plugin names its own node, and the gpushare-device-plugin-events policy holds
    the plugin's identity to it); and its own time is not after the API server stored it (creationTimestamp, which no
    client sets) nor after now, nor before the pod was created or placed, each give or take CLOCK_SKEW.

    Anyone who may create Events in the namespace can still write one that passes: a believed Event words the reason
    of a refusal the pod's status shows, and changes no state."""
    meta = _meta(pod)
    uid, node = meta.get("uid"), (pod.get("spec") or {}).get("nodeName")
    source = event.get("source") or {}
    hosts = {h for h in (source.get("host"), event.get("reportingInstance")) if h}
    claimed = _timestamp(event)
    if not (_ours(event) and uid and _involved(event).get("uid") == uid and node and hosts == {node}
            and claimed is not None):
        return False
    stored = _time(_meta(event).get("creationTimestamp"))
    start = _placed_at(pod)
    # Differences, not sums: a date near the end of the calendar plus CLOCK_SKEW would overflow.
    return (claimed - now <= CLOCK_SKEW and (stored is None or claimed - stored <= CLOCK_SKEW)
            and (start is None or start - claimed <= CLOCK_SKEW))


def by_pod(events: Iterable[Obj]) -> dict[str, list[Obj]]:
    """Our device plugin's Events, by the uid of the pod they are about."""
    out: dict[str, list[Obj]] = {}
    for event in events:
        uid = _involved(event).get("uid")
        if uid and _ours(event):
            out.setdefault(str(uid), []).append(event)
    return out


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def plugin_refusal(pod: Obj, events: Sequence[Obj], now: datetime.datetime) -> str:
    """'Reason: message' of our plugin's latest believed Warning about the pod with no believed allocation after it;
    '' when there is none."""
    dated = [(when, e) for e in events if believed(e, pod, now) and (when := _timestamp(e)) is not None]
    latest_allocation = max((when for when, e in dated if e.get("reason") == ALLOCATED_REASON), default=None)
    warnings = sorted(((when, e) for when, e in dated if e.get("type") == "Warning"
                       and (latest_allocation is None or when > latest_allocation)), key=lambda pair: pair[0])
    if not warnings:
        return ""
    latest = warnings[-1][1]
    return _one_line(f"{latest.get('reason', '')}: {latest.get('message', '')}")
