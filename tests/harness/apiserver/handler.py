"""The HTTP side of the test API server: authentication, routing, JSON bodies, and chunked watch streams."""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import select
import socket
import ssl
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from tests.harness.apiserver.auth import acting_as
from tests.harness.apiserver.resources import BY_PATH, Resource
from tests.harness.apiserver.selectors import parse_field_selector, parse_label_selector
from tests.harness.apiserver.status import ApiError, bad_request, forbidden, internal, not_found

if TYPE_CHECKING:
    from tests.harness.apiserver.auth import User
    from tests.harness.apiserver.server import ApiServer

log = logging.getLogger(__name__)

Obj = dict[str, Any]

# What /version answers (kubernetes clients read it; no discovery documents are served: kubectl runs against the
# real API server of the real-cluster tier).
VERSION: Obj = {
    "major": "1", "minor": "32", "gitVersion": "v1.32.0-gpushare-sim", "gitCommit": "simulation",
    "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23", "compiler": "gc",
    "platform": "linux/amd64",
}
WATCH_MAX_SECONDS = 1800.0  # the real server picks 30-60 minutes; clients re-watch either way


class Route:
    def __init__(self, resource: Resource, namespace: str, name: str, subresource: str) -> None:
        self.resource, self.namespace, self.name, self.subresource = resource, namespace, name, subresource


