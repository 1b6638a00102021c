"""The kustomize overlays, applied as docs/deploy.md says: a user's overlay of `manifests/self-signed` or
`manifests/cert-manager` that sets the image (and here, as the chart's test-only values do, mounts the fake NVML
library into the plugin's pod), `kubectl apply -k`, and the same working install as `helm install` gives; then
`kubectl delete -k` leaves nothing of ours.

Runs after the helm modules (each leaves the cluster without gpushare); cert-manager is started where it is not
running yet.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import install
from e2e.cluster import REPO, Cluster
from e2e.kube import Kubectl
from tests.harness.realtier import workloads as w
from tests.install.test_install import _ours, _ready, assert_nothing_of_ours_left

pytestmark = pytest.mark.usefixtures("needs_extender")


def _user_overlay(cluster: Cluster, overlay: str) -> Path:
    folder = cluster.run / "overlays" / overlay
    folder.mkdir(parents=True, exist_ok=True)
    image = install.image_values(cluster)
    swap = install.fake_nvml_values(cluster)
    container = "/spec/template/spec/containers/0"
    ops: list[dict[str, Any]] = [
        *({"op": "add", "path": f"{container}/env/-", "value": v} for v in swap["extraEnv"]),
        *({"op": "add", "path": f"{container}/volumeMounts/-", "value": v} for v in swap["extraVolumeMounts"]),
        *({"op": "add", "path": "/spec/template/spec/volumes/-", "value": v} for v in swap["extraVolumes"]),
    ]
    (folder / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "manifests" / overlay, folder)],
        "images": [{"name": "gpushare", "newName": image["repository"], "newTag": image["tag"]}],
        "patches": [{"target": {"kind": "DaemonSet", "name": "gpushare-device-plugin"}, "patch": yaml.safe_dump(ops)}],
    }))
    return folder


@pytest.mark.parametrize("overlay", ["self-signed", "cert-manager"])
def test_kubectl_apply_k_brings_up_a_working_install(cluster: Cluster, kubectl: Kubectl, namespace: str,
                                                    overlay: str) -> None:
    if overlay == "cert-manager":
        install.ensure_cert_manager(cluster)
    kubectl.ok(["label", "node", cluster.settings.node_name, install.GPU_NODE_LABEL, "--overwrite"])
    folder = _user_overlay(cluster, overlay)
    started = time.monotonic()
    kubectl.ok(["apply", "-k", str(folder)], timeout=120)
    try:
        if overlay == "self-signed":
            install.certs_install(cluster)
        w.wait("2 webhook pods Ready",
               lambda: sum(map(_ready, _ours(kubectl, "app.kubernetes.io/name=gpushare-webhook"))) == 2, 300, 2)
        w.wait("the device plugin's pod Ready",
               lambda: sum(map(_ready, _ours(kubectl, "app.kubernetes.io/name=gpushare-device-plugin"))) == 1, 120, 2)
        install.wait_serving(cluster)
        assert w.create(kubectl, namespace, w.pod("gpu", [w.container("main", w.image(cluster), 8)]))[0] == 0
        pod = w.wait_running(kubectl, namespace, 1, 180)[0]
        rep = w.report(kubectl, namespace, "gpu", "main")
        assert rep is not None and "gpushare.io/intent" in w.annotations_of(pod)
        got = w.gpu_of(rep, "env", cluster.settings.node_name, cluster.settings.fake_gpus)
        assert got == w.assigned_index(pod), rep
        print(f"\nkubectl apply -k of a user's overlay of manifests/{overlay}: a GPU-share pod running on its GPU "
              f"{time.monotonic() - started:.0f} s after the apply", file=sys.stderr)
    finally:
        kubectl.run(["delete", "-k", str(folder), "--wait=true", "--ignore-not-found"], timeout=300)
    assert_nothing_of_ours_left(kubectl)
