"""`kubectl gpushare` after a scenario on the simulated cluster: its JSON and its table say what the pods'
annotations say, with the gpushare webhook and plugin, and beside the reference algorithm (ALIYUN_COM_GPU_MEM_* keys
only, no webhook)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract import ASSIGNED, IDX, POD
from contract.keys import GPU_COUNT
from tests.harness.scenarios import PodShape
from tests.harness.sim.cluster import ClusterSpec, SimCluster
from tests.harness.sim.scenario import wait_settled
from tests.harness.webhook.server import webhook_server
from tests.kubectlplugin.test_cli import EXECUTABLE

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not EXECUTABLE.exists(), reason="kubectl-gpushare is not installed; run `pip install -e .`"),
]
NAMESPACE = "team"
SHAPES = [PodShape((3,)), PodShape((2, 1)), PodShape((6,), (4,)), PodShape((1,)), PodShape((5,)), PodShape((2,)),
          PodShape((0,))]


def run_scenario(cluster: SimCluster, bypass: bool) -> list[dict[str, Any]]:
    """Pods of several shapes on 2 nodes x 2 GPUs of 8 GiB, one too large for any GPU, and (with the webhook) one
    bound by its creator past the extender, which the plugin refuses; returns the pods once settled."""
    cluster.api.add_namespace(NAMESPACE)
    pods = [shape.pod(name=f"pod-{i}") for i, shape in enumerate(SHAPES)]
    pods.append(PodShape((9,)).pod(name="too-large"))
    if bypass:
        direct = PodShape((7,)).pod(name="direct")  # a size no other container asks for: Allocate is refused
        direct["spec"]["nodeName"] = "node-1"
        pods.append(direct)
    for pod in pods:
        cluster.user.create_pod(NAMESPACE, pod)
    assert wait_settled(cluster, NAMESPACE, [], 60), "the scenario's pods did not settle"
    return [p for p in cluster.admin.list_pods()[0] if p["metadata"]["namespace"] == NAMESPACE]


def expected_gpus(pods: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[int, int, list[str]]]:
    """(node, GPU) -> (units promised, units allocated, pod names), straight from the annotations."""
    out: dict[tuple[str, int], tuple[int, int, list[str]]] = {(n, i): (0, 0, []) for n in ("node-0", "node-1")
                                                              for i in (0, 1)}
    for pod in pods:
        annotations = pod["metadata"].get("annotations") or {}
        if IDX not in annotations:
            continue
        key = (pod["spec"]["nodeName"], int(annotations[IDX]))
        promised, allocated, names = out[key]
        units = int(annotations[POD]) if pod["status"].get("phase") != "Failed" else 0
        done = units if annotations.get(ASSIGNED) == "true" else 0
        out[key] = (promised + units, allocated + done, sorted([*names, pod["metadata"]["name"]]))
    return out


def show(cluster: SimCluster, directory: Path, *args: str) -> str:
    kubeconfig = cluster.api.write_kubeconfig(directory / "admin.kubeconfig")
    done = subprocess.run([str(EXECUTABLE), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=60, check=False, env={"HOME": str(directory)})
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return done.stdout


def check(cluster: SimCluster, pods: list[dict[str, Any]], directory: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(show(cluster, directory, "-o", "json"))
    shown = {(n["name"], g["index"]): (g["promised"], g["allocated"], sorted(p["name"] for p in g["pods"]))
             for n in doc["nodes"] for g in n["gpus"]}
    assert shown == expected_gpus(pods)
    assert {g["memory"] for n in doc["nodes"] for g in n["gpus"]} == {8}
    rows = [line.split() for line in show(cluster, directory).splitlines()[1:5]]
    table = {(r[0], int(r[1])): (int(r[3]), int(r[4])) for r in rows}
    assert table == {k: v[:2] for k, v in expected_gpus(pods).items()}
    states = {p["name"]: p["state"] for n in doc["nodes"] for g in n["gpus"] for p in g["pods"]}
    for pod in pods:
        if (pod["metadata"].get("annotations") or {}).get(ASSIGNED) == "true":
            assert states[pod["metadata"]["name"]] == "allocated"
    return doc


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with webhook_server(tmp_path_factory.mktemp("webhook")) as running:
        yield running


def test_with_the_gpushare_webhook_and_plugin(hook: Any, tmp_path: Path) -> None:
    with SimCluster(ClusterSpec(nodes=2, gpus="2x8GiB", seed=3), hook) as cluster:
        pods = run_scenario(cluster, bypass=True)
        doc = check(cluster, pods, tmp_path)
    pending = {p["name"]: (p["state"], p["units"]) for p in doc["pending"]}
    assert pending == {"too-large": ("stamped", 9)}
    (direct,) = [p for n in doc["nodes"] for p in n["unplaced"]]
    assert (direct["name"], direct["node"], direct["state"], direct["counted"]) == ("direct", "node-1", "refused",
                                                                                    False)
    assert direct["reason"].startswith("UnexpectedAdmissionError: Allocate failed due to rpc error: code = "
                                       "FailedPrecondition desc = no pod on node node-1 admitted by the gpushare "
                                       "webhook has a container asking for exactly 7 GiB")
    assert all(p["state"] == "allocated" for n in doc["nodes"] for g in n["gpus"] for p in g["pods"])


def test_beside_the_reference_algorithm(tmp_path: Path) -> None:
    with SimCluster(ClusterSpec(nodes=2, gpus="2x8GiB", plugin="baseline", seed=3)) as cluster:
        # The reference plugin publishes its GPU count (pkg/gpu/nvidia/const.go, CountName); the baseline does not.
        for node in ("node-0", "node-1"):
            cluster.admin.patch("nodes", node, {"status": {"capacity": {GPU_COUNT: "2"}}}, subresource="status")
        pods = run_scenario(cluster, bypass=False)
        assert not any("gpushare.io/intent" in p["metadata"].get("annotations", {}) for p in pods)
        doc = check(cluster, pods, tmp_path)
    assert {p["name"]: p["state"] for p in doc["pending"]} == {"too-large": "requested"}
