"""The device plugin identity's writes and Bindings: one table for the webhook's rules and the policies' CEL.

Each plugin case: (case, old pod, new pod, the node its token is bound to, subresource, what the webhook's denial
says or None when it allows, what the policy's says or None). They differ in one row only: a token that names no
node is refused by the policy and allowed by the webhook, which cannot tell an old cluster's token from it.
"""

from __future__ import annotations

import copy
from typing import Any

from contract import ASSIGNED, IDX, Contract
from tests.harness.pods import (
    EXTENDER,
    NODE,
    PLUGIN,
    USER,
    Pod,
    allocated,
    allocation,
    annotate,
    bound,
    container,
    placed,
    pod,
    stamped,
)

OTHER = "gpu-node-2"
INTENT = Contract().intent_key
GPU = stamped(pod(container("a", 2)))
ASSIGNED_POD = annotate(bound(placed(GPU)), {"team": "vision"})
ALLOCATED_POD = allocated(ASSIGNED_POD)
# A kube-system pod the plugin has no business with, on another node and on its own.
SYSTEM = pod(container("coredns"), name="coredns-0", node=OTHER)
SYSTEM_HERE = bound(SYSTEM)
RULE = "but the plugin identity may change only its own annotations"


def edited(p: Pod, path: str, value: Any) -> Pod:
    """`p` with the field at the dot-separated `path` (digits index lists) set to `value`."""
    out = copy.deepcopy(p)
    *parents, last = path.split(".")
    here: Any = out
    for part in parents:
        here = here[int(part)] if part.isdigit() else here.setdefault(part, {})
    here[int(last) if last.isdigit() else last] = value
    return out


PLUGIN_WRITES = [
    ("image of another node's pod", SYSTEM, edited(SYSTEM, "spec.containers.0.image", "evil"), NODE, "",
     f"of node {NODE} changed spec.containers[0].image of a pod bound to node {OTHER}",
     f"of node {NODE} changed spec of a pod bound to node {OTHER}"),
    ("image of a pod on its own node", SYSTEM_HERE, edited(SYSTEM_HERE, "spec.containers.0.image", "evil"), NODE, "",
     f"changed spec.containers[0].image, {RULE}", f"changed spec, {RULE}"),
    ("its allocation record on its own node's pod", ASSIGNED_POD, ALLOCATED_POD, NODE, "", None, None),
    ("its allocation record on another node's pod", bound(ASSIGNED_POD, OTHER),
     allocated(bound(ASSIGNED_POD, OTHER), allocation(node=OTHER)), NODE, "",
     f"of node {NODE} changed {ASSIGNED} of a pod bound to node {OTHER}",
     f"of node {NODE} changed {ASSIGNED} of a pod bound to node {OTHER}"),
    ("a label", ALLOCATED_POD, edited(ALLOCATED_POD, "metadata.labels", {"tier": "gold"}), NODE, "",
     "changed metadata.labels", "changed metadata.labels"),
    ("a finalizer", ALLOCATED_POD, edited(ALLOCATED_POD, "metadata.finalizers", ["example.com/keep"]), NODE, "",
     "changed metadata.finalizers", "changed metadata.finalizers"),
    ("an owner", ALLOCATED_POD, edited(ALLOCATED_POD, "metadata.ownerReferences", [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u-1"}]), NODE, "",
     "changed metadata.ownerReferences", "changed metadata.ownerReferences"),
    ("an annotation removed", ALLOCATED_POD, annotate(ALLOCATED_POD, {"team": None}), NODE, "",
     f"removed annotation team, {RULE}", f"removed annotation team, {RULE}"),
    ("an annotation added", ALLOCATED_POD, annotate(ALLOCATED_POD, {"note": "x"}), NODE, "",
     f"added annotation note, {RULE}", f"added annotation note, {RULE}"),
    ("the intent", ALLOCATED_POD, annotate(ALLOCATED_POD, {INTENT: "{}"}), NODE, "",
     f"Annotation {INTENT} was changed", f"changed annotation {INTENT}"),
    ("the GPU moved", ASSIGNED_POD, annotate(ASSIGNED_POD, {IDX: "0"}), NODE, "",
     f"Annotation {IDX} was changed after the pod was bound", f"changed annotation {IDX}"),
    ("the placement removed", ASSIGNED_POD, annotate(ASSIGNED_POD, {IDX: None}), NODE, "",
     f"Annotation {IDX} was removed after the pod was bound", f"removed annotation {IDX}"),
    ("a placement the pod lacked (node-local)", bound(GPU), allocated(placed(bound(GPU))), NODE, "", None, None),
    ("a token that names no node", ASSIGNED_POD, ALLOCATED_POD, None, "", None, "with a token that names no node"),
    ("a pod not bound yet", placed(GPU), annotate(placed(GPU), {ASSIGNED: "true"}), NODE, "",
     "a pod not bound to any node", "a pod not bound to any node"),
    ("a status update", ASSIGNED_POD, ALLOCATED_POD, NODE, "status",
     "updated pods/status, which it never needs", "updated pods/status, which it never needs"),
    ("a status update that changes nothing", ASSIGNED_POD, ASSIGNED_POD, NODE, "status",
     "updated pods/status", "updated pods/status"),
    ("an ephemeral container", SYSTEM_HERE, edited(SYSTEM_HERE, "spec.ephemeralContainers", [
        {"name": "debug", "image": "busybox"}]), NODE, "ephemeralcontainers",
     "updated pods/ephemeralcontainers", "updated pods/ephemeralcontainers"),
]


def binding(annotations: dict[str, str] | None = None, name: str = "job-0") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}}


SCHEDULER = "system:kube-scheduler"
PLACEMENT = {IDX: "1", "ALIYUN_COM_GPU_MEM_DEV": "16", "ALIYUN_COM_GPU_MEM_POD": "2",
             "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "1700000000000000000", ASSIGNED: "false"}
# (case, Binding, user, what the denial says or None)
BINDINGS = [
    ("the extender's plain Binding", binding(), EXTENDER, None),
    ("the kube-scheduler's Binding", binding(), SCHEDULER, None),
    ("a Binding with unrelated annotations", binding({"note": "x"}), USER, None),
    ("the extender's placement in a Binding", binding(PLACEMENT), EXTENDER, None),
    ("a user's placement", binding({IDX: "0"}), USER,
     f"The Binding carries annotation {IDX}, which the API server would copy onto the pod, but only the scheduler "
     f"extender may place a pod's GPU and {USER} is not it"),
    ("the plugin's allocation record", binding({"gpushare.io/allocation": "{}"}), PLUGIN,
     f"carries annotation gpushare.io/allocation, which the API server would copy onto the pod, but only the "
     f"scheduler extender may place a pod's GPU and {PLUGIN} is not it"),
    ("the scheduler's placement", binding({IDX: "0"}), SCHEDULER, f"{SCHEDULER} is not it"),
    ("an intent from the extender", binding({INTENT: "{}"}), EXTENDER,
     f"carries annotation {INTENT}, which the API server would copy onto the pod"),
    ("ASSIGNED true from the extender", binding({**PLACEMENT, ASSIGNED: "true"}), EXTENDER,
     f"annotation {ASSIGNED}"),
]
