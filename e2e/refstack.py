"""Switch the running tier between the reference stack and ours, on the same node, kubelet and reference extender.

The reference stack, as its own deployment has it: the reference scheduler extender (the tier's extender for every
run, e2e.extender) and the reference device plugin, built from its sources (e2e.toolchain), and no admission control
of GPU-share pods (the reference has none: its plugin trusts whatever annotations a pod carries).
So `use_reference()` stops our device plugin, takes the gpushare webhook configurations and admission-policy
bindings out of the API server (a snapshot is kept, caBundle included), and starts the reference plugin with its
own ServiceAccount and RBAC (its device-plugin-rbac.yaml) and its DaemonSet's flags (device-plugin-ds.yaml), reading
the GPUs through NVML from the fake library with minor numbers equal to the indexes (it names a GPU's device node
`/dev/nvidia<minor>` and maps index to GPU by it). Our webhook stays out of that run on purpose: in env delivery its
downward-API NVIDIA_VISIBLE_DEVICES would override the variable the reference plugin answers (the pod spec's env
wins over a device plugin's), and its validating rules would refuse the reference plugin's ASSIGNED patch (an
identity it does not trust), so the run would no longer show what the reference stack does.
`use_ours(delivery)` stops the reference plugin, restores the admission objects and starts our webhook and plugin.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from e2e import fakenvml, gpushare
from e2e.cluster import REPO, Cluster, _base_env, _has_capacity
from e2e.pki import kubeconfig
from e2e.procs import StartError
from e2e.settings import E2eSettings
from e2e.toolchain import PLUGIN_BINARY
from node.inventory import fake_gpus

# Its DaemonSet's command (device-plugin-ds.yaml), and `-token unused`: without a kubelet token it reads the
# in-cluster token file at start-up even though only -query-kubelet uses it (cmd/nvidia/main.go).
FLAGS = ("-logtostderr", "--v=5", "--memory-unit=GiB", "-token", "unused")
READY = b"Registered device plugin with Kubelet"  # pkg/gpu/nvidia/server.go, Register
ADMISSION_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                   "ValidatingAdmissionPolicyBinding")
_VOLATILE = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields")


def reference_rbac(source: Path) -> tuple[str, tuple[str, str]]:
    """The reference plugin's device-plugin-rbac.yaml as it is, and its ServiceAccount. Our cluster-scoped names
    differ from its own (manifests/base/device-plugin.yaml), so both stacks' RBAC live in one cluster unchanged."""
    text = (source / "device-plugin-rbac.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    account = next(d["metadata"] for d in docs if d["kind"] == "ServiceAccount")
    return text, (account["namespace"], account["name"])


def reference_nvml_env(settings: E2eSettings) -> dict[str, str]:
    """The fake NVML library with the tier's GPUs, each with a minor number equal to its index (the reference
    plugin sscanf's /dev/nvidia<minor> and fails without one); the device nodes are never opened."""
    gpus = fake_gpus(settings.fake_gpus, settings.node_name, "MiB")
    library = fakenvml.build(settings.cache_dir / "fakenvml")
    return fakenvml.environment(library, fakenvml.gpu_list((g.memory_units, g.uuid, g.index) for g in gpus))


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
        binaries, source = cluster.toolchain.reference, cluster.settings.reference_src
        if binaries is None or source is None:
            raise StartError("the reference device plugin was not built: set GPUSHARE_E2E_REFERENCE_SRC")
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
        rbac, account = reference_rbac(source / "gpushare-device-plugin")
        kubectl.ok(["apply", "-f", "-"], stdin=rbac)
        config = kubeconfig(cluster.conf / "reference-plugin.kubeconfig", cluster.server,
                            cluster.pki_dir / "ca.crt", token=gpushare.token(kubectl, *account),
                            user="gpushare-device-plugin")
        s = cluster.settings
        env = {**_base_env(), **reference_nvml_env(s), "KUBECONFIG": str(config), "NODE_NAME": s.node_name}
        log = cluster.log("reference-plugin")
        offset = log.stat().st_size if log.exists() else 0
        cluster.procs.start("reference-plugin", [str(binaries / PLUGIN_BINARY), *FLAGS], env=env, cwd=REPO)
        cluster.procs.wait_ready("reference-plugin", lambda: READY in log.read_bytes()[offset:], 60,
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
