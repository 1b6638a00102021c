"""Property: the quick shape check of a review's pod accepts exactly the pods the full check (which words the
message) accepts, over pods with fields of the wrong type sprinkled in."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.webhook.rules.test_mutate_property import pods
from webhook.rules.shape import shape_problem, well_shaped

wrong: st.SearchStrategy[Any] = st.sampled_from([None, 5, "s", [], {}, True])


def spoil(value: Any, draw: st.DrawFn) -> Any:
    """The value, or (sometimes) one of its fields, entries or itself replaced by a value of another type."""
    if draw(st.integers(0, 9)) == 0:
        return draw(wrong)
    if isinstance(value, dict):
        return {k: spoil(v, draw) for k, v in value.items()}
    if isinstance(value, list):
        return [spoil(v, draw) for v in value]
    return value


@st.composite
def shaky_pods(draw: st.DrawFn) -> dict[str, Any]:
    pod = draw(pods())
    for c in pod["spec"]["containers"]:
        c.setdefault("env", []).append({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
        c["volumeMounts"] = [{"name": "v", "mountPath": "/v"}]
    pod["spec"]["nodeName"] = "n"
    pod["spec"]["ephemeralContainers"] = []
    spoiled: dict[str, Any] = spoil(pod, draw)
    return spoiled if isinstance(spoiled, dict) else pod


@settings(max_examples=500, deadline=None)
@given(pod=shaky_pods())
def test_the_quick_shape_check_accepts_exactly_what_the_full_one_accepts(pod: dict[str, Any]) -> None:
    assert well_shaped(pod) == (shape_problem(pod) is None)
