"""gpushare installed as users install it: `helm install` of charts/gpushare with the project's image, its webhook
and device plugin running as pods behind real Services on the tier's pod network (e2e.podnet).

The one swap is the GPU: the tier's node has no NVIDIA driver, so the device plugin's pod gets the fake NVML
library (e2e.fakenvml) through a test-only values file, `fake_nvml_values`, made of the chart's
devicePlugin.extraEnv, extraVolumeMounts and extraVolumes; on a real node the NVIDIA container toolkit injects the
driver's library into the same container (its NVIDIA_VISIBLE_DEVICES=all). Every other value is the chart's default
but the image and the delivery mode.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from e2e import gpushare, node
from e2e import settings as ports
from e2e.cluster import REPO, Cluster
from e2e.fakenvml import EVENTS_ENV

RELEASE = "gpushare"
RELEASE_NAMESPACE = "kube-system"  # docs/helm.md: not the chart's own namespace, which the chart creates
GPU_NODE_LABEL = "gpushare.io/gpu-memory=device-plugin"  # the chart's default devicePlugin.nodeSelector
GPU_NODE_LABEL_KEY = GPU_NODE_LABEL.partition("=")[0]  # `kubectl label node N KEY-` takes it off
NVML_DIR = "/opt/gpushare-e2e/nvml"  # where the plugin's container sees the fake library


class InstallError(Exception):
    """helm failed; the text has the command and its output."""


def helm_binary() -> str:
    built = subprocess.run([str(REPO / "charts" / "build-helm.sh")], capture_output=True, text=True, timeout=1800,
                           check=False)
    if built.returncode != 0:
        raise InstallError(f"charts/build-helm.sh failed (exit {built.returncode}): {built.stderr.strip()}")
    return built.stdout.strip()


def helm(cluster: Cluster, *args: str, timeout: float = 300) -> str:
    argv = [helm_binary(), *args, "--kubeconfig", str(cluster.admin_kubeconfig)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False,
                          env={**os.environ, "HELM_CACHE_HOME": str(cluster.run / "helm" / "cache"),
                               "HELM_CONFIG_HOME": str(cluster.run / "helm" / "config"),
                               "HELM_DATA_HOME": str(cluster.run / "helm" / "data")})
    if done.returncode != 0:
        raise InstallError(f"helm {' '.join(args)} failed (exit {done.returncode}): "
                           f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


@functools.cache
def wait() -> str:
    """helm's flag to wait as Helm 3's --wait does: until the workloads' pods are ready (on uninstall, until the
    objects are gone). Helm 4's bare --wait is its watcher strategy, which waits for every object to be Current
    (helm v4 pkg/cmd/flags.go AddWaitFlag, pkg/kube/statuswait.go): a deleted one never is, and the signing-key Job
    of cert-manager mode deletes itself once done (ttlSecondsAfterFinished: 0), before the webhook's pods that
    mount its key are ready, so the watcher would wait out --timeout (helm/helm#31786; v4.3.2 makes no exception
    for it). Its 'legacy' strategy is Helm 3's waiter (pkg/kube/wait.go); Helm 3 takes no value after --wait."""
    short = subprocess.run([helm_binary(), "version", "--short"], capture_output=True, text=True, timeout=60,
                           check=True).stdout.strip()
    return "--wait" if short.startswith("v3.") else "--wait=legacy"


def image_values(cluster: Cluster, tag: str | None = None) -> dict[str, Any]:
    """The project's image as the tier's registry serves it (e2e.projectimage, e2e.registry)."""
    image = cluster.toolchain.image
    if image is None:
        raise InstallError("the project's image was not built (e2e.toolchain.ensure builds it)")
    registry = f"127.0.0.1:{cluster.settings.port(ports.REGISTRY)}"
    return {"repository": f"{registry}/{image.repository}", "tag": tag or image.tag, "pullPolicy": "IfNotPresent"}


