"""The `gpushare-device-plugin` process: wiring, serving, registration, background loops and shutdown.

Run it as a program (`gpushare-device-plugin` or `python -m deviceplugin.main`, settings from GPUSHARE_* env
and a few flags), or in-process:

    plugin = Plugin(settings)          # optional: api=..., inventory=..., public_key=..., holdings=...
    plugin.start()                     # serve on settings.socket_path, then register with the kubelet
    ...
    plugin.stop()                      # stop loops and server, remove the socket

or `run(settings, stop_event)`, which starts, waits for the event and stops (returns an exit status).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from deviceplugin import settings as plugin_settings
from deviceplugin.apiserver import ApiServer, ApiServerError, KubeApiServer
from deviceplugin.cdi import CdiStore
from deviceplugin.inventory import Inventory, InventoryError, XidWatcher, load_inventory
from deviceplugin.kubelet import KubeletHoldings, RestartWatch, register
from deviceplugin.owners import Holdings
from deviceplugin.server import OPTIONS, DevicePluginServicer, serve
from deviceplugin.service import Service
from deviceplugin.settings import PluginSettings
from webhook.settings import SettingsError
from webhook.signing import SigningKeyError, load_public_key

log = logging.getLogger(__name__)

GPU_COUNT = "aliyun.com/gpu-count"


class Plugin:
    """One device plugin for one node; start() and stop() may be called from any thread."""

    def __init__(
        self, settings: PluginSettings, *, api: ApiServer | None = None, inventory: Inventory | None = None,
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
        self._gc = threading.Thread(target=self._gc_loop, name="gc", daemon=True)

    def start(self) -> None:
        s = self.settings
        if self.inventory is None:
            self.inventory = load_inventory(s.fake_gpus, s.node_name, s.contract.unit, s.max_devices)
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
        if self.api is None:
            self._own_api = KubeApiServer(s.node_name, s.kubeconfig, s.rpc_timeout_seconds)
            self._own_api.start()
            self.api = self._own_api
        if self.holdings is None:
            self.holdings = KubeletHoldings(
                s.pod_resources_socket, s.kubelet_checkpoint, s.contract.resource, s.rpc_timeout_seconds
            )
        self.service = Service(s, self.inventory, self.api, self.holdings, self.public_key, cdi=CdiStore(s.cdi_dir))
        self.service.remember_pins()  # before serving: a container restarted now keeps the GPU it had
        os.makedirs(s.device_plugin_dir, exist_ok=True)
        registered = True
        try:
            self.serve_and_register()
        except grpc.RpcError as exc:
            registered = False
            log.warning("registering with the kubelet at %s failed (%s); retrying when it is up", s.kubelet_socket,
                        exc.code() if hasattr(exc, "code") else exc)
        self._watch = RestartWatch(s.kubelet_socket, s.socket_path, self.serve_and_register, s.watch_interval_seconds)
        self._watch.start(registered)
        self._gc.start()
        if self.inventory.real:
            self._xid = XidWatcher(self.inventory)
            self._xid.start()
        try:
            self.api.patch_node_capacity({GPU_COUNT: str(len(self.inventory.gpus))})
        except ApiServerError as exc:
            log.warning("could not publish %s on node %s: %s", GPU_COUNT, s.node_name, exc)
        log.info("gpushare device plugin serving %s (%d GPUs, %d devices, delivery %s, placement %s) on %s",
                 s.contract.resource, len(self.inventory.gpus), len(self.inventory.devices()), s.contract.delivery,
                 s.placement, s.socket_path)

    def serve_and_register(self) -> None:
        """(Re)serve on our socket, then register: the kubelet dials the endpoint as soon as it registers it."""
        s = self.settings
        assert self.inventory is not None
        with self._serve_lock:
            self._stop_server()
            self._servicer = DevicePluginServicer(self.service, self.inventory, self._stop, s.rpc_timeout_seconds)
            self._server = serve(self._servicer, s.socket_path)
            register(s.kubelet_socket, s.socket_name, s.contract.resource, OPTIONS, s.rpc_timeout_seconds)
        log.info("registered %s with the kubelet (endpoint %s)", s.contract.resource, s.socket_name)

    def _stop_server(self) -> None:
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
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.settings.socket_path)
        if self._gc.is_alive():
            self._gc.join(timeout=5)
        service: Service | None = getattr(self, "service", None)  # absent when start() failed before making it
        if service is not None:
            service.close()
        if self._own_api is not None:
            self._own_api.stop()
        if isinstance(self.holdings, KubeletHoldings):
            self.holdings.close()
        log.info("gpushare device plugin stopped; socket %s removed", self.settings.socket_path)


def run(settings: PluginSettings, stop_event: threading.Event) -> int:
    plugin = Plugin(settings)
    try:
        plugin.start()
    except (InventoryError, SigningKeyError, SettingsError) as exc:
        log.error("the gpushare device plugin cannot start: %s", exc)
        plugin.stop()
        return 2
    try:
        stop_event.wait()
    finally:
        plugin.stop()
    return 0


FLAGS = {
    "--node-name": "GPUSHARE_NODE_NAME",
    "--fake-gpus": "GPUSHARE_FAKE_GPUS",
    "--delivery": "GPUSHARE_DELIVERY",
    "--placement": "GPUSHARE_PLACEMENT",
    "--device-plugin-dir": "GPUSHARE_DEVICE_PLUGIN_DIR",
    "--kubeconfig": "GPUSHARE_KUBECONFIG",
    "--log-level": "GPUSHARE_LOG_LEVEL",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpushare-device-plugin",
        description="Kubelet device plugin for gpushare; every setting is a GPUSHARE_* variable (see "
        "docs/deviceplugin.md); these flags override the variables of the same name.",
    )
    for flag, variable in FLAGS.items():
        parser.add_argument(flag, dest=variable, help=f"overrides {variable}")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    try:
        settings = plugin_settings.from_environ(overrides)
    except SettingsError as exc:
        print(f"gpushare-device-plugin: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    stop_event = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received signal %s; shutting down", signum)
        stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return run(settings, stop_event)


if __name__ == "__main__":
    sys.exit(main())
