"""Prometheus metrics of the device plugin and its API-error counting (node/metrics.py serves them)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common.buildinfo import BuildInfo
from deviceplugin.apiserver import ApiServer, PodListener
from deviceplugin.errors import PluginError
from deviceplugin.trust import Context
from deviceplugin.usage import holding_of, node_usage, recorded_pin
from node.apiclient import ApiServerError, Conflict
from node.inventory import Inventory

log = logging.getLogger(__name__)

CALLS = ("Allocate", "PreStartContainer")
OUTCOMES = ("ok", "invalid_argument", "failed_precondition", "unavailable", "deadline_exceeded", "internal")
# Every reason a call is refused under: the Refusal reasons (which are also the reasons of its Events), and one per
# gRPC code for the answers that are not a decision about a pod.
REASONS = (
    "GpuShareNoIntent", "GpuShareBadSignature", "GpuShareBadIntent", "GpuShareBadAssignment", "GpuShareNotPlaced",
    "GpuShareUnhealthy", "GpuShareMoved", "GpuShareNoRoom", "GpuShareNoEnv", "GpuShareCdiFailed",
    "GpuShareLegacyWrongGpu", "GpuShareUnknownDevices", "GpuSharePodGone", "GpuSharePodDeleting",
    "GpuShareNoCandidate", "GpuShareRefused", "GpuShareInvalidRequest", "GpuShareUnavailable", "GpuShareTimeout",
    "GpuShareInternalError",
)
BY_CODE = {
    "INVALID_ARGUMENT": "GpuShareInvalidRequest", "FAILED_PRECONDITION": "GpuShareRefused",
    "UNAVAILABLE": "GpuShareUnavailable", "DEADLINE_EXCEEDED": "GpuShareTimeout", "INTERNAL": "GpuShareInternalError",
}
API_OPERATIONS = ("list_pods", "get_pod", "patch_pod", "create_event", "patch_node")
# A call takes milliseconds; the kubelet gives PreStartContainer 30 s, and GPUSHARE_RPC_TIMEOUT_SECONDS is below.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class PluginMetrics:
    """Counters of one plugin process; a fresh registry each, so tests start from zero."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.calls = Counter("gpushare_deviceplugin_calls", "Kubelet calls answered, by method and outcome "
                             "(ok, or the gRPC status code).", ["method", "outcome"], registry=r)
        self.duration = Histogram("gpushare_deviceplugin_call_duration_seconds", "Time to answer a kubelet call.",
                                  ["method"], buckets=BUCKETS, registry=r)
        self.refusals = Counter("gpushare_deviceplugin_refusals", "Kubelet calls not answered with devices, by "
                                "reason.", ["method", "reason"], registry=r)
        self.unattributed = Counter("gpushare_deviceplugin_unattributed_refusals", "Refusals whose pod could not be "
                                    "identified, so no Event was posted (the log has them).", ["method"], registry=r)
        self.events = Counter("gpushare_deviceplugin_events", "Events posted on pods, by type and reason.",
                              ["type", "reason"], registry=r)
        self.suppressed = Counter("gpushare_deviceplugin_events_suppressed", "Events not posted because the same pod "
                                  "had too many for the same reason lately (the log has them).", ["reason"],
                                  registry=r)
        self.registrations = Counter("gpushare_deviceplugin_registrations", "Registrations with the kubelet, by "
                                     "outcome (ok or failed).", ["outcome"], registry=r)
        # A counter cannot say that the last attempt failed and none followed (the kubelet's socket never came).
        self.registered = Gauge("gpushare_deviceplugin_registered", "1 while the last registration with the "
                                "kubelet succeeded, 0 before the first and after a failed one.", registry=r)
        self.api_errors = Counter("gpushare_deviceplugin_api_errors", "API server requests that failed (a 409 "
                                  "conflict, which is retried, is not counted), by operation.", ["operation"],
                                  registry=r)
        for method in CALLS:
            self.duration.labels(method)
            self.unattributed.labels(method)
            for outcome in OUTCOMES:
                self.calls.labels(method, outcome)
            for reason in REASONS:
                self.refusals.labels(method, reason)
        for outcome in ("ok", "failed"):
            self.registrations.labels(outcome)
        for operation in API_OPERATIONS:
            self.api_errors.labels(operation)
        r.register(BuildInfo("device-plugin"))

    def call(self, method: str, code: str, seconds: float, reason: str = "") -> None:
        """One kubelet call: `code` is "OK" or the gRPC status code name it was answered with."""
        self.calls.labels(method, code.lower()).inc()
        self.duration.labels(method).observe(seconds)
        if code != "OK":
            self.refusals.labels(method, reason if reason in REASONS else BY_CODE.get(code, "GpuShareRefused")).inc()

    def watch_node(self, inventory: Inventory, context: Context, pods: Callable[[], list[dict[str, Any]]]) -> None:
        self.registry.register(NodeCollector(inventory, context, pods, self))


