"""A test Kubernetes API server on 127.0.0.1 over HTTPS, with kube-apiserver's webhook admission chain.

Usage:

    with ApiServer() as api:                      # own CA, serving cert for 127.0.0.1, free port
        api.services[("gpushare-system", "gpushare-webhook", 443)] = "https://127.0.0.1:8443"
        api.load_webhook_configurations(objects, ca_pem=webhook_ca)
        token = api.add_user(service_account("kube-system", "gpushare-schd-extender"))
        client = api.client(token)                # tests.harness.apiserver.client.SimClient
        api.write_kubeconfig(tmp_path / "kubeconfig", token)   # for kubectl and the kubernetes client
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.harness.apiserver.admission import Chain
from tests.harness.apiserver.auth import ADMIN, Tokens, User
from tests.harness.apiserver.client import SimClient
from tests.harness.apiserver.configs import webhook_configurations
from tests.harness.apiserver.handler import Handler
from tests.harness.apiserver.kubeconfig import write_kubeconfig
from tests.harness.apiserver.registry import Deletion, Registry
from tests.harness.apiserver.resources import Resource, resource
from tests.harness.apiserver.status import ApiError
from tests.harness.apiserver.store import HISTORY, Store
from tests.harness.tls import Authority, server_context

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# (user, verb, resource, subresource, namespace, name) -> None to allow, or the reason it is forbidden.
Authorizer = Callable[[User, str, Resource, str, str, str], str | None]
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "gpushare-system")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-request (kubectl --timeout, a closed watch) is routine in tests.
        log.debug("connection from %s ended with an error", client_address)


class ApiServer:
    """Pods, nodes, events, namespaces, secrets, configmaps and webhook configurations, with admission.

    `services` maps (namespace, service, port) to the https://127.0.0.1:PORT address a webhook really
    listens on: it replaces cluster DNS and Service endpoints, while TLS is still verified for
    `<service>.<namespace>.svc` against the configuration's caBundle.
    """

    def __init__(
        self,
        *,
        deletion: Deletion = "kubelet",
        grace_cap: float | None = None,
        services: Mapping[tuple[str, str, int], str] | None = None,
        authorize: Authorizer | None = None,
        bookmark_interval: float = 5.0,
        max_body_bytes: int = 3 * 1024 * 1024,
        history: int = HISTORY,
    ) -> None:
        self.authority = Authority("gpushare-sim-apiserver-ca")
        self._serving = self.authority.issue(["localhost", "kubernetes", "kubernetes.default.svc"], ["127.0.0.1"])
        self.store = Store(history)
        self.tokens = Tokens()
        self.services: dict[tuple[str, str, int], str] = dict(services or {})
        self.chain = Chain(self.store, self.services, self._namespace_labels)
        self.registry = Registry(self.store, self.chain, deletion, grace_cap)
        self.bookmark_interval = bookmark_interval
        self.max_body_bytes = max_body_bytes
        self._authorize = authorize
        self.admin_token = self.tokens.add(ADMIN)
        self.stopping = False
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self.connections_opened = 0  # every connection a client opened, closed since or not
        for name in DEFAULT_NAMESPACES:
            self.registry.ensure_namespace(name)

    def _namespace_labels(self, name: str) -> dict[str, str]:
        return self.registry.namespace_labels(name)

    # --- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> ApiServer:
        context = server_context(self._serving)
        handler = type("BoundHandler", (Handler,), {"api": self})
        server = _Server(("127.0.0.1", 0), handler)
        # The handshake happens lazily in each connection's thread, so a slow client cannot block accept().
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="sim-apiserver", daemon=True)
        self._thread.start()
        log.info("test API server listening on %s", self.url)
        return self

    def stop(self) -> None:
        """End watches, close connections and the listener, cancel deletion timers; safe to call twice."""
        self.stopping = True
        self.store.close_all_watches()
        self.registry.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def track(self, conn: socket.socket, opened: bool) -> None:
        with self._connections_lock:
            if opened:
                self._connections.add(conn)
                self.connections_opened += 1
            else:
                self._connections.discard(conn)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the test API server is not started; call start() or use it as a context manager")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_pem(self) -> bytes:
        """The CA that signed the server's certificate: what clients verify against."""
        return self.authority.cert_pem

    # --- identities and clients -------------------------------------------------------------------------------

    def add_user(self, who: User, token: str | None = None) -> str:
        """A bearer token that authenticates as `who`."""
        return self.tokens.add(who, token)

    def client(self, token: str | None = None, timeout: float = 30.0) -> SimClient:
        token = token or self.admin_token
        who = self.tokens.lookup(token)
        return SimClient(self.url, token, self.ca_pem, timeout=timeout, username=who.username if who else "")

    def write_kubeconfig(self, path: Path | str, token: str | None = None, user_name: str = "sim-user") -> Path:
        return write_kubeconfig(Path(path), self.url, self.ca_pem, token or self.admin_token, user_name)

    def authorize(self, who: User, verb: str, res: Resource, *where: str) -> str | None:
        """`where` is (subresource, namespace, name)."""
        if self._authorize is None:
            return None
        return self._authorize(who, verb, res, *where)

    # --- setup helpers ----------------------------------------------------------------------------------------

    def add_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> Obj:
        return self.registry.ensure_namespace(name, dict(labels or {}))

    def add_service(self, namespace: str, name: str, port: int, address: str) -> None:
        """Route the Service `namespace/name:port` to `address` (https://127.0.0.1:PORT)."""
        self.services[(namespace, name, port)] = address

    def load_webhook_configurations(
        self, objects: Iterable[Mapping[str, Any]], ca_pem: bytes | None = None
    ) -> list[str]:
        """Create or replace the Mutating/ValidatingWebhookConfigurations among `objects` (rendered manifests),
        with caBundle set from `ca_pem` where given; other objects are ignored. Returns the kinds/names loaded."""
        loaded = []
        for key, config in webhook_configurations(objects, ca_pem):
            res = resource(key)
            name = config["metadata"]["name"]
            if self.store.get(res.key, "", name) is not None:
                self.registry.delete(res, "", name, {}, user=ADMIN)
            self.registry.create(res, "", config, ADMIN)
            loaded.append(f"{res.kind}/{name}")
        return loaded

    def object(self, key: str, namespace: str, name: str) -> Obj:
        """Read straight from storage (no HTTP), e.g. for invariant checks; 404 ApiError when absent."""
        found = self.store.get(key, namespace, name)
        if found is None:
            raise ApiError(404, f'{key} "{name}" not found in namespace "{namespace}"', "NotFound")
        return found


__all__ = ["ApiServer", "Authorizer"]
