"""The tier benchmark's figures against the issue's targets, min-max over the runs (bench/bench_apiserver_tier.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from e2e.apimetrics import PLUGIN, Burst

POST = "POST pods"
MUTATE = "mutate.gpushare.io"
ORDINARY, GPU_SHARE, MIX = "ordinary", "GPU-share", "mix"
SHAPES = (ORDINARY, GPU_SHARE, MIX)
# The issue's acceptance, each run: POST pods mean with our admission over without, per burst; our entries' CREATE
# calls per pod created in the GPU-share burst; our mutate entry's mean over the floor's in the same run.
TARGET_RATIO = {ORDINARY: 1.2, GPU_SHARE: 2.5, MIX: 1.4}
TARGET_CALLS_PER_POD = 1.0
TARGET_OVER_FLOOR = 1.3


@dataclass
class Run:
    """One run: each shape's burst with our admission and without it, the GPU-share burst against the floor, and
    where the cluster serves MutatingAdmissionPolicy the ordinary burst with the least policy that mutates every pod
    (bench_apiserver_tier.FLOOR_POLICY) and nothing of ours: the API server's own cost of any in-process mutation."""

    ours: dict[str, Burst]
    without: dict[str, Burst]
    floor: Burst
    policy_floor: Burst | None = None


def entries(burst: Burst) -> dict[str, tuple[int, float]]:
    """Every webhook entry of ours the API server called at a CREATE in the burst, whatever the chart renders on
    this cluster: (calls, mean ms)."""
    return {k: (calls, burst.mean_ms[k]) for k, calls in sorted(burst.calls.items())
            if "gpushare" in k and not k.startswith(PLUGIN)}


def ratio(ours: Burst, without: Burst) -> float | None:
    mine, bare = ours.mean_ms.get(POST), without.mean_ms.get(POST)
    return mine / bare if mine and bare else None


def calls_per_pod(burst: Burst) -> float | None:
    pods = burst.calls.get(POST, 0)
    return sum(calls for calls, _ in entries(burst).values()) / pods if pods else None


def over_floor(run: Run) -> float | None:
    mine, floor = run.ours[GPU_SHARE].mean_ms.get(MUTATE), run.floor.mean_ms.get(MUTATE)
    return mine / floor if mine and floor else None


def _over(value: float | None, target: float) -> bool:
    """A figure that was not recorded misses its target: a burst that measured nothing must not pass."""
    return value is None or value > target


def _shown(value: float | None, digits: int = 2) -> str:
    return "not recorded" if value is None else f"{value:.{digits}f}"


def missed(runs: list[Run]) -> list[str]:
    """Each target a run missed, as a sentence that names the run, the burst and the figure."""
    out: list[str] = []
    for number, run in enumerate(runs, 1):
        for shape in SHAPES:
            r = ratio(run.ours[shape], run.without[shape])
            if _over(r, TARGET_RATIO[shape]):
                out.append(f"run {number}: the {shape} burst's POST pods ratio is {_shown(r)}, over "
                           f"{TARGET_RATIO[shape]:g}")
        reviews = run.ours[ORDINARY].reviews
        if reviews > 0:
            out.append(f"run {number}: the webhook pods answered {reviews:.0f} review{'s' if reviews != 1 else ''} "
                       "during the ordinary burst, where none should reach them")
        per = calls_per_pod(run.ours[GPU_SHARE])
        if _over(per, TARGET_CALLS_PER_POD):
            out.append(f"run {number}: the GPU-share burst made {_shown(per)} webhook calls per pod, over "
                       f"{TARGET_CALLS_PER_POD:g}")
        factor = over_floor(run)
        if _over(factor, TARGET_OVER_FLOOR):
            out.append(f"run {number}: {MUTATE} took {_shown(factor)} times the floor's mean, over "
                       f"{TARGET_OVER_FLOOR:g}")
    return out


def span(values: Iterable[float | None], unit: str = "", digits: int = 1) -> str:
    items = [v for v in values if v is not None]
    if not items:
        return "-"
    low, high = f"{min(items):.{digits}f}", f"{max(items):.{digits}f}"
    return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"


def _entry_lines(bursts: list[Burst]) -> str:
    names = sorted({name for burst in bursts for name in entries(burst)})
    parts = []
    for name in names:
        figures = [entries(burst).get(name, (0, None)) for burst in bursts]
        parts.append(f"{name} {span([calls for calls, _ in figures], '', 0)} calls, mean "
                     f"{span([mean for _, mean in figures], ' ms', 2)}")
    return "; ".join(parts) or "none called"


def _plugin_line(label: str, bursts: list[Burst]) -> str:
    shares = [burst.per_pod_ms() for burst in bursts]
    names = sorted({k for share in shares for k in share})
    parts = [f"{k} {span([share.get(k, 0.0) for share in shares], '', 2)}" for k in names]
    return f"  admission plugins per pod {label}, ms: " + ("; ".join(parts) or "-")


def lines(runs: list[Run], shapes: dict[str, str]) -> list[str]:
    """The report: for each burst (`shapes` says what it holds) POST pods with and without our admission and their
    ratio, our entries' calls and means, the reviews the webhook pods counted, every admission plugin's share per
    pod; then the floor's mutate mean against ours."""
    out = [f"{len(runs)} run{'s' if len(runs) != 1 else ''}, min-max over the runs:"]
    for shape in SHAPES:
        ours, without = [run.ours[shape] for run in runs], [run.without[shape] for run in runs]
        target = f" (target ≤ {TARGET_CALLS_PER_POD:g})" if shape == GPU_SHARE else ""
        out += [
            f"{shape} burst ({shapes[shape]}):",
            f"  POST pods {span([b.mean_ms.get(POST) for b in ours], ' ms')} with our admission, "
            f"{span([b.mean_ms.get(POST) for b in without], ' ms')} without: ratio "
            f"{span([ratio(o, w) for o, w in zip(ours, without, strict=True)], '', 2)} "
            f"(target ≤ {TARGET_RATIO[shape]:g})",
            f"  our webhook entries: {_entry_lines(ours)}",
            f"  webhook calls per pod {span([calls_per_pod(b) for b in ours], '', 2)}{target}; "
            f"reviews the webhook pods counted {span([b.reviews for b in ours], '', 0)}"
            + (" (target 0)" if shape == ORDINARY else "")
            + f", TLS handshakes {span([b.handshakes for b in ours], '', 0)}",
            _plugin_line("with our admission", ours),
            _plugin_line("without", without),
        ]
    policy_floors = [(run, run.policy_floor) for run in runs if run.policy_floor is not None]
    if policy_floors:
        out += [
            f"{ORDINARY} burst with the least MutatingAdmissionPolicy (one constant JSON Patch) and nothing of ours:",
            f"  POST pods {span([b.mean_ms.get(POST) for _, b in policy_floors], ' ms')}, ratio to without "
            f"{span([ratio(b, run.without[ORDINARY]) for run, b in policy_floors], '', 2)}; ours over it "
            f"{span([ratio(run.ours[ORDINARY], b) for run, b in policy_floors], '', 2)}",
            _plugin_line("with it", [b for _, b in policy_floors]),
        ]
    floors = [run.floor for run in runs]
    out += [
        f"{GPU_SHARE} burst against the Go floor (apiclient floor behind the webhook's Service):",
        f"  POST pods {span([b.mean_ms.get(POST) for b in floors], ' ms')}; {_entry_lines(floors)}",
        f"  {MUTATE}: ours over the floor {span([over_floor(run) for run in runs], '', 2)} "
        f"(target ≤ {TARGET_OVER_FLOOR:g})",
    ]
    return out
