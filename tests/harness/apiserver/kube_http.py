"""A small HTTP stand-in for the API server's pod, event and node endpoints, served on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse


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


def write_kubeconfig(path: Path, port: int) -> str:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "t", "user": {"token": "secret-token"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
    }))
    return str(path)