def fake_nvml_values(cluster: Cluster) -> dict[str, Any]:
    """The test-only swap: the fake NVML library and its GPU list in the plugin's pod, and the folder where the
    plugin writes the files that stand for the fake GPUs' device nodes in cdi delivery (a host path: the CDI specs
    name it), at the path the host-process plugin uses."""
    env = cluster.nvml_env()
    library = Path(env.pop("LD_LIBRARY_PATH"))
    env.pop(EVENTS_ENV, None)  # XID events are injected into the host-process plugin only (test_nvml.py)
    fake_gpus = str(node.RUN_ROOT / "fake-gpus")
    return {
        "extraEnv": [{"name": "LD_LIBRARY_PATH", "value": NVML_DIR},
                     {"name": "GPUSHARE_FAKE_GPU_DIR", "value": fake_gpus},
                     *({"name": k, "value": v} for k, v in sorted(env.items()))],
        "extraVolumeMounts": [{"name": "fake-nvml", "mountPath": NVML_DIR, "readOnly": True},
                              {"name": "fake-gpus", "mountPath": fake_gpus}],
        "extraVolumes": [{"name": "fake-nvml", "hostPath": {"path": str(library), "type": "Directory"}},
                         {"name": "fake-gpus", "hostPath": {"path": fake_gpus, "type": "DirectoryOrCreate"}}],
    }


def write_values(cluster: Cluster, path: Path, *, certificates: str, delivery: str = "env",
                 tag: str | None = None, extra: dict[str, Any] | None = None) -> Path:
    values: dict[str, Any] = {
        "certificates": certificates,
        "image": image_values(cluster, tag),
        "config": {"delivery": delivery},
        "devicePlugin": fake_nvml_values(cluster),
        **(extra or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def certs_install(cluster: Cluster) -> None:
    """`gpushare-certs install`, as docs/helm.md says to run after a self-signed install."""
    done = subprocess.run(
        [sys.executable, "-m", "certs.cli", "install", "--namespace", gpushare.NAMESPACE,
         "--kubeconfig", str(cluster.admin_kubeconfig)],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    if done.returncode != 0:
        raise InstallError(f"gpushare-certs install failed (exit {done.returncode}): {done.stderr or done.stdout}")


def ensure_cert_manager(cluster: Cluster) -> None:
    """The tier's cert-manager running, started once per cluster whichever install test needs it first."""
    running = cluster.procs.procs.get("cert-manager-controller")
    if running is None or not running.alive():
        cluster.cert_manager().start()


def wait_serving(cluster: Cluster, timeout: float = 120) -> None:
    """Until a GPU-share pod's creation passes both webhooks through their Service (a server-side dry run): pods
    Ready is not enough, the Service's endpoints reach kube-proxy's rules a moment later."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "serving-probe", "namespace": "default"},
           "spec": {"containers": [{"name": "main", "image": "gpushare-e2e/none:1",
                                    "resources": {"limits": {"aliyun.com/gpu-mem": "1"}}}]}}
    kubectl = cluster.kubectl()
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        code, out, err = kubectl.run(["create", "--dry-run=server", "-f", "-"], stdin=json.dumps(pod), timeout=30)
        if code == 0:
            return
        last = err.strip() or out.strip()
        time.sleep(1)
    raise InstallError(f"the webhook did not answer through its Service within {timeout:g} s: {last}")


def node_gpu_memory(cluster: Cluster) -> tuple[int, int]:
    """(allocatable aliyun.com/gpu-mem, capacity aliyun.com/gpu-count) of the tier's node: what the extender reads
    (it gives each GPU memory/count, so a node without its count is a node of GPUs without memory to it)."""
    node = cluster.kubectl().json(["get", "node", cluster.settings.node_name])
    allocatable, capacity = node["status"].get("allocatable") or {}, node["status"].get("capacity") or {}
    memory, count = str(allocatable.get("aliyun.com/gpu-mem", "0")), str(capacity.get("aliyun.com/gpu-count", "0"))
    return (int(memory) if memory.isdigit() else 0), (int(count) if count.isdigit() else 0)


def wait_node_serving(cluster: Cluster, timeout: float = 120) -> None:
    """Until the node offers GPU memory and its GPU count: a pod created before is judged by the extender on a node
    without them and waits in the scheduler's queue of unschedulable pods for minutes."""
    deadline = time.monotonic() + timeout
    while min(node_gpu_memory(cluster)) <= 0:
        if time.monotonic() > deadline:
            raise InstallError(f"the node offered no aliyun.com/gpu-mem or no aliyun.com/gpu-count within {timeout:g} s"
                               f" (allocatable memory, GPU count: {node_gpu_memory(cluster)})")
        time.sleep(1)
