"""The kubernetes-client adapter against a small HTTP API server on 127.0.0.1 (list, watch, get, patch, events)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from deviceplugin.apiserver import ApiServerError, Conflict, KubeApiServer

pytestmark = pytest.mark.timeout(60)


def pod(name: str, uid: str, version: str, node: str = "node-a") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "uid": uid, "resourceVersion": version, "annotations": {}},
        "spec": {"nodeName": node, "containers": []},
    }


class FakeKube(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.pods = {"p1": pod("p1", "u1", "10")}
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.watch_events: list[dict[str, Any]] = [
            {"type": "ADDED", "object": pod("p2", "u2", "11")},
            {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "12"}}},
            {"type": "DELETED", "object": pod("p1", "u1", "13")},
        ]
        self.closing = threading.Event()


class Handler(BaseHTTPRequestHandler):
    server: FakeKube

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.server.requests.append(("GET", url.path, query, None))
        if url.path == "/api/v1/pods" and query.get("watch") == "true":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            events, self.server.watch_events = self.server.watch_events, []
            for event in events:
                self.wfile.write(json.dumps(event).encode() + b"\n")
                self.wfile.flush()
            self.server.closing.wait(1.0)  # hold the stream open a moment, then end it like a server timeout
            return
        if url.path == "/api/v1/pods":
            assert query["fieldSelector"] == "spec.nodeName=node-a"
            self._send(200, {"kind": "PodList", "metadata": {"resourceVersion": "10"},
                             "items": list(self.server.pods.values())})
            return
        name = url.path.rsplit("/", 1)[-1]
        if url.path.startswith("/api/v1/namespaces/team/pods/") and name in self.server.pods:
            self._send(200, self.server.pods[name])
            return
        self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound"})

    def do_PATCH(self) -> None:
        url = urlparse(self.path)
        body = self._body()
        self.server.requests.append(("PATCH", url.path, {"content-type": self.headers["Content-Type"]}, body))
        if url.path == "/api/v1/nodes/node-a/status":
            self._send(200, {"kind": "Node"})
            return
        name = url.path.rsplit("/", 1)[-1]
        current = self.server.pods.get(name)
        if current is None:
            self._send(404, {"kind": "Status", "code": 404})
            return
        if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]:
            self._send(409, {"kind": "Status", "code": 409, "reason": "Conflict"})
            return
        current["metadata"]["annotations"].update(body["metadata"]["annotations"])
        current["metadata"]["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
        self._send(200, current)

    def do_POST(self) -> None:
        url = urlparse(self.path)
        body = self._body()
        self.server.requests.append(("POST", url.path, {}, body))
        if url.path == "/api/v1/namespaces/team/events":
            self._send(201, body)
            return
        self._send(500, {"kind": "Status", "code": 500})


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[FakeKube, KubeApiServer]]:
    server = FakeKube()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "t", "user": {"token": "secret-token"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
    }))
    api = KubeApiServer("node-a", str(kubeconfig), timeout=5)
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
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "t", "user": {"token": "x"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
    }))
    api = KubeApiServer("node-a", str(kubeconfig), timeout=2)
    try:
        with pytest.raises(ApiServerError, match="could not list this node's pods"):
            api.list_node_pods()
    finally:
        api.stop()