def units_by_gpu(pods: Sequence[Mapping[str, Any]], ctx: Context) -> dict[int, tuple[int, int, int]]:
    """GPU index -> (units promised on it, units of believed pods with an allocation record there, units held there
    by pods of a previous device plugin, as the kubelet's checkpoint shows them); a pod being deleted counts only
    while a GPU-share container of it may run (deviceplugin/usage.py)."""
    usage = node_usage(pods, ctx)
    allocated: dict[int, int] = {}
    for pod in pods:
        pin = recorded_pin(pod, ctx)
        held = holding_of(pod, str((pod.get("metadata") or {}).get("uid") or ""), ctx) if pin is not None else None
        if pin is not None and held is not None:
            allocated[pin.index] = allocated.get(pin.index, 0) + held[1].units
    return {index: (usage.on(index)[0], allocated.get(index, 0),
                    sum(h.units for h in usage.on(index)[1] if h.legacy)) for index in ctx.gpus}


class NodeCollector(Collector):
    """Per-GPU capacity, promised and allocated units and health, computed at each scrape from the pod cache."""

    def __init__(self, inventory: Inventory, ctx: Context, pods: Callable[[], list[dict[str, Any]]],
                 metrics: PluginMetrics) -> None:
        self.inventory = inventory
        self.ctx = ctx
        self.pods = pods
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        labels = ["gpu", "uuid"]
        capacity = GaugeMetricFamily("gpushare_deviceplugin_gpu_capacity_units", "Memory of the GPU, in units.",
                                     labels=labels)
        healthy = GaugeMetricFamily("gpushare_deviceplugin_gpu_healthy", "1 when the GPU is healthy, 0 once a "
                                    "critical XID marked its devices Unhealthy.", labels=labels)
        for gpu in self.inventory.gpus:
            capacity.add_metric([str(gpu.index), gpu.uuid], gpu.memory_units)
            healthy.add_metric([str(gpu.index), gpu.uuid], 1 if self.inventory.healthy(gpu.index) else 0)
        yield capacity
        yield healthy
        try:
            units = units_by_gpu(self.pods(), self.ctx)
        except (ApiServerError, PluginError) as exc:
            log.info("The per-GPU unit metrics are left out of this scrape: %s.", exc)
            return
        promised = GaugeMetricFamily("gpushare_deviceplugin_gpu_units_promised", "Units promised on the GPU to "
                                     "pods the plugin believes (placed there, allocated or not), and held there by "
                                     "pods of a previous device plugin.", labels=labels)
        allocated = GaugeMetricFamily("gpushare_deviceplugin_gpu_units_allocated", "Units of the pods whose "
                                      "allocation on the GPU the plugin has recorded.", labels=labels)
        legacy = GaugeMetricFamily("gpushare_deviceplugin_gpu_units_legacy", "Units held on the GPU by pods from "
                                   "before the gpushare webhook, where the kubelet's checkpoint shows a previous "
                                   "device plugin put them (0 on every GPU: the migration is over).", labels=labels)
        for gpu in self.inventory.gpus:
            for family, value in zip((promised, allocated, legacy), units[gpu.index], strict=True):
                family.add_metric([str(gpu.index), gpu.uuid], value)
        yield promised
        yield allocated
        yield legacy


class MeteredApiServer:
    """The ApiServer with its failures counted by operation (gpushare_deviceplugin_api_errors_total)."""

    def __init__(self, api: ApiServer, metrics: PluginMetrics) -> None:
        self._api = api
        self._errors = metrics.api_errors

    def _counted(self, operation: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Conflict:
            raise
        except ApiServerError:
            self._errors.labels(operation).inc()
            raise

    def subscribe(self, listener: PodListener) -> None:
        self._api.subscribe(listener)

    def node_pods(self) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = self._counted("list_pods", self._api.node_pods)
        return pods

    def list_node_pods(self) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = self._counted("list_pods", self._api.list_node_pods)
        return pods

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod: dict[str, Any] | None = self._counted("get_pod", lambda: self._api.get_pod(namespace, name))
        return pod

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str], resource_version: str
    ) -> dict[str, Any]:
        pod: dict[str, Any] = self._counted("patch_pod", lambda: self._api.patch_pod_annotations(
            namespace, name, annotations, resource_version))
        return pod

    def create_event(self, pod: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        self._counted("create_event", lambda: self._api.create_event(pod, event_type, reason, message))

    def patch_node_capacity(self, capacity: Mapping[str, str]) -> None:
        self._counted("patch_node", lambda: self._api.patch_node_capacity(capacity))
