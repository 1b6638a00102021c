"""The tier benchmark's arithmetic against the issue's targets (e2e/apireport.py), on made-up bursts."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from e2e.apimetrics import PLUGIN, Burst
from e2e.apireport import (
    GPU_SHARE,
    MIX,
    MUTATE,
    ORDINARY,
    POST,
    Run,
    calls_per_pod,
    entries,
    lines,
    missed,
    over_floor,
    ratio,
    span,
)

VALIDATE = "validate.gpushare.io"
SHAPES = {ORDINARY: "300 ordinary pods", GPU_SHARE: "300 GPU-share pods", MIX: "270 ordinary, 30 GPU-share"}


def burst(post_ms: float, pods: int = 300, hooks: dict[str, tuple[int, float]] | None = None,
          reviews: float = 0.0) -> Burst:
    made = Burst(mean_ms={POST: post_ms}, calls={POST: pods}, reviews=reviews, handshakes=2.0)
    for name, (calls, mean) in (hooks or {}).items():
        made.calls[name], made.mean_ms[name] = calls, mean
    made.total_ms[PLUGIN + "MutatingAdmissionPolicy"] = 0.3 * pods
    return made


def good_run() -> Run:
    """Every target met: ratios 1.1, 2.0 and 1.3; one call per GPU-share pod; mutate 3 ms against a 2.5 ms floor."""
    return Run(
        ours={ORDINARY: burst(5.5), GPU_SHARE: burst(10.0, hooks={MUTATE: (300, 3.0)}, reviews=300),
              MIX: burst(6.5, hooks={MUTATE: (30, 3.2)}, reviews=30)},
        without={ORDINARY: burst(5.0), GPU_SHARE: burst(5.0), MIX: burst(5.0)},
        floor=burst(9.0, hooks={MUTATE: (300, 2.5)}),
    )


def test_a_run_that_meets_every_target_misses_none() -> None:
    run = good_run()
    assert ratio(run.ours[GPU_SHARE], run.without[GPU_SHARE]) == 2.0
    assert calls_per_pod(run.ours[GPU_SHARE]) == 1.0
    assert over_floor(run) == pytest.approx(1.2)
    assert missed([run, good_run()]) == []


def _slow(shape: str, post_ms: float) -> Callable[[Run], None]:
    def change(run: Run) -> None:
        run.ours[shape].mean_ms[POST] = post_ms
    return change


def _validate_too(run: Run) -> None:
    run.ours[GPU_SHARE].calls[VALIDATE], run.ours[GPU_SHARE].mean_ms[VALIDATE] = 300, 2.0


def _reviews(run: Run) -> None:
    run.ours[ORDINARY].reviews = 1


def _slow_mutate(run: Run) -> None:
    run.ours[GPU_SHARE].mean_ms[MUTATE] = 3.3  # 1.32 times the floor's 2.5


def _no_floor_calls(run: Run) -> None:
    run.floor = burst(9.0)


def _nothing_without(run: Run) -> None:
    run.without[MIX] = Burst()


@pytest.mark.parametrize(("change", "expected"), [
    (_slow(ORDINARY, 6.1), "run 2: the ordinary burst's POST pods ratio is 1.22, over 1.2"),
    (_slow(GPU_SHARE, 12.6), "run 2: the GPU-share burst's POST pods ratio is 2.52, over 2.5"),
    (_slow(MIX, 7.1), "run 2: the mix burst's POST pods ratio is 1.42, over 1.4"),
    (_validate_too, "run 2: the GPU-share burst made 2.00 webhook calls per pod, over 1"),
    (_reviews, "run 2: the webhook pods answered 1 review during the ordinary burst, where none should reach them"),
    (_slow_mutate, "run 2: mutate.gpushare.io took 1.32 times the floor's mean, over 1.3"),
    (_no_floor_calls, "run 2: mutate.gpushare.io took not recorded times the floor's mean, over 1.3"),
    (_nothing_without, "run 2: the mix burst's POST pods ratio is not recorded, over 1.4"),
])
def test_each_target_missed_in_one_run_is_named(change: Callable[[Run], None], expected: str) -> None:
    second = good_run()
    change(second)
    assert missed([good_run(), second, good_run()]) == [expected]


def test_every_entry_of_ours_counts_and_nothing_else() -> None:
    made = burst(5.0, hooks={MUTATE: (30, 3.0), "neutralise.gpushare.io": (270, 1.0), "other.example.com": (300, 9.0)})
    made.calls[PLUGIN + "matchConditions " + MUTATE], made.mean_ms[PLUGIN + "matchConditions " + MUTATE] = 300, 0.01
    assert entries(made) == {MUTATE: (30, 3.0), "neutralise.gpushare.io": (270, 1.0)}
    assert calls_per_pod(made) == 1.0


def test_the_report_shows_each_figure_min_max_over_the_runs() -> None:
    second = good_run()
    second.ours[GPU_SHARE].mean_ms[POST] = 11.0
    second.ours[GPU_SHARE].mean_ms[MUTATE] = 3.25
    text = "\n".join(lines([good_run(), second], SHAPES))
    assert "GPU-share burst (300 GPU-share pods):" in text
    assert "POST pods 10.0-11.0 ms with our admission, 5.0 ms without: ratio 2.00-2.20 (target ≤ 2.5)" in text
    assert "our webhook entries: mutate.gpushare.io 300 calls, mean 3.00-3.25 ms" in text
    assert "ours over the floor 1.20-1.30 (target ≤ 1.3)" in text
    assert "our webhook entries: none called" in text  # the ordinary burst
    assert "webhook calls per pod 0.00; reviews the webhook pods counted 0 (target 0)" in text
    assert "webhook calls per pod 1.00 (target ≤ 1); reviews the webhook pods counted 300," in text
    assert "admission plugins per pod with our admission, ms: MutatingAdmissionPolicy 0.30" in text


@pytest.mark.parametrize(("values", "unit", "digits", "shown"), [
    ([1.0, 1.04], "", 1, "1.0"),
    ([1.0, 1.25, None], " ms", 2, "1.00-1.25 ms"),
    ([None], "", 1, "-"),
    ([], "", 1, "-"),
])
def test_span(values: list[float | None], unit: str, digits: int, shown: str) -> None:
    assert span(values, unit, digits) == shown


def test_the_policy_floor_is_reported_where_measured_and_never_a_target() -> None:
    """The ordinary burst with the least MutatingAdmissionPolicy: its ratio to the bare burst and ours over it."""
    measured, absent = good_run(), good_run()
    measured.policy_floor = burst(5.25)
    text = "\n".join(lines([measured], SHAPES))
    assert "with the least MutatingAdmissionPolicy" in text
    assert "ratio to without 1.05; ours over it 1.05" in text
    assert "least MutatingAdmissionPolicy" not in "\n".join(lines([absent], SHAPES))
    assert missed([measured]) == []
