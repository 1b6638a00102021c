"""The scheduler-extender stand-in's decisions, against a fake of the tier's own REST client."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.extender import Extender
from webhook.protocol import ASSIGNED, DEV, IDX, POD


def gpu_pod(name: str, units: int, idx: int | None = None, phase: str = "Running") -> dict[str, Any]:
    annotations = {IDX: str(idx), POD: str(units)} if idx is not None else {}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "7",
                         "annotations": annotations},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {"aliyun.com/gpu-mem": str(units)}}}]},
            "status": {"phase": phase}}


class FakeApi:
    def __init__(self, pods: list[dict[str, Any]], count: int = 2, memory: int = 128) -> None:
        self.pods = pods
        self.capacity = {"aliyun.com/gpu-count": str(count), "aliyun.com/gpu-mem": str(memory)}
        self.calls: list[tuple[str, str, Any]] = []

    def get(self, path: str) -> Any:
        if path.startswith("/api/v1/nodes/"):
            return {"status": {"capacity": self.capacity}}
        if path.startswith("/api/v1/pods?"):
            return {"items": self.pods}
        name = path.rsplit("/", 1)[1]
        return next(p for p in self.pods if p["metadata"]["name"] == name)

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        self.calls.append((method, path, body))
        return {}


@pytest.mark.parametrize(
    ("others", "units", "kept"),
    [
        ([], 64, True),
        ([gpu_pod("a", 64, 0), gpu_pod("b", 64, 1)], 8, False),
        ([gpu_pod("a", 64, 0), gpu_pod("b", 60, 1)], 4, True),
        ([gpu_pod("a", 64, 0), gpu_pod("b", 64, 1, phase="Succeeded")], 8, True),
        ([], 65, False),
    ],
)
def test_filter_keeps_a_node_only_where_one_gpu_has_room(others: list[dict[str, Any]], units: int,
                                                        kept: bool) -> None:
    extender = Extender(FakeApi(others))
    answer = extender.filter({"Pod": gpu_pod("new", units), "NodeNames": ["n1"]})
    assert (answer["NodeNames"] == ["n1"]) is kept
    if not kept:
        assert f"has {units} units free" in answer["FailedNodes"]["n1"]


def test_bind_writes_the_assignment_best_fit_then_binds() -> None:
    api = FakeApi([gpu_pod("a", 40, 0), gpu_pod("b", 56, 1), gpu_pod("new", 8)])
    answer = Extender(api).bind({"PodName": "new", "PodNamespace": "ns", "PodUID": "uid-new",
                                 "Node": "n1"})
    assert answer == {"Error": ""}
    (patch_method, _, patch), (bind_method, bind_path, binding) = api.calls
    assert patch_method == "PATCH" and bind_method == "POST" and bind_path.endswith("/new/binding")
    annotations = patch["metadata"]["annotations"]
    assert annotations[IDX] == "1", "GPU 1 has the least room that still fits"
    assert (annotations[DEV], annotations[POD], annotations[ASSIGNED]) == ("64", "8", "false")
    assert patch["metadata"]["resourceVersion"] == "7"
    assert binding["target"] == {"apiVersion": "v1", "kind": "Node", "name": "n1"}


def test_bind_refuses_when_no_gpu_has_room() -> None:
    api = FakeApi([gpu_pod("a", 64, 0), gpu_pod("b", 64, 1), gpu_pod("new", 8)])
    answer = Extender(api).bind({"PodName": "new", "PodNamespace": "ns", "Node": "n1"})
    assert "no GPU of node n1" in answer["Error"] and api.calls == []
