"""Whether a pod still holds the GPU memory promised to it (pure; the device plugin and kubectl gpushare agree).

The gpushare scheduler extender frees a pod's memory as soon as the pod has a deletionTimestamp, or is Succeeded or
Failed (gpushare-scheduler-extender pkg/utils/pod.go, IsCompletePod), and places the next pod on that GPU at once,
while the deleted pod may still pull its image for minutes. So a pod being deleted holds its memory only while one
of its GPU-share containers may still run: its status shows it running, or the device plugin delivered it (the
allocation record lists it) and the status does not show it terminated yet (the status lags the start). A pod being
deleted that never started a GPU-share container holds nothing; a finished pod holds nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

TERMINAL_PHASES = ("Succeeded", "Failed")


def finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def terminating(pod: Mapping[str, Any]) -> bool:
    """The pod has a deletionTimestamp: it is being deleted (its containers stop within the grace period)."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def container_states(pod: Mapping[str, Any]) -> dict[str, str]:
    """Container name -> the state its status shows now: running, terminated or waiting (absent: no status yet)."""
    status = pod.get("status") or {}
    out: dict[str, str] = {}
    for item in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        if not isinstance(item, Mapping):
            continue
        state = item.get("state") or {}
        for name in ("running", "terminated", "waiting"):
            if isinstance(state, Mapping) and state.get(name) is not None:
                out[str(item.get("name"))] = name
                break
    return out


def still_running(pod: Mapping[str, Any], containers: Iterable[str], delivered: Collection[str]) -> list[str]:
    """Those of `containers` (the pod's GPU-share containers) that may be running: their status shows them running,
    or they were delivered and their status does not show them terminated yet."""
    states = container_states(pod)
    return [name for name in containers
            if states.get(name) == "running" or (name in delivered and states.get(name) != "terminated")]


def holds_memory(pod: Mapping[str, Any], containers: Iterable[str], delivered: Collection[str]) -> bool:
    """Whether the pod still holds its GPU memory: not finished, and not being deleted unless a GPU-share container
    of it may still run (see the module's docstring)."""
    if finished(pod):
        return False
    return not terminating(pod) or bool(still_running(pod, containers, delivered))
