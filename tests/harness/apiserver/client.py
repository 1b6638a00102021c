"""A small typed JSON client of the test API server for the simulated actors; it implements ports.PodApi."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

from tests.harness.apiserver.resources import resource
from tests.harness.apiserver.status import ApiError
from tests.harness.tls import client_context

Obj = dict[str, Any]
PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}


class Watch:
    """One watch stream: iterate (type, object) pairs; BOOKMARK events are skipped, ERROR raises ApiError."""

    def __init__(self, connection: http.client.HTTPSConnection, response: http.client.HTTPResponse) -> None:
        self._connection = connection
        self._response = response
        self.resource_version = ""

    def __iter__(self) -> Iterator[tuple[str, Obj]]:
        try:
            while True:
                try:
                    line = self._response.readline()
                except (OSError, http.client.HTTPException, ValueError):
                    return  # closed by close(), the server stopping, or the socket timeout
                if not line:
                    return
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                self.resource_version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                if event.get("type") == "ERROR":
                    raise ApiError.from_status(obj, 500)
                if event.get("type") == "BOOKMARK":
                    continue
                yield str(event.get("type")), obj
        finally:
            self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self._connection.sock is not None:
                self._connection.sock.close()
        self._connection.close()
        # The server ends a watch by closing the connection and says so (Connection: close): http.client then hands
        # the socket to the response alone, which must be closed for the server to see the client leave.
        with contextlib.suppress(OSError, ValueError):
            self._response.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SimClient:
    """Bearer-token HTTPS client verifying the server CA; one keep-alive connection per thread."""

    def __init__(self, base_url: str, token: str, ca_pem: bytes, timeout: float = 30.0, username: str = "") -> None:
        parsed = urllib.parse.urlsplit(base_url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 443
        self.token = token
        self.timeout = timeout
        self._context = client_context(ca_pem)
        self._local = threading.local()
        self._username = username
        self.warnings: list[str] = []  # admission warnings of the last answer on any thread (for tests)

    @property
    def user(self) -> str:
        return self._username

    def _connection(self, fresh: bool = False) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self._context)
            self._local.conn = conn
        return conn

    def _headers(self, content_type: str = "application/json") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Accept": "application/json", "Content-Type": content_type}

    def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                query: Mapping[str, str] | None = None) -> Any:
        """One call; a non-2xx answer raises ApiError built from the server's Status."""
        if query:
            path += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(2):
            conn = self._connection(fresh=attempt > 0)
            try:
                conn.request(method, path, data, self._headers(content_type))
                response = conn.getresponse()
                payload = response.read()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                if attempt:
                    raise
        self.warnings = [w.split(" ", 2)[2].strip('"') for w in response.headers.get_all("Warning") or []
                         if w.count(" ") >= 2]
        decoded: Any = json.loads(payload) if payload.strip().startswith(b"{") else payload.decode(errors="replace")
        if response.status >= 300:
            if isinstance(decoded, dict):
                raise ApiError.from_status(decoded, response.status)
            raise ApiError(response.status, str(decoded) or f"HTTP {response.status}")
        return decoded

    # --- generic verbs, by store key (`pods`, `nodes`, `events.events.k8s.io`, ...) ---------------------------

    def get(self, key: str, name: str, namespace: str = "", subresource: str = "") -> Obj:
        result: Obj = self.request("GET", resource(key).path(namespace, name, subresource))
        return result

    def list_objects(self, key: str, namespace: str = "", *, label_selector: str | None = None,
             field_selector: str | None = None) -> Obj:
        query = {"labelSelector": label_selector or "", "fieldSelector": field_selector or ""}
        result: Obj = self.request("GET", resource(key).path(namespace), query={k: v for k, v in query.items() if v})
        return result

    def create(self, key: str, obj: Mapping[str, Any], namespace: str = "", *, dry_run: bool = False) -> Obj:
        result: Obj = self.request("POST", resource(key).path(namespace), dict(obj),
                                   query={"dryRun": "All"} if dry_run else None)
        return result

    def update(self, key: str, obj: Mapping[str, Any], namespace: str = "", subresource: str = "") -> Obj:
        name = str((obj.get("metadata") or {}).get("name", ""))
        result: Obj = self.request("PUT", resource(key).path(namespace, name, subresource), dict(obj))
        return result

    def patch(self, key: str, name: str, patch: Any, namespace: str = "", *, patch_type: str = "merge",
              subresource: str = "") -> Obj:
        """`patch_type` is merge, strategic or json."""
        result: Obj = self.request("PATCH", resource(key).path(namespace, name, subresource), patch,
                                   content_type=PATCH_TYPES[patch_type])
        return result

    def delete(self, key: str, name: str, namespace: str = "", *, grace_period_seconds: int | None = None,
               uid: str | None = None) -> Obj:
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        result: Obj = self.request("DELETE", resource(key).path(namespace, name), options)
        return result

    def watch(self, key: str, namespace: str = "", *, resource_version: str | None = None,
              label_selector: str | None = None, field_selector: str | None = None,
              timeout_seconds: float | None = None, bookmarks: bool = False) -> Watch:
        """A stream from `resource_version` (None: current state as ADDED events first, then changes)."""
        query = {"watch": "true", "resourceVersion": resource_version or "", "labelSelector": label_selector or "",
                 "fieldSelector": field_selector or "",
                 "timeoutSeconds": "" if timeout_seconds is None else str(timeout_seconds),
                 "allowWatchBookmarks": "true" if bookmarks else ""}
        path = resource(key).path(namespace) + "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v})
        socket_timeout = None if timeout_seconds is None else timeout_seconds + self.timeout
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=socket_timeout, context=self._context)
        conn.request("GET", path, headers=self._headers())
        response = conn.getresponse()
        if response.status >= 300:
            payload = response.read()
            conn.close()
            raise ApiError.from_status(json.loads(payload), response.status)
        return Watch(conn, response)

    # --- pods, binding and events (the PodApi the simulated actors use) ---------------------------------------

    def list_pods(self, *, node: str | None = None, label_selector: str | None = None) -> tuple[list[Obj], str]:
        found = self.list_objects("pods", label_selector=label_selector,
                          field_selector=f"spec.nodeName={node}" if node is not None else None)
        return list(found.get("items") or []), str(found["metadata"]["resourceVersion"])

    def watch_pods(self, resource_version: str, *, node: str | None = None, label_selector: str | None = None,
                   timeout_s: float = 1.0) -> Iterator[tuple[str, Obj]]:
        with self.watch("pods", resource_version=resource_version, label_selector=label_selector,
                        field_selector=f"spec.nodeName={node}" if node is not None else None,
                        timeout_seconds=timeout_s) as stream:
            yield from stream

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        try:
            return self.get("pods", name, namespace)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    def create_pod(self, namespace: str, pod: Mapping[str, Any]) -> Obj:
        return self.create("pods", pod, namespace)

    def patch_pod(self, namespace: str, name: str, merge_patch: Mapping[str, Any], *, strategic: bool = False) -> Obj:
        return self.patch("pods", name, dict(merge_patch), namespace, patch_type="strategic" if strategic else "merge")

    def patch_pod_status(self, namespace: str, name: str, merge_patch: Mapping[str, Any]) -> Obj:
        return self.patch("pods", name, dict(merge_patch), namespace, subresource="status")

    def bind(self, namespace: str, name: str, node: str, annotations: Mapping[str, str] | None = None) -> None:
        """POST pods/binding; `annotations` are copied onto the pod by the server, like the real one."""
        binding: Obj = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": namespace},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        if annotations:
            binding["metadata"]["annotations"] = dict(annotations)
        self.request("POST", resource("pods").path(namespace, name, "binding"), binding)

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None) -> None:
        self.delete("pods", name, namespace, grace_period_seconds=grace_seconds)

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        body = dict(event)
        body.setdefault("metadata", {})
        if not body["metadata"].get("name"):
            involved = str((body.get("involvedObject") or {}).get("name") or "event")
            body["metadata"] = {**body["metadata"], "generateName": f"{involved}."}
        self.create("events", body, namespace)

    def events(self, namespace: str = "", involved: str | None = None) -> list[Obj]:
        """core/v1 Events, optionally only those about the object named `involved`."""
        selector = f"involvedObject.name={involved}" if involved else None
        found = self.list_objects("events", namespace, field_selector=selector)
        return list(found.get("items") or [])
