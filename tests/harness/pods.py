"""The one home of pod builders: pods as the webhook, the device plugin, the kubectl plugin and the policy cases
see them (stamped by the real mutation, placed as the scheduler extender places them, allocated as the plugin
records it), the benchmarks' pods (a realistic 6 KB Deployment pod, many small GPU-share pods), and AdmissionReviews
around them. The real-cluster tier's workloads (tests/harness/realtier/workloads.py)
are pods a real kubelet runs, with images and commands: they stay there."""

from __future__ import annotations

import copy
import itertools
import json
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
REPLICASET_CONTROLLER = "system:serviceaccount:kube-system:replicaset-controller"
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


def shaped_pod(containers: tuple[int, ...], init: tuple[int, ...] = (), *, sidecar: bool = False,
               zero_limit: bool = False, name: str = "", generate_name: str = "", image: str = "cuda") -> Pod:
    """A scenario's pod (tests/harness/scenarios.py PodShape): app containers app0, app1, ... and init containers
    init0, ... with these units (0: no GPU memory, said with a limit of "0" when `zero_limit`); `sidecar` makes the
    first init container restartable."""
    def one(prefix: str, i: int, units: int) -> dict[str, Any]:
        out: dict[str, Any] = {"name": f"{prefix}{i}", "image": image}
        if units or zero_limit:
            out["resources"] = {"limits": {RES: str(units)}}
        return out

    meta: dict[str, Any] = {"name": name} if name else {"generateName": generate_name}
    spec: dict[str, Any] = {"containers": [one("app", i, u) for i, u in enumerate(containers)]}
    if init:
        spec["initContainers"] = [one("init", i, u) for i, u in enumerate(init)]
        if sidecar:
            spec["initContainers"][0]["restartPolicy"] = "Always"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


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


def inference_pod(i: int) -> Pod:
    """The admission benchmark's pod: three GPU-share containers and a GPU-share init container."""
    containers = [container(f"c{j}", str(2 + j), env=[{"name": "MODEL", "value": "m"}]) for j in range(3)]
    fetch = container("fetch", "4")
    fetch["image"] = "busybox"
    out = pod(*containers, inits=[fetch], name=None)
    out["metadata"].update(generateName=f"infer-{i}-", labels={"app": "infer"})
    return out


def _bench_env(prefix: str, count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": f"{prefix}_{i}", "value": f"value-{i}-" + "x" * 12} for i in range(count)]
    out.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}})
    return out


def _bench_container(name: str, units: int, env: int) -> dict[str, Any]:
    return {
        "name": name, "image": f"registry.example/ml/{name}:2024.11.3", "imagePullPolicy": "IfNotPresent",
        "args": ["--port=8080", "--model=/models/llama", "--max-batch=32"],
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "env": _bench_env(name.upper(), env),
        "resources": {"limits": {"aliyun.com/gpu-mem": str(units), "cpu": "2", "memory": "8Gi"},
                      "requests": {"aliyun.com/gpu-mem": str(units), "cpu": "1", "memory": "4Gi"}},
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True},
                         {"name": "kube-api-access-x7k2p", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                          "readOnly": True}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"}, "periodSeconds": 5,
                           "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3},
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
    }


def deployment_pod(namespace: str = "ml") -> dict[str, Any]:
    init = _bench_container("fetch-model", 2, 2)
    init["args"] = ["sync", "s3://models/llama", "/models"]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "infer-7d9f8b6c5d-", "namespace": namespace,
            "labels": {"app": "infer", "pod-template-hash": "7d9f8b6c5d", "team": "ml-platform"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-30T10:00:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "infer-7d9f8b6c5d",
                                 "uid": "5f0c2a6e-1b7d-4c39-9a1e-2f3b4c5d6e7f", "controller": True,
                                 "blockOwnerDeletion": True}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                               "time": "2026-11-30T10:00:01Z", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}},
                                            "f:spec": {"f:containers": {'k:{"name":"server"}': {".": {}}}}}}],
        },
        "spec": {
            "initContainers": [init],
            "containers": [_bench_container("server", 4, 7), _bench_container("sidecar", 2, 4)],
            "volumes": [{"name": "models", "emptyDir": {}},
                        {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        ]}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "schedulerName": "default-scheduler", "priority": 0,
            "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
            "securityContext": {}, "nodeSelector": {"gpu": "shared"},
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}],
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def create_review(pod: Pod, uid: str = "7b1e0c4a-3f2d-4e5b-8a9c-0d1e2f3a4b5c") -> bytes:
    """The CREATE review the API server sends for a ReplicaSet's pod, every field it fills, as bytes."""
    doc = review("CREATE", pod, user=REPLICASET_CONTROLLER, uid=uid, namespace=pod["metadata"]["namespace"])
    request = doc["request"]
    request.update(requestKind=request["kind"], requestResource=request["resource"],
                   options={"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"})
    request["userInfo"].update(uid="0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
                               groups=["system:serviceaccounts", "system:serviceaccounts:kube-system",
                                       "system:authenticated"])
    return json.dumps(doc).encode()
