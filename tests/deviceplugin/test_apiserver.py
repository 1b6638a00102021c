"""The kubernetes-client adapter against a small HTTP API server on 127.0.0.1 (list, watch, get, patch, events)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin.apiserver import KubeApiServer
from node.apiclient import ApiServerError, Conflict
from tests.harness.apiserver.kube_http import FakeKube, write_kubeconfig
from tests.harness.apiserver.server import ApiServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[FakeKube, KubeApiServer]]:
    server = FakeKube()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    api = KubeApiServer("node-a", write_kubeconfig(tmp_path / "kubeconfig", server.server_address[1]), timeout=5)
    try:
        yield server, api
    finally:
        server.closing.set()
        api.stop()
        server.shutdown()
        server.server_close()


def test_reads_patches_and_events(kube: tuple[FakeKube, KubeApiServer]) -> None:
    server, api = kube
    assert [p["metadata"]["name"] for p in api.list_node_pods()] == ["p1"]
    assert api.get_pod("team", "p1") == server.pods["p1"]
    assert api.get_pod("team", "nope") is None
    patched = api.patch_pod_annotations("team", "p1", {"A": "1"}, "10")
    assert patched["metadata"]["annotations"] == {"A": "1"} and patched["metadata"]["resourceVersion"] == "11"
    with pytest.raises(Conflict):
        api.patch_pod_annotations("team", "p1", {"A": "2"}, "10")
    with pytest.raises(ApiServerError, match="no longer exists"):
        api.patch_pod_annotations("team", "nope", {"A": "2"}, "1")
    patches = [r for r in server.requests if r[0] == "PATCH"]
    assert {r[2]["content-type"] for r in patches} == {"application/merge-patch+json"}
    api.create_event(server.pods["p1"], "Warning", "GpuShareRefused", "Pod team/p1 was refused.")
    (event,) = [r[3] for r in server.requests if r[0] == "POST"]
    assert event["involvedObject"]["uid"] == "u1" and event["reason"] == "GpuShareRefused"
    assert event["type"] == "Warning" and event["source"]["host"] == "node-a"
    api.patch_node_capacity({"aliyun.com/gpu-count": "2"})
    assert server.requests[-1][3] == {"status": {"capacity": {"aliyun.com/gpu-count": "2"}}}


def test_watch_cache_follows_the_node(kube: tuple[FakeKube, KubeApiServer]) -> None:
    server, api = kube
    api.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        names = sorted(p["metadata"]["name"] for p in api.node_pods())
        if names == ["p2"]:
            break
        time.sleep(0.05)
    assert names == ["p2"]
    watches = [r[2] for r in server.requests if r[2].get("watch") == "true"]
    assert watches[0]["resourceVersion"] == "10"
    assert watches[0]["fieldSelector"] == "spec.nodeName=node-a"
    while time.monotonic() < deadline and len(watches) < 2:  # the stream ended: it resumes from the bookmark
        time.sleep(0.05)
        watches = [r[2] for r in server.requests if r[2].get("watch") == "true"]
    assert watches[1]["resourceVersion"] == "13"


def test_unreachable_api_server_is_an_error_not_a_hang(tmp_path: Path) -> None:
    api = KubeApiServer("node-a", write_kubeconfig(tmp_path / "kubeconfig", 9), timeout=2)
    try:
        with pytest.raises(ApiServerError, match="could not list this node's pods"):
            api.list_node_pods()
    finally:
        api.stop()


def test_requests_whose_answer_is_not_read_give_their_connection_back(tmp_path: Path) -> None:
    """An Event or a capacity patch answered and never read kept its connection out of urllib3's pool, so the next
    request opened a new one: a TCP and TLS handshake with the API server per PreStartContainer."""
    with ApiServer(deletion="immediate") as sim:
        admin = sim.client()
        admin.create("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
        pod = admin.create_pod("team", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1"},
                                        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "i"}]}})
        sim.write_kubeconfig(tmp_path / "kubeconfig")
        api = KubeApiServer("node-a", str(tmp_path / "kubeconfig"), timeout=5)
        try:
            before = sim.connections_opened
            for n in range(3):
                assert api.get_pod("team", "p1") is not None
                api.create_event(pod, "Normal", "GpuShareAllocated", f"call {n}")
                api.patch_node_capacity({"aliyun.com/gpu-count": str(n)})
            assert sim.connections_opened - before == 1
        finally:
            api.stop()
