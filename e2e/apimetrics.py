"""The API server's and the webhook's /metrics as the tier benchmark reads them: histogram sums and counts per
series, counters, and the difference between two readings (bench/bench_apiserver_tier.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

PLUGIN = "plugin "  # prefix of an admission plugin's series
Sums = dict[str, tuple[float, float]]  # series -> (sum, count)


def sums(text: str, wanted: Callable[[str, dict[str, str]], str | None]) -> Sums:
    """(sum, count) of every histogram series `wanted` names (None: skipped), added up by that name."""
    out: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith(("_sum", "_count")):
                continue
            key = wanted(sample.name.rsplit("_", 1)[0], sample.labels)
            if key is None:
                continue
            pair = out.setdefault(key, [0.0, 0.0])
            pair[0 if sample.name.endswith("_sum") else 1] += sample.value
    return {k: (v[0], v[1]) for k, v in out.items()}


def counter(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def apiserver_series(name: str, labels: dict[str, str]) -> str | None:
    if name == "apiserver_request_duration_seconds" and labels.get("verb") == "POST" \
            and labels.get("resource") == "pods" and not labels.get("subresource"):
        return "POST pods"
    if name == "apiserver_admission_webhook_admission_duration_seconds" and labels.get("operation") == "CREATE" \
            and "gpushare" in labels.get("name", ""):
        return labels["name"]
    # Not apiserver_validating_admission_policy_check_duration_seconds: it observes only a policy whose evaluation
    # failed (k8s.io/apiserver/pkg/admission/plugin/policy/validating/dispatcher.go, ObserveAdmission under
    # EvalError), so the policies' time is read as their plugin's, ValidatingAdmissionPolicy, below.
    # Each admission plugin's whole time per CREATE (k8s.io/apiserver/pkg/admission/metrics/metrics.go,
    # ObserveAdmissionController): every CREATE of the burst, pods and the controller's Events alike, so its sum
    # is divided by the POST pods count (Burst.per_pod_ms), which places the time a pod's creation spends.
    if name == "apiserver_admission_controller_admission_duration_seconds" and labels.get("operation") == "CREATE":
        return PLUGIN + labels.get("name", "")
    # Our entries' matchConditions, inside the webhook plugins' time (same file, ObserveMatchConditionEvaluationTime).
    if name == "apiserver_admission_match_condition_evaluation_seconds" and labels.get("operation") == "CREATE" \
            and "gpushare" in labels.get("name", ""):
        return PLUGIN + "matchConditions " + labels["name"]
    return None


@dataclass
class Reading:
    apiserver: Sums
    handshakes: float
    reviews: float


@dataclass
class Burst:
    """One burst's figures: mean ms per series, calls per series, handshakes and reviews the webhook counted."""

    mean_ms: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    handshakes: float = 0.0
    reviews: float = 0.0
    total_ms: dict[str, float] = field(default_factory=dict)

    def per_pod_ms(self) -> dict[str, float]:
        """Each admission plugin's time over the burst divided by the pods created: its share of POST pods."""
        pods = self.calls.get("POST pods", 0)
        return {k.removeprefix(PLUGIN): v / pods for k, v in sorted(self.total_ms.items())
                if pods and k.startswith(PLUGIN) and v / pods >= 0.05}


def delta(before: Reading, after: Reading) -> Burst:
    out = Burst(handshakes=after.handshakes - before.handshakes, reviews=after.reviews - before.reviews)
    for key, (total, count) in after.apiserver.items():
        old_total, old_count = before.apiserver.get(key, (0.0, 0.0))
        if count - old_count > 0:
            out.total_ms[key] = 1000 * (total - old_total)
            out.mean_ms[key] = out.total_ms[key] / (count - old_count)
            out.calls[key] = int(count - old_count)
    return out
