"""Containers that ask for no GPU memory get no GPU on the real node (the env-mode isolation hole)."""

from __future__ import annotations

from typing import Any

import pytest

from e2e import gpushare
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.harness.realtier import workloads as w


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


def _legacy_and_prefixed(img: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A plain image with CUDA_VERSION (the toolkit's legacy-image rule: every GPU), and envFrom with prefix NVIDIA_
    (a ConfigMap key VISIBLE_DEVICES becomes NVIDIA_VISIBLE_DEVICES)."""
    legacy = w.pod("legacy", [w.container("main", img)])
    legacy["spec"]["containers"][0]["env"].append({"name": "CUDA_VERSION", "value": "12.4"})
    prefixed = w.pod("prefixed", [w.container("main", img)])
    prefixed["spec"]["containers"][0]["envFrom"] = [{"prefix": "NVIDIA_", "configMapRef": {"name": "gpus"}}]
    return legacy, prefixed


def _voided(kubectl: Kubectl, namespace: str, name: str) -> bool:
    made = next(p for p in w.pods(kubectl, namespace) if p["metadata"]["name"] == name)
    return {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in made["spec"]["containers"][0]["env"]


def test_gpu_selection_outside_env_is_refused_by_the_policy_while_the_webhook_is_down(
        cluster: Cluster, delivery: str, kubectl: Kubectl, namespace: str) -> None:
    """Security issue, medium 3: on the webhook path nothing adds `void` while the webhook is down, so the in-server
    policy must refuse `kubectl run x --image=busybox --env=CUDA_VERSION=12.4` and an envFrom prefix that forms
    NVIDIA_VISIBLE_DEVICES, in both delivery modes, while an ordinary pod is still created. On the in-process path
    (Kubernetes 1.36 and newer) the policy gpushare-neutralise adds `void` in env delivery inside the API server, so
    those pods are created neutralised with the webhook down as with it up."""
    tenant = cluster.kubectl(as_tenant=True)
    legacy, prefixed = _legacy_and_prefixed(w.image(cluster))
    in_process = gpushare.IN_PROCESS in cluster.components and delivery == "env"
    cluster.stop_webhook()
    try:
        code, out = w.create(tenant, namespace, legacy)
        if in_process:
            assert code == 0 and _voided(kubectl, namespace, "legacy"), out
        else:
            assert code != 0 and "gpushare-container-env" in out and "sets CUDA_VERSION" in out, out
        code, out = w.create(tenant, namespace, prefixed)
        if in_process:
            assert code == 0 and _voided(kubectl, namespace, "prefixed"), out
        else:
            assert code != 0 and "gpushare-container-env" in out and "with prefix NVIDIA_" in out, out
        code, out = w.create(tenant, namespace, w.pod("plain", [w.container("main", w.image(cluster))]))
        assert code == 0, f"an ordinary pod must be created while the webhook is down: {out}"
        if in_process:
            assert _voided(kubectl, namespace, "plain")
            kubectl.ok(["delete", "pods", "legacy", "prefixed", "-n", namespace, "--wait=true"], timeout=120)
    finally:
        cluster.start_webhook()
    for spec in (legacy, prefixed):
        code, out = w.create(tenant, namespace, spec)
        if delivery == "env":  # the mutation adds void, which wins over both: created, neutralised
            assert code == 0, out
            assert _voided(kubectl, namespace, spec["metadata"]["name"])
        else:  # cdi delivery adds no void: the webhook refuses it itself
            assert code != 0 and "gpushare denied pod" in out and "NVIDIA_VISIBLE_DEVICES=void" in out, out
