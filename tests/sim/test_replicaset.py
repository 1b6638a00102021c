"""The ReplicaSet stand-in keeps its group at size as the real controller does: a creation that met a server error
is tried again; a template admission refuses is not, and the refusal is kept for the test to read."""

from __future__ import annotations

import threading
from typing import Any

from tests.harness.apiserver.ports import ApiError, MemoryClient, MemoryStore, Pod
from tests.harness.sim.replicaset import RS_USER, ReplicaSet

TEMPLATE: Pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": {"containers": [{"name": "main"}]}}


class Failing(MemoryClient):
    """Creation fails with `code` for the first `failures` calls."""

    def __init__(self, store: MemoryStore, code: int, failures: int) -> None:
        super().__init__(store, RS_USER)
        self.code, self.failures = code, failures
        self._lock = threading.Lock()  # the group creates from several threads

    def create_pod(self, namespace: str, pod: Pod) -> Pod:
        with self._lock:
            fail = self.failures > 0
            self.failures -= fail
        if fail:
            raise ApiError(self.code, f"failed calling webhook: HTTP {self.code}")
        return super().create_pod(namespace, pod)


def _run(api: Any, replicas: int) -> ReplicaSet:
    group = ReplicaSet(api, "team", "web", replicas, TEMPLATE, creators=2)
    group.start()
    pause = threading.Event()  # never set: a bounded wait for the group's threads
    for _ in range(300):
        if group.settled():
            break
        pause.wait(0.05)
    group.close()
    return group


def test_a_creation_that_met_a_server_error_is_tried_again() -> None:
    group = _run(Failing(MemoryStore(), 500, 3), 4)
    assert len(group.active()) == 4 and group.errors == []
    assert group.retried == ["failed calling webhook: HTTP 500"] * 3


def test_a_refused_template_is_not_tried_again() -> None:
    group = _run(Failing(MemoryStore(), 403, 10), 4)
    assert group.active() == [] and group.retried == []
    assert len(group.errors) == 4 and all("HTTP 403" in e for e in group.errors)
