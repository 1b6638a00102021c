"""The alerts of manifests/monitoring/prometheus-rules.yaml against series as the programs expose them: the series
of each program's /metrics text (its own registries' in the unit tier, a scrape of the installed pods in the install
tier) with the labels a PodMonitor adds, turned into promtool input series; each alert's condition is driven by
changing only values, and promtool says whether it fires.
"""

from __future__ import annotations

import datetime
import math
import re
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from certs.build import dev_bundle
from certs.cli import write_files
from common.buildinfo import BuildInfo
from contract import Contract
from deviceplugin.devices import UnitInventory
from deviceplugin.metrics import NodeCollector, PluginMetrics
from deviceplugin.trust import Context
from dra.main import DraPlugin
from dra.settings import dra_settings_from
from e2e.kube import Kubectl
from node.inventory import fake_gpus
from tests.harness import promtool
from webhook.server.metrics import CertificateExpiry, ConnectionMetrics, WebhookMetrics, WireMetrics

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "manifests" / "monitoring" / "prometheus-rules.yaml"
MONITORS = REPO / "manifests" / "monitoring" / "pod-monitors.yaml"
NAMESPACE = "gpushare-system"
NODE = "node-a"
# The PodMonitor of each program (manifests/monitoring/pod-monitors.yaml) and its metrics port.
PROGRAMS = {"webhook": ("gpushare-webhook", 9102), "device-plugin": ("gpushare-device-plugin", 9103),
            "dra-plugin": ("gpushare-dra-plugin", 9103)}
EVAL = "90m"  # past every rule's `for` (at most 1h) with its window filled
SAMPLES = 120  # one a minute

Series = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Target:
    """A scraped pod as the Prometheus Operator labels its series."""

    program: str
    pod: str
    ip: str = "10.0.0.1"
    node: str = NODE
    namespace: str = NAMESPACE

    def labels(self) -> dict[str, str]:
        monitor, port = PROGRAMS[self.program]
        out = {"job": f"{self.namespace}/{monitor}", "namespace": self.namespace, "pod": self.pod,
               "instance": f"{self.ip}:{port}", "endpoint": "metrics", "container": self.program}
        if _relabels_node(monitor):
            out["node"] = self.node
        return out


def _relabels_node(monitor: str) -> bool:
    for doc in yaml.safe_load_all(MONITORS.read_text()):
        if doc["metadata"]["name"] == monitor:
            return any(r.get("targetLabel") == "node" for e in doc["spec"]["podMetricsEndpoints"]
                       for r in e.get("relabelings", []))
    raise AssertionError(f"no PodMonitor {monitor} in {MONITORS}")


def scraped(kubectl: Kubectl, programs: Iterable[str], namespace: str = NAMESPACE) -> dict[Series, float]:
    """The series of every pod of `programs`, read from their metrics ports over the pod network as Prometheus
    reads them, labelled as their PodMonitors label them."""
    out: dict[Series, float] = {}
    for program in programs:
        monitor, port = PROGRAMS[program]
        pods = kubectl.json(["get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/name={monitor}"])["items"]
        assert pods, f"no pod of {monitor} in {namespace}"
        for pod in pods:
            ip = pod["status"]["podIP"]
            with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=10) as answer:
                text = answer.read().decode()
            out.update(series_of(text, Target(program, pod["metadata"]["name"], ip, pod["spec"]["nodeName"],
                                              namespace)))
    return out


def driven_alerts(series: Mapping[Series, float]) -> set[str]:
    """The alerts some drive of DRIVES can make fire on these series."""
    return {d.alert for d in DRIVES if any(d.picks(key) for key in series)}


def series_of(text: str, target: Target) -> dict[Series, float]:
    """The series of one /metrics text with the target's labels, and the `up` Prometheus records for it."""
    extra = target.labels()
    out: dict[Series, float] = {("up", tuple(sorted(extra.items()))): 1.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted({**sample.labels, **extra}.items())))] = float(sample.value)
    return out


