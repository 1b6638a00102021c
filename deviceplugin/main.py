"""The `gpushare-device-plugin` process: wiring, serving, registration, background loops and shutdown.

Run it as a program (`gpushare-device-plugin` or `python -m deviceplugin.main`, settings from GPUSHARE_* env
and a few flags), or in-process:

    plugin = Plugin(settings)          # optional: api=..., inventory=..., public_key=..., holdings=...
    plugin.start()                     # serve on a socket of its own (plugin.socket_path), then register
    ...
    plugin.stop()                      # stop loops and server, remove that socket

or `run(settings, stop_event)`, which starts, waits for the event and stops (returns an exit status).
`main` runs the plugin in a thread and keeps the main thread for signals: after SIGTERM the process stops
within GPUSHARE_SHUTDOWN_SECONDS whatever its threads are doing, or dumps every thread's stack and exits.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Sequence

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from common import logsetup
from common.settings import SettingsError
from contract.keys import GPU_COUNT
from contract.signing import SigningKeyError, load_public_key
from deviceplugin import settings as plugin_settings
from deviceplugin.apiserver import ApiServer, KubeApiServer
from deviceplugin.devices import UnitInventory
from deviceplugin.holders import Holdings
from deviceplugin.kubelet import KubeletHoldings, RegistrationError, RestartWatch, register
from deviceplugin.metrics import MeteredApiServer, PluginMetrics
from deviceplugin.server import OPTIONS, DevicePluginServicer, serve
from deviceplugin.service import Service
from deviceplugin.settings import PLUGIN_VARIABLES, PluginSettings
from deviceplugin.sockets import clear_stale, fresh_socket_path
from node import lifecycle
from node.apiclient import ApiServerError
from node.cdi import CdiStore
from node.inventory import InventoryError, load_inventory
from node.metrics import MetricsServer
from node.xid import XidWatcher

log = logging.getLogger(__name__)

# What stops the start with one line and exit status 2 (lifecycle.run).
START_FAILURES = (InventoryError, SigningKeyError, SettingsError, ApiServerError)


class Plugin:
    """One device plugin for one node; start() and stop() may be called from any thread."""

    def __init__(
        self, settings: PluginSettings, *, api: ApiServer | None = None, inventory: UnitInventory | None = None,
        public_key: Ed25519PublicKey | None = None, holdings: Holdings | None = None,
    ) -> None:
        self.settings = settings
        self.api = api
        self.inventory = inventory
        self.public_key = public_key
        self.holdings = holdings
        self._own_api: KubeApiServer | None = None
        self._server: grpc.Server | None = None
        self._servicer: DevicePluginServicer | None = None
        self._stop = threading.Event()
        self._serve_lock = threading.Lock()
        self._watch: RestartWatch | None = None
        self._xid: XidWatcher | None = None
        # The socket of the current serve, a new name each time (sockets.py), and its file's identity: stop()
        # removes only that file, never a socket of another plugin process, nor one it never made (a start that
        # failed before serving).
        self.socket_path: str | None = None
        self._socket: lifecycle.SocketId | None = None
        self._gc = threading.Thread(target=self._gc_loop, name="gc", daemon=True)
        self.metrics = PluginMetrics()
        self.metrics_server: MetricsServer | None = None

    def start(self) -> None:
        s = self.settings
        if self.inventory is None:
            self.inventory = UnitInventory.of(load_inventory(s.fake_gpus, s.node_name, s.contract.unit), s.max_devices)
        if self.public_key is None:
            try:
                with open(s.verify_key, "rb") as handle:
                    pem = handle.read()
            except OSError as exc:
                raise SigningKeyError(
                    f"GPUSHARE_VERIFY_KEY {s.verify_key} cannot be read ({exc}); mount the gpushare-verify-key "
                    "ConfigMap (signing.pub) there"
                ) from exc
            self.public_key = load_public_key(pem, f"GPUSHARE_VERIFY_KEY {s.verify_key}")
        try:
            os.makedirs(s.device_plugin_dir, exist_ok=True)
        except OSError as exc:
            raise SettingsError(
                f"GPUSHARE_DEVICE_PLUGIN_DIR={s.device_plugin_dir} cannot be created ({exc.strerror}); mount the "
                "kubelet's device-plugins directory (/var/lib/kubelet/device-plugins) there"
            ) from exc
        if self.api is None:
            self._own_api = KubeApiServer(s.node_name, s.kubeconfig, s.rpc_timeout_seconds)
            self._own_api.start()
            self.api = self._own_api
        if self.holdings is None:
            self.holdings = KubeletHoldings(
                s.pod_resources_socket, s.kubelet_checkpoint, s.contract.resource, s.rpc_timeout_seconds
            )
        api = MeteredApiServer(self.api, self.metrics)
        self.service = Service(s, self.inventory, api, self.holdings, self.public_key, cdi=CdiStore(s.cdi_dir),
                               metrics=self.metrics)
        if s.metrics_bind is not None:
            self.metrics.watch_node(self.inventory, self.service.context, api.node_pods)
            self.metrics_server = MetricsServer(s.metrics_bind, self.metrics.registry)
            log.info("serving Prometheus metrics on http://%s:%s/metrics", *self.metrics_server.address)
        self.service.records.remember_pins()  # before serving: a container restarted now keeps the GPU it had
        clear_stale(s)  # sockets of earlier instances: dead ones removed, live ones left to their instance
        registered = True
        try:
            self.serve_and_register()
        except RegistrationError as exc:
            registered = False
            log.warning("Registering with the kubelet failed: %s; registering as soon as %s appears (checked every "
                        "%g s).", exc, s.kubelet_socket, s.watch_interval_seconds)
        self._watch = RestartWatch(s.kubelet_socket, lambda: self.socket_path, self.serve_and_register,
                                   s.watch_interval_seconds)
        self._watch.start(registered)
        self._gc.start()
        if self.inventory.real:
            self._xid = XidWatcher(self.inventory)
            self._xid.start()
        try:
            api.patch_node_capacity({GPU_COUNT: str(len(self.inventory.gpus))})
        except ApiServerError as exc:
            log.warning("could not publish %s on node %s: %s", GPU_COUNT, s.node_name, exc)
        log.info("gpushare device plugin serving %s (%d GPUs, %d devices, delivery %s, placement %s) on %s",
                 s.contract.resource, len(self.inventory.gpus), len(self.inventory.devices()), s.contract.delivery,
                 s.placement, self.socket_path)

    def serve_and_register(self) -> None:
        """(Re)serve on a socket of a new name, then register: the kubelet dials the endpoint as soon as it registers
        it. Never the previous name: kubelet v1.37 refuses a path it still holds a connection to, for good
        (settings.socket_name)."""
        s = self.settings
        assert self.inventory is not None
        with self._serve_lock:
            # The previous server first: a kubelet before v1.37 that saw its stream end after our registration would
            # stop the new endpoint (kubelet.RestartWatch).
            self._stop_server()
            self._remove_socket()
            path = fresh_socket_path(s)
            self._servicer = DevicePluginServicer(self.service, self.inventory, self._stop, s.rpc_timeout_seconds,
                                                  self.metrics, on_dropped=self._dropped)
            self._server = serve(self._servicer, path)
            self.socket_path, self._socket = path, lifecycle.socket_id(path)
            endpoint = os.path.basename(path)
            try:
                register(s.kubelet_socket, endpoint, s.contract.resource, OPTIONS, s.rpc_timeout_seconds)
            except RegistrationError:
                self.metrics.registrations.labels("failed").inc()
                self.metrics.registered.set(0)
                raise
            self.metrics.registrations.labels("ok").inc()
            self.metrics.registered.set(1)
        log.info("registered %s with the kubelet (endpoint %s)", s.contract.resource, endpoint)

    def _dropped(self) -> None:
        """The kubelet ended our ListAndWatch stream while both kept running (kubelet.RestartWatch)."""
        if self._watch is not None:
            self._watch.request()

    def _stop_server(self) -> None:
        if self._servicer is not None:
            self._servicer.retire()  # the stream ends that stopping causes are ours, not a drop by the kubelet
        if self._server is not None:
            self._server.stop(grace=1).wait(timeout=5)
            self._server = None
        if self._servicer is not None:
            self._servicer.close()
            self._servicer = None

    def _gc_loop(self) -> None:
        while not self._stop.wait(self.settings.gc_interval_seconds):
            try:
                self.service.collect_garbage()
            except Exception:
                log.exception("garbage collection failed; will try again")

    def stop(self) -> None:
        self._stop.set()
        if self.inventory is not None:
            self.inventory.wake()
        if self._watch is not None:
            self._watch.stop()
        if self._xid is not None:
            self._xid.stop()
        with self._serve_lock:
            self._stop_server()
        socket_note = self._remove_socket()
        if self._gc.is_alive():
            self._gc.join(timeout=5)
        service: Service | None = getattr(self, "service", None)  # absent when start() failed before making it
        if service is not None:
            service.close()
        if self.metrics_server is not None:
            self.metrics_server.stop()
            self.metrics_server = None
        if self._own_api is not None:
            self._own_api.stop()
        if isinstance(self.holdings, KubeletHoldings):
            self.holdings.close()
        # After a failed start the one line saying why is enough; this one is for a plugin that served.
        log.log(logging.INFO if self._socket else logging.DEBUG, "gpushare device plugin stopped; %s", socket_note)

    def _remove_socket(self) -> str:
        if self.socket_path is None or self._socket is None:
            return "it had not created its socket"
        return lifecycle.remove_own_socket(self.socket_path, self._socket)


def run(settings: PluginSettings, stop_event: threading.Event) -> int:
    return lifecycle.run(Plugin(settings), stop_event, START_FAILURES, "device plugin", log)


FLAGS = {
    "--node-name": "GPUSHARE_NODE_NAME",
    "--fake-gpus": "GPUSHARE_FAKE_GPUS",
    "--delivery": "GPUSHARE_DELIVERY",
    "--placement": "GPUSHARE_PLACEMENT",
    "--device-plugin-dir": "GPUSHARE_DEVICE_PLUGIN_DIR",
    "--kubeconfig": "GPUSHARE_KUBECONFIG",
    "--log-level": "GPUSHARE_LOG_LEVEL",
}


def serve_until_signalled(settings: PluginSettings) -> int:
    """The plugin in a thread until SIGTERM or SIGINT, stopped within GPUSHARE_SHUTDOWN_SECONDS (node/lifecycle.py)."""
    return lifecycle.serve_until_signalled(lambda stop: run(settings, stop), settings.shutdown_seconds,
                                           "device plugin", log)


def main(argv: Sequence[str] | None = None) -> int:
    settings = lifecycle.command_line_settings(
        argv, "gpushare-device-plugin", "Kubelet device plugin for gpushare (docs/deviceplugin.md).",
        PLUGIN_VARIABLES, FLAGS, plugin_settings.from_environ, "device plugin",
    )
    if settings is None:
        return 2
    logsetup.configure(settings.log_level, settings.log_format)
    return serve_until_signalled(settings)


if __name__ == "__main__":
    sys.exit(main())
