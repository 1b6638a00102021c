"""The one home of pod builders: pods as the webhook, the device plugin, the kubectl plugin and the policy cases
see them (stamped by the real mutation, placed as the scheduler extender places them, allocated as the plugin
records it), and AdmissionReviews around them. The real-cluster tier's workloads (tests/harness/realtier/workloads.py)
are pods a real kubelet runs, with images and commands: they stay there."""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import jsonpatch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from contract import (
    ASSIGNED,
    ASSUME_TIME,
    DEFAULT_RESOURCE,
    DEV,
    IDX,
    POD,
    Allocation,
    Assignment,
    ContainerSlot,
    Contract,
    demand_of,
)
from webhook.rules.mutate import mutate

RES = DEFAULT_RESOURCE
NS = "ml"
KEY = Ed25519PrivateKey.generate()
OTHER_KEY = Ed25519PrivateKey.generate()
EXTENDER = "system:serviceaccount:kube-system:gpushare-schd-extender"
PLUGIN = "system:serviceaccount:gpushare-system:gpushare-device-plugin"
USER = "alice"
NODE = "gpu-node-1"
ALLOCATION = Contract().allocation_key

Pod = dict[str, Any]


def container(name: str, units: object = None, *, env: list[dict[str, Any]] | None = None,
              restart: str | None = None, volumeMounts: list[dict[str, Any]] | None = None,
              ) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "cuda:12"}
    if volumeMounts is not None:
        c["volumeMounts"] = volumeMounts
    if units is not None:
        c["resources"] = {"limits": {RES: units}}
    if env is not None:
        c["env"] = env
    if restart:
        c["restartPolicy"] = restart
    return c


def pod(*containers: dict[str, Any], inits: list[dict[str, Any]] | None = None,
        annotations: Mapping[str, str] | None = None, name: str | None = "job-0", node: str | None = None) -> Pod:
    meta: dict[str, Any] = {"namespace": NS}
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = "job-"
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    spec: dict[str, Any] = {"containers": list(containers)}
    if inits is not None:
        spec["initContainers"] = inits
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def unit_pod(name: str, containers: Mapping[str, int], init: Mapping[str, int] | None = None, *,
             namespace: str | None = "team", sidecars: tuple[str, ...] = (), image: str = "cuda") -> Pod:
    """A pod whose containers ask for the given units of GPU memory (none for 0); `sidecars` names the init
    containers that are restartable (restartPolicy: Always); no `namespace`: the one the request names."""
    def one(cname: str, units: int) -> dict[str, Any]:
        out = container(cname, str(units) if units else None, restart="Always" if cname in sidecars else None)
        out["image"] = image
        return out

    spec: dict[str, Any] = {"containers": [one(c, u) for c, u in containers.items()]}
    if init:
        spec["initContainers"] = [one(c, u) for c, u in init.items()]
    metadata = {"name": name, **({"namespace": namespace} if namespace is not None else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def counter(prefix: str = "alloc") -> Callable[[], str]:
    numbers = itertools.count(1)
    return lambda: f"{prefix}-{next(numbers)}"


def stamped(p: Pod, contract: Contract | None = None, *, key: Ed25519PrivateKey = KEY, namespace: str = NS,
            ids: Callable[[], str] | None = None) -> Pod:
    """The pod as the mutating webhook leaves it (allocation ids alloc-1, alloc-2, ... per call unless `ids`)."""
    ops = mutate(p, namespace, contract or Contract(), key, ids or counter())
    out: Pod = jsonpatch.apply_patch(copy.deepcopy(p), ops)
    return out


def admitted(p: Pod, contract: Contract, key: Ed25519PrivateKey) -> Pod:
    """The pod as the real mutating webhook admits it in its own namespace, with an allocation id of its own."""
    return stamped(p, contract, key=key, namespace=p["metadata"]["namespace"], ids=lambda: str(uuid.uuid4()))


def assigned(p: Pod, index: int, device_units: int, total: int | None = None) -> Pod:
    """What the scheduler extender writes at bind time (the pod's whole demand unless `total`)."""
    out = copy.deepcopy(p)
    annotations = out["metadata"].setdefault("annotations", {})
    pod_units = total if total is not None else demand_of(p, RES).total
    annotations.update(Assignment(index, device_units, pod_units, 1_700_000_000_000_000_000, False).annotations())
    return out


def annotate(p: Pod, changes: Mapping[str, str | None]) -> Pod:
    out = copy.deepcopy(p)
    annotations = out["metadata"].setdefault("annotations", {})
    for key, value in changes.items():
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value
    return out


def bound(p: Pod, node: str = NODE) -> Pod:
    out = copy.deepcopy(p)
    out["spec"]["nodeName"] = node
    return out


def placed(p: Pod, index: str = "1", dev: str = "16", total: str = "2") -> Pod:
    return annotate(p, {IDX: index, DEV: dev, POD: total, ASSUME_TIME: "1700000000000000000", ASSIGNED: "false"})


def allocation(allocation_id: str = "alloc-1", node: str = NODE, gpu: int = 1, units: int = 2) -> str:
    return Allocation(allocation_id, node, gpu, "GPU-0000", {"a": ContainerSlot(units, "slot-a")}).to_json()


def allocated(p: Pod, record: str | None = None) -> Pod:
    return annotate(p, {ASSIGNED: "true", ALLOCATION: record or allocation()})


def review(operation: str, obj: Pod, old: Pod | None = None, *, user: str = USER, uid: str = "uid-1",
           namespace: str = NS) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