def parse_route(parts: list[str]) -> Route | None:
    """`/api/v1/...` or `/apis/<group>/<version>/...` into resource, namespace, name and subresource."""
    if parts[0] == "api" and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[0] == "apis" and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3 and (group, version, rest[2]) in BY_PATH:
        namespace, rest = rest[1], rest[2:]
    resource = BY_PATH.get((group, version, rest[0]))
    if resource is None or len(rest) > 3:
        return None
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if subresource and subresource not in resource.subresources:
        return None
    if namespace and not resource.namespaced:
        return None
    return Route(resource, namespace, name, subresource)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: ApiServer  # set on the subclass the server builds

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def setup(self) -> None:
        super().setup()
        # Headers and body are written separately: without TCP_NODELAY, Nagle's algorithm and the client's
        # delayed ACK add ~40 ms to every answer (Go's net/http sets it by default too).
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.api.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.api.track(self.connection, False)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # --- plumbing ---------------------------------------------------------------------------------------------

    def _send(self, code: int, body: Obj | str) -> None:
        warnings = self.api.registry.take_warnings()
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        for warning in warnings:
            self.send_header("Warning", f'299 - "{warning}"')
        self.end_headers()
        self.wfile.write(data)

    def _read_raw(self) -> bytes:
        """Read the whole body first, so an early error never leaves bytes that break the next keep-alive request."""
        length = int(self.headers.get("Content-Length") or 0)
        if length > self.api.max_body_bytes:
            self.close_connection = True
            raise ApiError(413, f"the request body of {length} bytes is larger than the limit of "
                           f"{self.api.max_body_bytes} bytes")
        return self.rfile.read(length) if length else b""

    def _body(self) -> Any:
        if not self._raw:
            return None
        try:
            return json.loads(self._raw)
        except ValueError:
            media = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            raise bad_request(f"the request body is not valid JSON (content type {media or 'unset'}); "
                              "the test API server accepts JSON only") from None

    def _user(self) -> User:
        header = self.headers.get("Authorization") or ""
        scheme, _, token = header.partition(" ")
        found = self.api.tokens.lookup(token.strip()) if scheme.lower() == "bearer" else None
        if found is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return acting_as(found, self.headers.get("Impersonate-User") or "",
                         self.headers.get_all("Impersonate-Group") or [], self.api.authorize)

    def _dispatch(self, method: str) -> None:
        self._raw = b""
        self.api.registry.take_warnings()
        try:
            self._raw = self._read_raw()
            url = urllib.parse.urlsplit(self.path)
            query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
            parts = [urllib.parse.unquote(p) for p in url.path.split("/") if p]
            if url.path in ("/healthz", "/readyz", "/livez"):
                self._send(200, "ok")
                return
            if url.path == "/version":
                self._send(200, VERSION)
                return
            user = self._user()
            route = parse_route(parts) if parts else None
            if route is None:
                raise ApiError(404, f"the server could not find the requested resource ({method} {url.path})",
                               "NotFound")
            self._resource(method, route, query, user)
        except ApiError as exc:
            self._send(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug in the simulation must still answer like a server, never hang a client
            log.exception("test API server failed on %s %s", method, self.path)
            self._send(500, internal(f"the test API server failed: {exc!r}").status())

    # --- resources --------------------------------------------------------------------------------------------

    def _resource(self, method: str, route: Route, query: dict[str, str], user: User) -> None:
        r, ns, name, sub = route.resource, route.namespace, route.name, route.subresource
        watch = query.get("watch", "") in ("1", "true", "True")
        verb = {"GET": ("watch" if watch else "list") if not name else "get", "POST": "create", "PUT": "update",
                "PATCH": "patch", "DELETE": "delete"}[method]
        problem = self.api.authorize(user, verb, r, sub, ns, name)
        if problem:
            raise forbidden(problem)
        if r.namespaced and not ns and (name or method != "GET"):
            raise ApiError(404, f"{r.plural} must be addressed inside a namespace", "NotFound")
        dry_run = query.get("dryRun") == "All"
        registry, store = self.api.registry, self.api.store
        if method == "GET" and not name:
            if watch:
                self._watch(r, ns, query)
                return
            items, rv = store.list(r.key, ns or None, self._predicate(query))
            self._send(200, {"kind": r.list_kind, "apiVersion": r.api_version,
                             "metadata": {"resourceVersion": str(rv)}, "items": items})
        elif method == "GET" and sub != "binding":
            obj = store.get(r.key, ns, name)
            if obj is None:
                raise not_found(r.plural, name, r.group)
            self._send(200, obj)
        elif method == "POST" and sub == "binding":
            registry.bind(ns, name, self._body(), user, dry_run)
            self._send(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
        elif method == "POST" and not name:
            self._send(201, registry.create(r, ns, self._body(), user, dry_run))
        elif method == "PUT" and name and sub != "binding":
            self._send(200, registry.update(r, ns, name, self._body(), user=user, dry_run=dry_run, subresource=sub))
        elif method == "PATCH" and name and sub != "binding":
            content_type = self.headers.get("Content-Type") or ""
            self._send(200, registry.patch(
                r, ns, name, content_type, self._body(), user=user, dry_run=dry_run, subresource=sub))
        elif method == "DELETE" and name and not sub:
            options = self._body() or {}
            if not isinstance(options, dict):
                raise bad_request("the DELETE body must be a DeleteOptions object")
            if "gracePeriodSeconds" in query:
                options["gracePeriodSeconds"] = _int(query["gracePeriodSeconds"], "gracePeriodSeconds")
            self._send(200, registry.delete(r, ns, name, options, user=user, dry_run=dry_run))
        else:
            raise ApiError(405, f"the server does not allow {method} on this resource path", "MethodNotAllowed")

    def _predicate(self, query: dict[str, str]) -> Any:
        labels = parse_label_selector(query.get("labelSelector"))
        fields = parse_field_selector(query.get("fieldSelector"))
        return lambda obj: fields(obj) and labels((obj.get("metadata") or {}).get("labels") or {})

    def _watch(self, r: Resource, ns: str, query: dict[str, str]) -> None:
        """Stream events as JSON lines in HTTP chunks until timeoutSeconds, the client leaves, or the server stops.

        Simplification: timeoutSeconds may be fractional (the real server takes whole seconds).
        """
        since_text = query.get("resourceVersion", "")
        since = None if since_text in ("", "0") else _int(since_text, "resourceVersion")
        try:
            timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else WATCH_MAX_SECONDS
        except ValueError:
            raise bad_request(f"timeoutSeconds={query['timeoutSeconds']!r} is not a number of seconds") from None
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true", "True")
        predicate = self._predicate(query)  # a bad selector is a 400 before the stream starts
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        # The connection closes after the stream, and says so: a client that pooled it for its next request (urllib3
        # does) would write that request into a closed socket and read no answer (RemoteDisconnected, not retried).
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            watcher = self.api.store.watch(r.key, ns or None, since, predicate)
        except ApiError as exc:
            self._chunk({"type": "ERROR", "object": exc.status()})
            self._chunk_end()
            return
        deadline = time.monotonic() + timeout
        last_sent = time.monotonic()
        try:
            while not self.api.stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    event = watcher.events.get(timeout=min(0.2, left))
                except queue.Empty:
                    if self._client_gone():
                        break
                    if bookmarks and time.monotonic() - last_sent > self.api.bookmark_interval:
                        self._bookmark(r)
                        last_sent = time.monotonic()
                    continue
                if event is None:
                    break
                self._chunk({"type": event.type, "object": event.obj})
                last_sent = time.monotonic()
            self._chunk_end()
        except OSError:
            pass  # the client went away
        finally:
            self.api.store.unwatch(watcher)

    def _client_gone(self) -> bool:
        """A watch client sends nothing, so a readable socket means it closed (FIN or TLS close_notify)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and not self.connection.recv(1)
        except ssl.SSLWantReadError:
            return False  # part of a TLS record arrived; not a close yet
        except OSError:
            return True

    def _bookmark(self, r: Resource) -> None:
        rv = str(self.api.store.resource_version)
        self._chunk({"type": "BOOKMARK", "object": {"kind": r.kind, "apiVersion": r.api_version,
                                                     "metadata": {"resourceVersion": rv}}})

    def _chunk(self, body: Obj) -> None:
        data = (json.dumps(body) + "\n").encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _chunk_end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise bad_request(f"{what}={text!r} is not an integer") from None