def product_registries(folder: Path) -> dict[str, list[Collector]]:
    """Every collector each program serves, as the product defines them (fresh, nothing counted yet)."""
    write_files(folder, dev_bundle(datetime.datetime.now(datetime.UTC)))
    inventory = UnitInventory(fake_gpus("2x8GiB", NODE, "GiB"), "GiB", 4096)
    ctx = Context(contract=Contract(), node_name=NODE, public_key=Ed25519PrivateKey.generate().public_key(),
                  gpus={g.index: g for g in inventory.gpus}, healthy=inventory.healthy)
    plugin = PluginMetrics()
    dra = DraPlugin(dra_settings_from({"GPUSHARE_NODE_NAME": NODE, "GPUSHARE_FAKE_GPUS": "2x8GiB"}))
    return {
        "webhook": [WebhookMetrics().registry, ConnectionMetrics().registry, WireMetrics().registry,
                    CertificateExpiry(str(folder / "tls.crt")), BuildInfo("webhook")],
        "device-plugin": [plugin.registry, NodeCollector(inventory, ctx, list, plugin)],
        "dra-plugin": [dra.metrics_registry()],
    }


def exposition(collectors: Iterable[Collector]) -> str:
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry).decode()


def known_metric_names(folder: Path) -> set[str]:
    """Every sample name the programs define (counters with _total, histograms with their series), those of
    families with no labelled child yet included."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {family.name + suffix for collectors in product_registries(folder).values() for c in collectors
            for family in c.collect() for suffix in suffixes[family.type]}


def product_series(folder: Path) -> dict[Series, float]:
    """The series of all three programs, one pod each, with the values a healthy install shows (a fresh registry
    has not registered, published nor read a GPU's health yet)."""
    out: dict[Series, float] = {}
    for program, collectors in product_registries(folder).items():
        out.update(series_of(exposition(collectors), Target(program, f"{PROGRAMS[program][0]}-0")))
    healthy = {"gpushare_webhook_worker_processes": 2.0, "gpushare_deviceplugin_registered": 1.0,
               "gpushare_dra_registered": 1.0, "gpushare_dra_slices_published": 1.0}
    return {key: healthy.get(key[0], value) for key, value in out.items()}


@dataclass(frozen=True)
class Drive:
    """How one alert is made to fire: every series of `metric` whose labels include `match` gets `values` instead
    of its own; the alert keeps the labels `by` of those series."""

    alert: str
    metric: str
    match: Mapping[str, str]
    values: str
    by: tuple[str, ...]

    def picks(self, key: Series) -> bool:
        return key[0] == self.metric and self.match.items() <= dict(key[1]).items()


DAYS = 86400
DRIVES = (
    Drive("GpuShareWebhookDown", "up", {"container": "webhook"}, f"0x{SAMPLES}", ("namespace",)),
    Drive("GpuShareWebhookDown", "gpushare_webhook_worker_processes", {}, f"0x{SAMPLES}", ("namespace",)),
    Drive("GpuShareWebhookCertificateExpiresSoon", "gpushare_webhook_certificate_expires_in_seconds", {},
          f"{5 * DAYS}-60x{SAMPLES}", ("namespace",)),
    Drive("GpuSharePodsRefused", "gpushare_webhook_reviews_total", {"outcome": "denied"}, f"0+5x{SAMPLES}",
          ("namespace",)),
    Drive("GpuShareRefusalsUnattributed", "gpushare_deviceplugin_unattributed_refusals_total", {},
          f"0+1x{SAMPLES}", ("namespace", "node")),
    Drive("GpuShareRefusalsWrongPlacement", "gpushare_deviceplugin_refusals_total",
          {"reason": "GpuShareBadAssignment"}, f"0+1x{SAMPLES}", ("namespace", "node", "reason")),
    Drive("GpuShareGpuUnhealthy", "gpushare_deviceplugin_gpu_healthy", {}, f"0x{SAMPLES}",
          ("namespace", "node", "gpu", "uuid")),
    Drive("GpuShareDevicePluginNotRegistered", "gpushare_deviceplugin_registered", {}, f"0x{SAMPLES}",
          ("namespace", "node")),
    Drive("GpuShareDevicePluginNotRegistered", "gpushare_dra_registered", {}, f"0x{SAMPLES}", ("namespace", "node")),
    Drive("GpuShareDraSlicesMissing", "gpushare_dra_slices_published", {}, f"0x{SAMPLES}", ("namespace", "node")),
)


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["spec"]["groups"] for rule in group["rules"]]


