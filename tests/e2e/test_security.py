"""Containers that ask for no GPU memory get no GPU on the real node (the env-mode isolation hole)."""

from __future__ import annotations

import pytest

from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.e2e import workloads as w


def test_an_image_that_selects_every_gpu_gets_none(cluster: Cluster, needs_extender: None, delivery: str,
                                                    kubectl: Kubectl, namespace: str) -> None:
    """Like every nvidia/cuda image, `cuda-like` sets NVIDIA_VISIBLE_DEVICES=all in its image config."""
    img = w.image(cluster, repository="cuda-like")
    gpu_pod = w.pod("gpu", [w.container("main", img, 4), w.container("sidecar", img)])
    plain = w.pod("plain", [w.container("main", img)])
    for spec in (gpu_pod, plain):
        code, out = w.create(cluster.kubectl(as_tenant=True), namespace, spec)
        assert code == 0, out
    w.wait_running(kubectl, namespace, 2, 120)
    for name, container in (("gpu", "sidecar"), ("plain", "main")):
        rep = w.report(kubectl, namespace, name, container)
        assert rep is not None
        # env mode: the webhook's explicit `void` wins over the image's `all`; cdi mode trusts only CDI specs
        # (the runtime ignores the variable for unprivileged containers), so the variable itself is inert there.
        expected = "void" if delivery == "env" else "all"
        assert rep.visible == expected, f"{name}/{container}: {rep}"


@pytest.mark.parametrize(
    "env",
    [
        [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}],
        [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"fieldRef": {"fieldPath":
                                                                       "metadata.annotations['ALIYUN_COM_GPU_MEM_IDX']"}}}],
    ],
    ids=["visible-all", "cuda-visible", "fieldref-to-idx"],
)
def test_a_container_without_gpu_memory_cannot_select_a_gpu(cluster: Cluster, namespace: str,
                                                             env: list[dict[str, object]]) -> None:
    spec = w.pod("thief", [w.container("main", w.image(cluster))])
    spec["spec"]["containers"][0]["env"] += env
    code, out = w.create(cluster.kubectl(as_tenant=True), namespace, spec)
    assert code != 0 and str(env[0]["name"]) in out, out
