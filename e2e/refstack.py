"""Switch the running tier between the reference stack and ours, on the same node, kubelet and extender stand-in.

The reference stack, as its own deployment has it: the scheduler extender and the reference device plugin, and no
admission control of GPU-share pods (the reference has none: its plugin trusts whatever annotations a pod carries).
So `use_reference()` stops our device plugin, takes the gpushare webhook configurations and admission-policy
bindings out of the API server (a snapshot is kept, caBundle included), and starts e2e.reference_plugin with the
reference plugin's ServiceAccount and RBAC. Our webhook stays out of that run on purpose: in env delivery its
downward-API NVIDIA_VISIBLE_DEVICES would override the variable the reference plugin answers (the pod spec's env
wins over a device plugin's), and its validating rules would refuse the reference plugin's ASSIGNED patch (an
identity it does not trust), so the run would no longer show what the reference stack does.
`use_ours(delivery)` stops the reference plugin, restores the admission objects and starts our webhook and plugin.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from e2e import gpushare
from e2e import settings as ports
from e2e.cluster import REPO, Cluster, _has_capacity
from e2e.procs import StartError

REFERENCE_PLUGIN_SA = ("kube-system", "gpushare-device-plugin")
ADMISSION_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                   "ValidatingAdmissionPolicyBinding")
_VOLATILE = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields")

# The reference plugin's RBAC (its device-plugin-rbac.yaml: nodes and nodes/proxy read, events, pods read and
# update/patch, nodes/status patch/update), for its ServiceAccount kube-system/gpushare-device-plugin. The
# ClusterRole and its binding are renamed here: the reference calls them gpushare-device-plugin, the name our
# manifests give our plugin's ClusterRole, and both stacks live in one cluster in this tier.
REFERENCE_PLUGIN_RBAC = f"""apiVersion: v1
kind: ServiceAccount
metadata:
  name: {REFERENCE_PLUGIN_SA[1]}
  namespace: {REFERENCE_PLUGIN_SA[0]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: gpushare-device-plugin-reference
rules:
  - apiGroups: [""]
    resources: ["nodes", "nodes/proxy"]
    verbs: ["get", "list", "watch"]
  - apiGroups: [""]
    resources: ["events"]
    verbs: ["create", "patch"]
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get", "list", "watch", "update", "patch"]
  - apiGroups: [""]
    resources: ["nodes/status"]
    verbs: ["patch", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: gpushare-device-plugin-reference
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: gpushare-device-plugin-reference
subjects:
  - kind: ServiceAccount
    name: {REFERENCE_PLUGIN_SA[1]}
    namespace: {REFERENCE_PLUGIN_SA[0]}
"""

# A pod that only gpushare's admission refuses (a reserved annotation set by a user): the probe that tells whether
# the API server has picked up the admission objects' removal or return (it caches them and updates asynchronously).
_PROBE = {"apiVersion": "v1", "kind": "Pod",
          "metadata": {"name": "gpushare-admission-probe", "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "0"}},
          "spec": {"containers": [{"name": "c", "image": "probe", "resources": {"limits": {
              "aliyun.com/gpu-mem": "1"}}}]}}


class Stacks:
    """Which stack the tier runs now: "ours" (as `Cluster.up` leaves it) or "reference"."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.current = "ours"
        self._snapshot: list[dict[str, Any]] = []

    def _admission_objects(self) -> list[tuple[str, str]]:
        return [(d["kind"], d["metadata"]["name"]) for d in self.cluster.docs if d.get("kind") in ADMISSION_KINDS]

    def _admission_refuses(self) -> bool:
        code, _, _ = self.cluster.kubectl().run(["create", "-n", "default", "--dry-run=server", "-f", "-"],
                                                stdin=json.dumps(_PROBE), timeout=20)
        return code != 0

    def _wait_admission(self, refusing: bool) -> None:
        deadline = time.monotonic() + 60
        while self._admission_refuses() != refusing:
            if time.monotonic() > deadline:
                state = "refuse" if refusing else "stop refusing"
                raise StartError(f"the API server did not {state} a reserved annotation within 60 s after the "
                                 "gpushare admission objects changed")
            time.sleep(0.5)

    def use_reference(self) -> None:
        if self.current == "reference":
            return
        cluster, kubectl = self.cluster, self.cluster.kubectl()
        cluster.procs.stop("device-plugin")
        snapshot = []
        for kind, name in self._admission_objects():
            obj = kubectl.json(["get", kind, name])
            for key in _VOLATILE:
                obj["metadata"].pop(key, None)
            snapshot.append(obj)
            kubectl.ok(["delete", kind, name])
        self._snapshot = snapshot
        self._wait_admission(refusing=False)
        kubectl.ok(["apply", "-f", "-"], stdin=REFERENCE_PLUGIN_RBAC)
        token_file = cluster.conf / "reference-plugin.token"
        token_file.write_text(gpushare.token(kubectl, *REFERENCE_PLUGIN_SA))
        s = cluster.settings
        log = cluster.log("reference-plugin")
        offset = log.stat().st_size if log.exists() else 0
        cluster.procs.start("reference-plugin", [
            sys.executable, "-m", "e2e.reference_plugin", "--node", s.node_name, "--fake-gpus", s.fake_gpus,
            "--server", f"https://127.0.0.1:{s.port(ports.API_SERVER)}", "--ca", str(cluster.pki_dir / "ca.crt"),
            "--token-file", str(token_file)], cwd=REPO)
        cluster.procs.wait_ready("reference-plugin", lambda: b"registered" in log.read_bytes()[offset:], 60,
                                 "registered with the kubelet")
        cluster.procs.wait_ready("reference-plugin", lambda: _has_capacity(kubectl, s.node_name), 60,
                                 "the node advertising aliyun.com/gpu-mem")
        self.current = "reference"

    def use_ours(self, delivery: str) -> None:
        cluster = self.cluster
        if self.current == "reference":
            cluster.procs.stop("reference-plugin")
            kubectl = cluster.kubectl()
            for obj in self._snapshot:
                kubectl.ok(["create", "-f", "-"], stdin=json.dumps(obj))
            self._wait_admission(refusing=True)
            self.current = "ours"
            cluster.use_delivery(delivery)  # restarts the webhook and starts our plugin again
        elif cluster.delivery != delivery:
            cluster.use_delivery(delivery)
