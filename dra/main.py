"""The `gpushare-dra-plugin` process: the DRA driver's wiring, its two sockets, the slice keeper and shutdown.

Run it as a program (`gpushare-dra-plugin` or `python -m dra.main`, settings from GPUSHARE_* env and
a few flags), or in-process:

    plugin = DraPlugin(settings)       # optional: kube=... (claims and slices), inventory=...
    plugin.start()                     # serve dra.sock, the registration socket, health.sock; publish the slices
    ...
    plugin.stop()                      # stop the keeper and the servers, remove the sockets it made

or `run(settings, stop_event)`, which starts, waits for the event and stops (returns an exit status).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import grpc
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from common import logsetup
from common.buildinfo import BuildInfo
from common.settings import SettingsError
from dra import settings as dra_settings
from dra.checkpoint import Checkpoint, CheckpointError
from dra.coreapi import CoreV1
from dra.driver import ClaimSource, Driver
from dra.health import HealthServicer
from dra.keeper import SliceApi, SliceKeeper
from dra.kube import KubeDra
from dra.resourceapi import ResourceV1
from dra.servicer import DRAPluginServicer, RegistrationServicer, serve_health, serve_plugin, serve_registration
from dra.settings import DRA_VARIABLES, DraSettings
from node import lifecycle
from node.apiclient import ApiServerError, KubeClient
from node.cdi import CdiStore
from node.inventory import Inventory, InventoryError, load_inventory
from node.metrics import MetricsServer
from node.xid import XidWatcher

log = logging.getLogger(__name__)

START_FAILURES = (InventoryError, CheckpointError, SettingsError, ApiServerError)




class DraApi(ClaimSource, SliceApi, Protocol):
    """The API server as the driver sees it: dra.kube.KubeDra, or a fake in tests."""


class DraPlugin:
    """The DRA driver of one node; start() and stop() may be called from any thread, stop() after a failed start."""

    def __init__(
        self, settings: DraSettings, *, kube: DraApi | None = None, inventory: Inventory | None = None
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.inventory = inventory
        self.driver: Driver | None = None
        self.keeper: SliceKeeper | None = None
        self._xid: XidWatcher | None = None
        self.registration: RegistrationServicer | None = None
        self.metrics_server: MetricsServer | None = None
        self._own_api: KubeClient | None = None
        self._servicer: DRAPluginServicer | None = None
        self._servers: list[grpc.Server] = []
        self._serving = False  # from a start that served every socket to the stop
        # The socket files this driver created (device, inode, ctime) by path: stop() removes only those, never a
        # socket another driver process made at the same path since, nor one it never made (a failed start).
        self._sockets: dict[str, lifecycle.SocketId] = {}

    def start(self) -> None:
        s, n = self.settings, self.settings.node
        if self.inventory is None:
            self.inventory = load_inventory(n.fake_gpus, n.node_name, n.contract.unit)
        if not self.inventory.gpus:
            raise InventoryError(f"node {n.node_name} has no GPU, so its ResourceSlice would offer nothing; run the "
                                 "DRA driver only on GPU nodes")
        for variable, path in (("GPUSHARE_DRA_STATE_DIR", s.state_dir), ("GPUSHARE_DRA_PLUGIN_DIR", s.plugin_dir),
                               ("GPUSHARE_DRA_REGISTRY_DIR", s.registry_dir)):
            _make_directory(variable, path)
        if self.kube is None:
            self._own_api = KubeClient(n.kubeconfig, s.timeout_seconds)
            self.kube = KubeDra(ResourceV1(self._own_api), CoreV1(self._own_api))
        self.keeper = SliceKeeper(self.kube, n.node_name, self.inventory, n.contract.unit, s.resync_seconds)
        # Loads the checkpoint: a corrupt one stops the start (CheckpointError), before anything is served.
        self.driver = Driver(n.node_name, self.inventory, n.contract.unit, source=self.kube,
                             checkpoint=Checkpoint(s.state_dir), cdi=CdiStore(n.cdi_dir), fake_gpu_dir=n.fake_gpu_dir)
        self._servicer = DRAPluginServicer(self.driver, s.timeout_seconds)
        servicer = self._servicer
        # The kubelet dials the endpoint as soon as it reads the registration socket: serve dra.sock first.
        self._serve("GPUSHARE_DRA_PLUGIN_DIR", s.socket_path, lambda: serve_plugin(servicer, s.socket_path))
        self.registration = RegistrationServicer(s.socket_path)
        registration = self.registration
        self._serve("GPUSHARE_DRA_REGISTRY_DIR", s.registration_path,
                    lambda: serve_registration(registration, s.registration_path))
        health = HealthServicer(self.ready, self.alive)
        self._serve("GPUSHARE_DRA_PLUGIN_DIR", s.health_path, lambda: serve_health(health, s.health_path))
        self._serving = True
        if n.metrics_bind is not None:
            self.metrics_server = MetricsServer(n.metrics_bind, self.metrics_registry())
            log.info("serving Prometheus metrics on http://%s:%s/metrics", *self.metrics_server.address)
        self.keeper.step()
        self.keeper.start()
        if self.inventory.real:  # a GPU with a critical XID leaves the pool at once (health.go of NVIDIA's plugin)
            keeper = self.keeper
            self._xid = XidWatcher(self.inventory, on_event=lambda gpu, xid: keeper.wake())
            self._xid.start()
        log.info("gpushare DRA driver serving %d GPUs of node %s on %s, registration on %s, ResourceSlice checked "
                 "every %g s", len(self.inventory.gpus), n.node_name, s.socket_path, s.registration_path,
                 s.resync_seconds)

    def alive(self) -> bool:
        """The liveness probe's answer: the driver serves its sockets (it may still wait on the API server)."""
        return self._serving

    def ready(self) -> bool:
        """The readiness probe's answer: the kubelet registered the driver, its DRA service serves, and the last
        check of the node's ResourceSlices found or left them published."""
        registration, keeper = self.registration, self.keeper
        return (self._serving and registration is not None and registration.registered.is_set()
                and keeper is not None and keeper.published)

    def _serve(self, variable: str, path: str, serve: Callable[[], grpc.Server]) -> None:
        try:
            self._servers.append(serve())
        except RuntimeError as exc:  # grpc's "Failed to bind to address"
            raise SettingsError(f"{variable}: the DRA driver cannot listen on {path} ({exc}); mount that node "
                                "directory read-write into the driver") from exc
        socket = lifecycle.socket_id(path)
        if socket is not None:
            self._sockets[path] = socket

    def metrics_registry(self) -> CollectorRegistry:
        registry = CollectorRegistry()
        registry.register(_DraCollector(self))
        registry.register(BuildInfo("dra-plugin"))
        return registry

    def stop(self) -> None:
        self._serving = False  # not ready, not alive: the probes say so while the servers stop
        if self._xid is not None:
            self._xid.stop()
            self._xid = None
        if self.keeper is not None:
            self.keeper.stop()
        for server in reversed(self._servers):  # health, then registration: the kubelet stops sending work
            server.stop(grace=1).wait(timeout=5)
        self._servers.clear()
        if self._servicer is not None:
            self._servicer.close()
        notes = [lifecycle.remove_own_socket(path, socket) for path, socket in self._sockets.items()]
        if self.metrics_server is not None:
            self.metrics_server.stop()
            self.metrics_server = None
        if self._own_api is not None:
            self._own_api.close()
            self._own_api = None
        # After a failed start the one line saying why is enough; this one is for a driver that served.
        log.log(logging.INFO if notes else logging.DEBUG, "gpushare DRA driver stopped; %s",
                "; ".join(notes) or "it had not created its sockets")
        self._sockets.clear()


