"""The review the webhook benchmarks send: a realistic ~6 KB Deployment pod (two containers, an init container,
15 env vars, volumes, probes, an owner reference and managed fields), as the API server's CREATE review."""

from __future__ import annotations

import json
from typing import Any


def _env(prefix: str, count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": f"{prefix}_{i}", "value": f"value-{i}-" + "x" * 12} for i in range(count)]
    out.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}})
    return out


def _container(name: str, units: int, env: int) -> dict[str, Any]:
    return {
        "name": name, "image": f"registry.example/ml/{name}:2024.11.3", "imagePullPolicy": "IfNotPresent",
        "args": ["--port=8080", "--model=/models/llama", "--max-batch=32"],
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "env": _env(name.upper(), env),
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
    init = _container("fetch-model", 2, 2)
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
            "containers": [_container("server", 4, 7), _container("sidecar", 2, 4)],
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


def create_review(pod: dict[str, Any], uid: str = "7b1e0c4a-3f2d-4e5b-8a9c-0d1e2f3a4b5c") -> bytes:
    request = {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": pod["metadata"]["namespace"], "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                     "uid": "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
                     "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system",
                                "system:authenticated"]},
        "object": pod, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()
