"""Wiring of one simulated cluster: the test API server, the real webhook, plugins, kubelets and the extender.

`ours`: the webhook's configurations from manifests/base/admission.yaml are loaded into the API server (the
Service routes to a running gunicorn webhook) and every node runs the real `deviceplugin.main.Plugin`,
which reaches the API server through a kubeconfig with its own service-account token.
`baseline`: no webhook at all (the reference deployment has none) and every node runs `BaselinePlugin`.
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from contract import DEFAULT_RESOURCE
from node.inventory import fake_gpus
from tests.harness.apiserver.auth import pod_token, service_account, user
from tests.harness.apiserver.client import SimClient
from tests.harness.apiserver.configs import load_yaml_documents
from tests.harness.apiserver.ports import Pod, PodApi
from tests.harness.apiserver.server import ApiServer
from tests.harness.judge import Observation
from tests.harness.kubelet.node import Kubelet, KubeletConfig
from tests.harness.sim.baseline import BaselinePlugin
from tests.harness.sim.extender import Extender, SimNode
from tests.harness.sim.replicaset import ReplicaSet

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[3]
ADMISSION_MANIFEST = REPO / "manifests" / "base" / "admission.yaml"
PLUGIN_SA = service_account("gpushare-system", "gpushare-device-plugin")
EXTENDER_SA = service_account("kube-system", "gpushare-schd-extender")
RS_SA = service_account("kube-system", "replicaset-controller")
USER = user("alice", "developers")

PluginKind = Literal["ours", "baseline"]


class Webhook(Protocol):
    """What the cluster needs of a running webhook (tests.harness.webhook.server.RunningWebhook has it)."""

    url: str
    ca_pem: bytes
    public_key_path: Path


@dataclass(frozen=True)
class ClusterSpec:
    nodes: int = 1
    gpus: str = "2x8GiB"  # per node, GPUSHARE_FAKE_GPUS syntax
    plugin: PluginKind = "ours"
    delivery: str = "env"
    unit: str = "GiB"
    seed: int = 0
    pull_delay: tuple[float, float] = (0.01, 0.05)
    max_jitter_s: float = 0.02
    binders: int = 4  # bindings in flight at once (the kube-scheduler binds each pod in its own goroutine)
    placement: str = "extender"  # or "node": no extender, the plugin picks the GPU (cdi delivery only)
    # The kubelet tries to start the first container of a pod deleted while its image pulled (kubelet_parts.py).
    start_deleted: bool = True


class SimCluster:
    """Start with start() (or `with`); close() stops every actor and server and removes the temp directory."""

    def __init__(self, spec: ClusterSpec, webhook: Webhook | None = None) -> None:
        if spec.plugin == "ours" and webhook is None:
            raise ValueError("the `ours` cluster needs a running webhook (tests.harness.webhook.server)")
        self.spec = spec
        self.webhook = webhook
        self.workdir = Path(tempfile.mkdtemp(prefix="gpushare-sim-"))
        self.api = ApiServer(deletion="kubelet")
        self.kubelets: list[Kubelet] = []
        self.plugins: list[BaselinePlugin | _OurPlugin] = []
        self.replicasets: list[ReplicaSet] = []
        self.extender: Extender | None = None
        self._user: PodApi | None = None
        self._admin: SimClient | None = None

    @property
    def user(self) -> PodApi:
        """An ordinary user (alice): what `kubectl create` by a developer goes through."""
        if self._user is None:
            raise RuntimeError("the cluster is not started; call start() or use it as a context manager")
        return self._user

    @property
    def admin(self) -> SimClient:
        if self._admin is None:
            raise RuntimeError("the cluster is not started; call start() or use it as a context manager")
        return self._admin

    def __enter__(self) -> SimCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        spec = self.spec
        self.api.start()
        self._user = self.api.client(self.api.add_user(USER))
        self._admin = self.api.client()
        if spec.plugin == "ours":
            assert self.webhook is not None
            self.api.add_service("gpushare-system", "gpushare-webhook", 443, self.webhook.url)
            docs = load_yaml_documents(ADMISSION_MANIFEST.read_text())
            self.api.load_webhook_configurations(docs, ca_pem=self.webhook.ca_pem)
        nodes = []
        for i in range(spec.nodes):
            name = f"node-{i}"
            gpus = tuple(fake_gpus(spec.gpus, name, spec.unit))
            nodes.append(SimNode(name, gpus))
            total = str(sum(g.memory_units for g in gpus))
            self.admin.create("nodes", {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "status": {"capacity": {DEFAULT_RESOURCE: total}, "allocatable": {DEFAULT_RESOURCE: total}},
            })
            node_client = self.api.client(self.api.add_user(user(f"system:node:{name}", "system:nodes")))
            # The reference plugin delivers by env in any mode; ours in cdi mode runs beside a runtime that
            # ignores the variable (docs/security.md).
            env_interface = spec.plugin == "baseline" or spec.delivery == "env"
            config = KubeletConfig(name, str(self.workdir / name), gpus, pull_delay=self._pull_delay,
                                   seed=spec.seed * 100 + i, env_interface=env_interface,
                                   start_deleted=spec.start_deleted)
            kubelet = Kubelet(config, node_client)
            kubelet.start()
            self.kubelets.append(kubelet)
            # Each node's plugin authenticates with its own pod's token, which names the node, as on a real cluster.
            plugin_token = self.api.add_user(pod_token(PLUGIN_SA, f"gpushare-device-plugin-{name}", name))
            self.plugins.append(self._plugin(kubelet, plugin_token))
            if not kubelet.wait_registered(15):
                raise RuntimeError(f"the {spec.plugin} device plugin on {name} did not register with the kubelet")
        self.extender = Extender(self.api.client(self.api.add_user(EXTENDER_SA)), nodes, seed=spec.seed,
                                 max_jitter_s=spec.max_jitter_s, binders=spec.binders,
                                 place_gpus=spec.placement == "extender")
        self.extender.start()

    def _plugin(self, kubelet: Kubelet, token: str) -> BaselinePlugin | _OurPlugin:
        cfg = kubelet.config
        if self.spec.plugin == "baseline":
            baseline = BaselinePlugin(cfg.node, cfg.plugin_dir, cfg.gpus, self.api.client(token), unit=self.spec.unit)
            baseline.start()
            return baseline
        from deviceplugin.main import Plugin
        from deviceplugin.settings import settings_from

        assert self.webhook is not None
        kubeconfig = self.api.write_kubeconfig(self.workdir / f"{cfg.node}.kubeconfig", token, "gpushare-plugin")
        settings = settings_from({
            "GPUSHARE_NODE_NAME": cfg.node,
            "GPUSHARE_VERIFY_KEY": str(self.webhook.public_key_path),
            "GPUSHARE_FAKE_GPUS": self.spec.gpus,
            "GPUSHARE_UNIT": self.spec.unit,
            "GPUSHARE_DELIVERY": self.spec.delivery,
            "GPUSHARE_DEVICE_PLUGIN_DIR": cfg.plugin_dir,
            "GPUSHARE_POD_RESOURCES_SOCKET": cfg.pod_resources_socket,
            "GPUSHARE_KUBELET_CHECKPOINT": cfg.checkpoint,
            "GPUSHARE_CDI_DIR": cfg.cdi_dir,
            "GPUSHARE_FAKE_GPU_DIR": cfg.fake_gpu_dir,
            "GPUSHARE_KUBECONFIG": str(kubeconfig),
            "GPUSHARE_PLACEMENT": self.spec.placement,
            "GPUSHARE_METRICS_BIND": "127.0.0.1:0",
        })
        plugin = Plugin(settings)  # it sees a simulated kubelet restart through its directory watch, as on a node
        plugin.start()
        return _OurPlugin(plugin.stop, plugin.service.events.flush)

    def _pull_delay(self, pod: Pod) -> float:
        low, high = self.spec.pull_delay
        name = (pod.get("metadata") or {}).get("name", "")
        return random.Random(f"{self.spec.seed}/{name}").uniform(low, high)

    def replicaset(self, namespace: str, name: str, replicas: int, template: Pod) -> ReplicaSet:
        rs = ReplicaSet(self.api.client(self.api.add_user(RS_SA)), namespace, name, replicas, template)
        rs.start()
        self.replicasets.append(rs)
        return rs

    def observe(self, namespace: str, deleted: set[str]) -> Observation:
        for plugin in self.plugins:  # our plugin posts its refusals' Events from a queue: read them once sent
            if isinstance(plugin, _OurPlugin):
                plugin.flush_events()
        pods = [p for p in self.admin.list_pods()[0] if (p.get("metadata") or {}).get("namespace") == namespace]
        extender = self.extender
        waiting = {**extender.unschedulable, **extender.bind_errors} if extender is not None else {}
        return Observation(
            pods=pods,
            runs=[r for k in self.kubelets for r in list(k.runs) if r.namespace == namespace],
            gpus={k.config.node: k.config.gpus for k in self.kubelets},
            held={k.config.node: set(k.devices.by_pod()) for k in self.kubelets},
            deleted=deleted,
            unschedulable=waiting,
            events=self.admin.events(namespace),
        )

    def close(self) -> None:
        for rs in self.replicasets:
            rs.close()
        if self.extender is not None:
            self.extender.close()
        # Plugins stop in parallel: each may wait seconds for its API watch to end.
        with futures.ThreadPoolExecutor(max_workers=max(1, len(self.plugins))) as pool:
            for failed in [pool.submit(p.close) for p in self.plugins]:
                if failed.exception() is not None:
                    log.warning("stopping a device plugin failed: %s", failed.exception())
        for kubelet in self.kubelets:
            kubelet.close()
        self.api.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass(frozen=True)
class _OurPlugin:
    stop: Callable[[], None]
    flush_events: Callable[[], bool]  # wait until the Events it posted so far are sent

    def close(self) -> None:
        self.stop()


def node_names(cluster: SimCluster) -> Sequence[str]:
    return [k.config.node for k in cluster.kubelets]