def rule_file(folder: Path) -> Path:
    """The PrometheusRule's groups as a Prometheus rule file."""
    path = folder / "gpushare.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": yaml.safe_load(RULES.read_text())["spec"]["groups"]}))
    return path


def _selector(key: Series) -> str:
    name, labels = key
    quoted = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return f"{name}{{{quoted}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _steady(value: float) -> str:
    if math.isnan(value):
        return " ".join(["NaN"] * (SAMPLES + 1))
    return f"{int(value) if value.is_integer() else value!r}+0x{SAMPLES}"


def driven(series: Mapping[Series, float], drive: Drive | None) -> tuple[list[dict[str, str]], list[Series]]:
    """promtool input series: every series steady at its value, but those `drive` picks, which get its values."""
    picked = [key for key in sorted(series) if drive is not None and drive.picks(key)]
    return [{"series": _selector(key), "values": drive.values if drive is not None and key in picked
             else _steady(value)} for key, value in sorted(series.items())], picked


def expected(drive: Drive, picked: Iterable[Series]) -> list[dict[str, Any]]:
    """The alerts `drive` fires: one per rule of that name (each severity) and set of `by` labels of the picked."""
    groups = sorted({tuple((k, dict(key[1])[k]) for k in drive.by) for key in picked})
    return [{"exp_labels": {**dict(group), **rule.get("labels", {})}, "exp_annotations": rule["annotations"]}
            for group in groups for rule in rules() if rule["alert"] == drive.alert]


def alert_names() -> list[str]:
    return sorted({rule["alert"] for rule in rules()})


def case(series: Mapping[Series, float], alert: str, drive: Drive | None) -> dict[str, Any]:
    """One promtool test group: the series (driven by `drive`, or all steady) and the alerts expected at EVAL."""
    inputs, picked = driven(series, drive)
    exp = expected(drive, picked) if drive is not None else []
    return {"interval": "1m", "input_series": inputs,
            "alert_rule_test": [{"eval_time": EVAL, "alertname": alert, "exp_alerts": exp}]}


def check(series: Mapping[Series, float], folder: Path, drives: Iterable[Drive] = DRIVES) -> dict[str, str]:
    """Runs promtool for every alert: quiet on the steady series, firing under each drive whose metric the series
    hold. Returns the failures by alert (empty when every alert behaved)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = rule_file(folder)
    failures: dict[str, str] = {}
    for alert in alert_names():
        tests = [case(series, alert, None)]
        tests += [case(series, alert, d) for d in drives if d.alert == alert
                  and any(d.picks(key) for key in series)]
        done = promtool.run_tests(path, tests, folder, alert)
        if done.returncode != 0:
            failures[alert] = (done.stdout + done.stderr)[-3000:]
    return failures


def report(failures: Mapping[str, str]) -> str:
    """promtool's words on each alert that misbehaved, for an assertion message."""
    return "\n\n".join(f"{alert}:\n{text}" for alert, text in failures.items())


def used_metric_names(expressions: Iterable[str]) -> set[str]:
    return {name for expr in expressions for name in re.findall(r"gpushare_[a-z_]+", expr)}