def _make_directory(variable: str, path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise SettingsError(f"{variable}={path} cannot be created ({exc.strerror}); mount that node directory "
                            "read-write into the driver") from exc


class _DraCollector:
    """The driver's numbers, read when scraped."""

    def __init__(self, plugin: DraPlugin) -> None:
        self.plugin = plugin

    def collect(self) -> Iterator[Metric]:
        keeper, driver = self.plugin.keeper, self.plugin.driver
        yield CounterMetricFamily("gpushare_dra_slice_writes", "Writes of the node's ResourceSlice (it was missing "
                                  "or differed).", value=keeper.writes if keeper else 0)
        yield CounterMetricFamily("gpushare_dra_slice_failures", "Checks of the node's ResourceSlice that failed to "
                                  "read or write it.", value=keeper.failures if keeper else 0)
        yield GaugeMetricFamily("gpushare_dra_prepared_claims", "ResourceClaims prepared on this node (the "
                                "checkpoint's).", value=len(driver.prepared()) if driver else 0)
        yield GaugeMetricFamily("gpushare_dra_slices_published", "1 while the last check of the node's ResourceSlices "
                                "found or left them all published and current, 0 after a check that failed to.",
                                value=1 if keeper and keeper.published else 0)
        registration = self.plugin.registration
        yield GaugeMetricFamily("gpushare_dra_registered", "1 once the kubelet said it registered the driver, 0 "
                                "before and after it refused to.",
                                value=1 if registration and registration.registered.is_set() else 0)


def run(settings: DraSettings, stop_event: threading.Event, plugin: DraPlugin | None = None) -> int:
    return lifecycle.run(plugin or DraPlugin(settings), stop_event, START_FAILURES, "DRA driver", log)


FLAGS = {
    "--node-name": "GPUSHARE_NODE_NAME",
    "--fake-gpus": "GPUSHARE_FAKE_GPUS",
    "--kubeconfig": "GPUSHARE_KUBECONFIG",
    "--log-level": "GPUSHARE_LOG_LEVEL",
}


def serve_until_signalled(settings: DraSettings) -> int:
    """The driver in a thread until SIGTERM or SIGINT, stopped within GPUSHARE_SHUTDOWN_SECONDS (node/lifecycle.py)."""
    return lifecycle.serve_until_signalled(lambda stop: run(settings, stop), settings.node.shutdown_seconds,
                                           "DRA driver", log)


def main(argv: Sequence[str] | None = None) -> int:
    settings = lifecycle.command_line_settings(
        argv, "gpushare-dra-plugin", "Kubelet DRA driver for gpushare: GPU memory as consumable capacity "
        "(docs/dra.md).", DRA_VARIABLES, FLAGS, dra_settings.from_environ, "DRA driver",
    )
    if settings is None:
        return 2
    logsetup.configure(settings.node.log_level, settings.node.log_format)
    return serve_until_signalled(settings)


if __name__ == "__main__":
    sys.exit(main())
