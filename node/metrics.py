"""The plain-HTTP /metrics listener of a node program (GPUSHARE_METRICS_BIND), bounded as common/metricsserver.py."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from common.metricsserver import MetricsServer as Listener
from common.settings import SettingsError


class MetricsServer:
    """GET /metrics over plain HTTP (GPUSHARE_METRICS_BIND), with bounded threads and connections
    (common/metricsserver.py)."""

    def __init__(self, bind: tuple[str, int], registry: CollectorRegistry) -> None:
        host, port = bind
        try:
            self._listener = Listener(bind, registry, name="plugin-metrics")
        except OSError as exc:
            raise SettingsError(
                f"GPUSHARE_METRICS_BIND={host}:{port} cannot be listened on ({exc}); choose a free port, or set it "
                "empty to serve no metrics"
            ) from exc
        self.address = self._listener.address

    def stop(self) -> None:
        self._listener.stop()
