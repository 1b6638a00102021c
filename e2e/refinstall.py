"""The reference device plugin installed as its README says, in the install tier: its `device-plugin-rbac.yaml`
as it is, its `device-plugin-ds.yaml` on nodes labelled `gpushare=true`, beside the reference extender the tier
always runs (with the scheduler configuration of manifests/extender).

Two changes to its DaemonSet, both forced by this machine: the image is its program as the tier's registry serves it
(e2e.toolchain.PLUGIN_IMAGE: the program built from its sources and the C library it links; no public registry is
reachable), and its pod gets the fake NVML library as ours does (e2e.install.fake_nvml_values): the GPUs are the
one double. Its GPUs have minor numbers equal to their indexes (e2e.refstack.reference_nvml_env), and the same
UUIDs ours reports, so both plugins name the same devices and the kubelet's checkpoint holds for either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from e2e import settings as ports
from e2e.cluster import Cluster
from e2e.install import NVML_DIR
from e2e.procs import StartError
from e2e.refstack import reference_nvml_env
from e2e.toolchain import PLUGIN_IMAGE

NODE_LABEL = "gpushare=true"  # its README: `kubectl label node <target_node> gpushare=true`
NAMESPACE = "kube-system"
DAEMONSET = "gpushare-device-plugin-ds"
PODS = "name=gpushare-device-plugin-ds"


def _source(cluster: Cluster) -> Path:
    source = cluster.settings.reference_src
    if source is None:
        raise StartError("the reference device plugin's sources are not available: set GPUSHARE_E2E_REFERENCE_SRC")
    return source / "gpushare-device-plugin"


def rbac(cluster: Cluster) -> str:
    return (_source(cluster) / "device-plugin-rbac.yaml").read_text()


def daemonset(cluster: Cluster) -> dict[str, Any]:
    """Its device-plugin-ds.yaml with the two swaps above, and nothing else changed."""
    doc: dict[str, Any] = yaml.safe_load((_source(cluster) / "device-plugin-ds.yaml").read_text())
    pod = doc["spec"]["template"]["spec"]
    [container] = pod["containers"]
    container["image"] = f"127.0.0.1:{cluster.settings.port(ports.REGISTRY)}/{PLUGIN_IMAGE}"
    env = reference_nvml_env(cluster.settings)
    library = env.pop("LD_LIBRARY_PATH")
    container["env"] += [{"name": "LD_LIBRARY_PATH", "value": NVML_DIR},
                         *({"name": k, "value": v} for k, v in sorted(env.items()))]
    container["volumeMounts"].append({"name": "fake-nvml", "mountPath": NVML_DIR, "readOnly": True})
    pod["volumes"].append({"name": "fake-nvml", "hostPath": {"path": library, "type": "Directory"}})
    return doc


def install(cluster: Cluster) -> None:
    kubectl = cluster.kubectl()
    kubectl.ok(["apply", "-f", "-"], stdin=rbac(cluster))
    kubectl.ok(["apply", "-f", "-"], stdin=yaml.safe_dump(daemonset(cluster)))


def uninstall(cluster: Cluster) -> None:
    kubectl = cluster.kubectl()
    kubectl.run(["delete", "daemonset", DAEMONSET, "-n", NAMESPACE, "--ignore-not-found", "--wait=true"],
                timeout=120)
    kubectl.run(["delete", "-f", "-", "--ignore-not-found"], stdin=rbac(cluster), timeout=60)
