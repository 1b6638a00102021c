"""Table tests for whether a pod still holds its GPU memory: finished pods never, pods being deleted only while a
GPU-share container may still run (shown running, or delivered and not shown terminated)."""

from __future__ import annotations

from typing import Any

import pytest

from contract.holding import container_states, holds_memory, still_running

GPU = ("prep", "main")  # the pod's GPU-share containers: an init container and an app container


def status(phase: str = "Pending", **states: str) -> dict[str, Any]:
    """Container name -> its state; `prep` is an init container."""
    def item(name: str, state: str) -> dict[str, Any]:
        return {"name": name, "state": {state: {}}}

    out: dict[str, Any] = {"phase": phase}
    inits = [item(n, s) for n, s in states.items() if n == "prep"]
    apps = [item(n, s) for n, s in states.items() if n != "prep"]
    if inits:
        out["initContainerStatuses"] = inits
    if apps:
        out["containerStatuses"] = apps
    return out


def pod(deleting: bool, **status_fields: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "team"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-02T03:04:05Z"
    return {"metadata": meta, "spec": {}, "status": status_fields}


@pytest.mark.parametrize(("case", "deleting", "fields", "delivered", "running", "holds"), [
    ("pulling its image", False, status(), (), [], True),
    ("running", False, status("Running", prep="terminated", main="running"), ("prep", "main"), ["main"], True),
    ("finished", False, status("Succeeded", main="terminated"), ("main",), [], False),
    ("failed at admission", False, status("Failed"), (), [], False),
    ("deleted while its image pulls", True, status(), (), [], False),
    ("deleted while its init container waits", True, status(prep="waiting"), (), [], False),
    ("deleted while it runs", True, status("Running", main="running"), ("main",), ["main"], True),
    ("deleted, running though not delivered here", True, status("Running", main="running"), (), ["main"], True),
    ("deleted, delivered, status not written yet", True, status(), ("main",), ["main"], True),
    ("deleted, delivered, still being created", True, status(main="waiting"), ("main",), ["main"], True),
    ("deleted, its container stopped", True, status("Running", main="terminated"), ("main",), [], False),
    ("deleted after its init container, app not started", True, status(prep="terminated", main="waiting"),
     ("prep",), [], False),
    ("deleted, init container running", True, status(prep="running"), ("prep",), ["prep"], True),
    ("deleted and finished", True, status("Succeeded", main="running"), ("main",), ["main"], False),
])
def test_a_pod_holds_its_memory_only_while_it_may_run(
    case: str, deleting: bool, fields: dict[str, Any], delivered: tuple[str, ...], running: list[str], holds: bool
) -> None:
    p = pod(deleting, **fields)
    assert still_running(p, GPU, delivered) == running
    assert holds_memory(p, GPU, delivered) is holds


def test_container_states_read_the_current_state_only() -> None:
    p = pod(True, phase="Running", containerStatuses=[
        {"name": "main", "state": {"running": {"startedAt": "t"}}, "lastState": {"terminated": {"exitCode": 1}}},
        {"name": "side", "state": {}},
        "not a status",
    ])
    assert container_states(p) == {"main": "running"}
