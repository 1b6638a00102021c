"""Compatibility with the reference extender: every annotation write it made in this run that reached the gpushare
validating webhook (its ServiceAccount, from the API server's audit log), listed with the answer it got, and none
refused; its Bindings all allowed. Runs after every other test (conftest), so it judges the whole run's writes, in
both delivery modes, outside the namespaces where the reference stack ran without admission control."""

from __future__ import annotations

import sys

import pytest

from contract import ASSIGNED, ASSUME_TIME, DEV, IDX, POD
from e2e import audit
from e2e.cluster import Cluster
from e2e.control import EXTENDER_USER

pytestmark = pytest.mark.usefixtures("needs_extender")
EXTENDER_KEYS = {IDX, DEV, POD, ASSUME_TIME, ASSIGNED}


def test_extender_writes_are_never_refused_by_the_webhook(cluster: Cluster) -> None:
    writes = audit.read(cluster.audit_log, EXTENDER_USER)
    # The reference stack's own runs (test_reference_stack.py, in scratch namespaces demo-…) have no admission.
    judged = [w for w in writes if w.judged_by_webhook and not w.pod.startswith("demo-")]
    print(f"\nthe extender's writes judged by the validating webhook ({len(judged)}):", file=sys.stderr)
    for write in judged:
        print("  " + write.row(), file=sys.stderr)
    assert len(judged) >= 60, "the scenarios of this run bind well over 60 GPU-share pods"
    assert [w.row() for w in judged if w.verdict != "allowed"] == []
    assert all(w.operation == "UPDATE" and set(w.keys) <= EXTENDER_KEYS for w in judged)
    bindings = [w for w in writes if w.subresource == "binding"]
    assert bindings and all(w.verdict == "allowed" for w in bindings)
