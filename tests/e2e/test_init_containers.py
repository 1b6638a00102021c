"""Init containers with GPU memory on a real kubelet, behind the reference extender: PodResources never lists a
regular init container, so the plugin must resolve it exactly from the kubelet's checkpoint; every GPU container
sees its pod's GPU. Pods the extender cannot book in full are refused when they are created."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.harness.realtier import workloads as w

# GPU-share pods here are placed by the reference scheduler extender (skipped, with the reason, without it).
pytestmark = pytest.mark.usefixtures("needs_extender")

NO_GPU = ("<unset>", "void", "")


def cases(img: str) -> dict[str, tuple[dict[str, Any], list[str]]]:
    """name -> (pod, the containers that must report a GPU): what the reference extender books in full."""
    c = w.container
    done = "exit 0"
    return {
        "init-smaller": (w.pod("init-smaller", [c("main", img, 8)], [c("prep", img, 4, then=done)]),
                         ["prep", "main"]),
        "init-equal": (w.pod("init-equal", [c("main", img, 8)], [c("prep", img, 8, then=done)]), ["prep", "main"]),
        "sidecar": (w.pod("sidecar", [c("main", img, 8)], [c("helper", img, sidecar=True)]), ["main"]),
        "two-apps": (w.pod("two-apps", [c("a", img, 4), c("b", img, 4)], [c("prep", img, 8, then=done)]),
                     ["prep", "a", "b"]),
    }


def unbookable(img: str) -> dict[str, tuple[dict[str, Any], str]]:
    """name -> (pod, the container the refusal names): the reference extender books only the sum of the app
    containers' limits (pkg/utils/pod.go, GetGPUMemoryFromPodResource), so these would run over their GPU's memory
    (or, with GPU memory in init containers only, never bind); the webhook refuses them at creation."""
    c = w.container
    done = "exit 0"
    return {
        "init-larger": (w.pod("init-larger", [c("main", img, 8)], [c("prep", img, 16, then=done)]), "prep"),
        "init-only": (w.pod("init-only", [c("main", img)], [c("prep", img, 8, then=done)]), "prep"),
        "gpu-sidecar": (w.pod("gpu-sidecar", [c("main", img, 8)], [c("helper", img, 4, sidecar=True)]), "helper"),
    }


def test_pods_the_extender_cannot_book_are_refused_at_creation(cluster: Cluster, delivery: str, kubectl: Kubectl,
                                                               namespace: str) -> None:
    for name, (spec, container) in unbookable(w.image(cluster)).items():
        code, out = w.create(cluster.kubectl(as_tenant=True), namespace, spec)
        assert code != 0, f"{name} was created"
        assert container in out and "extender" in out, f"{name}: {out}"
    assert w.pods(kubectl, namespace) == []


def test_init_container_pods_run_on_their_gpu(cluster: Cluster, delivery: str, kubectl: Kubectl,
                                               namespace: str) -> None:
    img = w.image(cluster, 2000)
    table = cases(img)
    code, out = w.create(kubectl, namespace, *[spec for spec, _ in table.values()])
    assert code == 0, out

    def all_running() -> bool:
        return all(w.running(p) for p in w.pods(kubectl, namespace)) and len(w.pods(kubectl, namespace)) == len(table)

    try:
        w.wait("every init-container pod running", all_running, 180, 2)
    except AssertionError:
        stuck = {p["metadata"]["name"]: w.reason(p) for p in w.pods(kubectl, namespace) if not w.running(p)}
        pytest.fail(f"pods not running on the real node ({delivery}): {stuck}")
    s = cluster.settings
    for p in w.pods(kubectl, namespace):
        name = p["metadata"]["name"]
        spec, with_gpu = table[name]
        every = [x["name"] for x in spec["spec"].get("initContainers", []) + spec["spec"]["containers"]]
        for container_name in every:
            rep = w.report(kubectl, namespace, name, container_name)
            assert rep is not None, f"{name}/{container_name} printed no report"
            if container_name in with_gpu:
                got = w.gpu_of(rep, delivery, s.node_name, s.fake_gpus)
                assert got == w.assigned_index(p), f"{name}/{container_name}: {rep} vs IDX {w.assigned_index(p)}"
            else:
                assert rep.visible in NO_GPU, f"{name}/{container_name} asks for no GPU but got {rep}"
