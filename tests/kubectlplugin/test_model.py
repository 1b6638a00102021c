"""Table tests for what `kubectl gpushare` decides: each pod's state and reason, its units, and each GPU's figures."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from typing import Any

import pytest

from contract import IDX, POD, Contract
from kubectlplugin.model import GpuRow, PodRow, build, pod_row
from tests.harness.kubectl_fixtures import (
    CONTRACT,
    admission_refused,
    allocate,
    assign,
    event,
    golden_cluster,
    node,
    pod,
    stamp,
    start_failed,
)

Obj = dict[str, Any]
EARLY, LATE = "2026-01-01T10:00:00Z", "2026-01-01T10:00:09Z"
NOW = datetime.datetime(2026, 1, 1, 10, 5, tzinfo=datetime.UTC)


def base() -> Obj:
    return stamp(pod("ns", "p", {"main": 4}))


def placed() -> Obj:
    return assign(base(), 1, 16, "n1")


def with_status(p: Obj, **status: Any) -> Obj:
    out = copy.deepcopy(p)
    out["status"].update(status)
    return out


def waiting(p: Obj, reason: str, message: str) -> Obj:
    return with_status(p, containerStatuses=[{"name": "main", "state": {"waiting": {"reason": reason,
                                                                                   "message": message}}}])


def new_style_event(p: Obj, reason: str, message: str) -> Obj:
    """An events.k8s.io/v1 Event, as a newer plugin or kubectl might read it."""
    meta = p["metadata"]
    return {"metadata": {"name": "e", "namespace": meta["namespace"]}, "regarding": {"kind": "Pod", "uid": meta["uid"]},
            "reason": reason, "note": message, "message": message, "type": "Warning",
            "reportingController": "gpushare-device-plugin", "reportingInstance": "n1",
            "eventTime": "2026-01-01T10:00:00.123456Z"}


STATES: list[tuple[str, Callable[[], Obj], Callable[[Obj], list[Obj]], str, str]] = [
    ("a pod beside the reference extender, not scheduled yet", lambda: pod("ns", "p", {"main": 4}), lambda p: [],
     "requested", ""),
    ("stamped by the webhook", base, lambda p: [], "stamped", ""),
    ("placed by the extender", placed, lambda p: [], "assigned", ""),
    ("allocated with the plugin's record", lambda: allocate(placed()), lambda p: [], "allocated", ""),
    ("allocated by the reference plugin: ASSIGNED only",
     lambda: allocate(assign(pod("ns", "p", {"m": 4}), 0, 16, "n1"), record=False), lambda p: [], "allocated", ""),
    ("refused by the plugin at PreStartContainer: the kubelet's record, the plugin's words",
     lambda: start_failed(placed(), "no room"), lambda p: [event(p, "GpuShareNoRoom", "Pod ns/p does not fit.", EARLY)],
     "refused", "GpuShareNoRoom: Pod ns/p"),
    ("the plugin's Warning without the kubelet's record decides nothing", placed,
     lambda p: [event(p, "GpuShareNoRoom", "Pod ns/p does not fit.", EARLY)], "assigned", ""),
    ("a refusal the plugin overcame later", lambda: allocate(placed()),
     lambda p: [event(p, "GpuShareNoRoom", "x", EARLY), event(p, "GpuShareAllocated", "ok", LATE, "Normal")],
     "allocated", ""),
    ("refused again after an allocation (a restart on a moved GPU)", lambda: start_failed(allocate(placed()), "moved"),
     lambda p: [event(p, "GpuShareAllocated", "ok", EARLY, "Normal"), event(p, "GpuShareMoved", "moved", LATE)],
     "refused", "GpuShareMoved: moved"),
    ("a refusal the kubelet recorded before the plugin's allocation Event: its own words",
     lambda: start_failed(allocate(placed()), "moved"),
     lambda p: [event(p, "GpuShareMoved", "moved", EARLY), event(p, "GpuShareAllocated", "ok", LATE, "Normal")],
     "refused", "CreateContainerConfigError: device plugin PreStartContainer rpc failed with err: moved"),
    ("the newest of two refusals is the reason", lambda: start_failed(placed(), "no room"),
     lambda p: [event(p, "GpuShareMoved", "newer", LATE), event(p, "GpuShareNoRoom", "older", EARLY)],
     "refused", "GpuShareMoved: newer"),
    ("a Warning from another component is not ours", base,
     lambda p: [event(p, "FailedScheduling", "0/1 nodes", EARLY, component="default-scheduler")], "stamped", ""),
    ("an events.k8s.io Event of the plugin", lambda: start_failed(placed(), "bad signature"),
     lambda p: [new_style_event(p, "GpuShareBadSignature", "the signature does not verify")],
     "refused", "GpuShareBadSignature: the signature does not verify"),
    ("refused by the kubelet at admission (Allocate failed)",
     lambda: admission_refused(stamp(pod("ns", "p", {"main": 4}, node_name="n1")), "no pod asks for 4"),
     lambda p: [], "refused",
     "UnexpectedAdmissionError: Allocate failed due to no pod asks for 4, which is unexpected"),
    ("a container start the plugin's PreStartContainer failed", lambda: waiting(
        placed(), "CreateContainerConfigError", "device plugin PreStartContainer rpc failed with err: no\nroom"),
     lambda p: [], "refused",
     "CreateContainerConfigError: device plugin PreStartContainer rpc failed with err: no room"),
    ("a container waiting for its image is not refused", lambda: waiting(placed(), "ContainerCreating", ""),
     lambda p: [], "assigned", ""),
    ("an index that is no number", lambda: _annotated(placed(), {IDX: "one"}), lambda p: [], "invalid",
     "annotation ALIYUN_COM_GPU_MEM_IDX is 'one', which is not a non-negative decimal integer"),
    ("an intent that is no JSON", lambda: _annotated(base(), {CONTRACT.intent_key: "{"}), lambda p: [], "invalid",
     "annotation gpushare.io/intent is not valid JSON"),
    ("ASSIGNED neither true nor false", lambda: _annotated(placed(), {"ALIYUN_COM_GPU_MEM_ASSIGNED": "yes"}),
     lambda p: [], "invalid", "annotation ALIYUN_COM_GPU_MEM_ASSIGNED is 'yes'"),
    ("deleted while its image pulls", lambda: deleted(placed()), lambda p: [], "deleting",
     "being deleted before a GPU container ran; its units are free again"),
    ("deleted while it runs", lambda: deleted(allocate(placed()), "running"), lambda p: [], "deleting",
     "being deleted; GPU container main may still run, so its units are held until they stop"),
    ("deleted after a refusal", lambda: deleted(placed()), lambda p: [event(p, "GpuShareNoRoom", "x", EARLY)],
     "deleting", "being deleted before"),
]


def deleted(p: Obj, state: str | None = None) -> Obj:
    """The pod once deleted; its container `main` in `state` (None: no status written)."""
    out = copy.deepcopy(p)
    out["metadata"]["deletionTimestamp"] = LATE
    if state is not None:
        out["status"].update(phase="Running", containerStatuses=[{"name": "main", "state": {state: {}}}])
    return out


def _annotated(p: Obj, annotations: dict[str, str]) -> Obj:
    out = copy.deepcopy(p)
    out["metadata"]["annotations"].update(annotations)
    return out


@pytest.mark.parametrize(("case", "make", "events", "state", "reason"), STATES, ids=[s[0] for s in STATES])
def test_state_and_reason(case: str, make: Callable[[], Obj], events: Callable[[Obj], list[Obj]], state: str,
                          reason: str) -> None:
    p = make()
    found = pod_row(p, CONTRACT, events(p), NOW)
    assert found is not None, case
    row, _ = found
    assert row.state == state, row
    assert row.reason.startswith(reason) if reason else row.reason == "", row.reason


@pytest.mark.parametrize(("case", "make"), [
    ("no GPU memory asked, no annotation", lambda: pod("ns", "web", {"web": 0})),
    ("finished", lambda: with_status(allocate(placed()), phase="Succeeded")),
    ("failed after running", lambda: with_status(allocate(placed()), phase="Failed", reason="Error")),
])
def test_pods_that_hold_no_gpu_memory_are_left_out(case: str, make: Callable[[], Obj]) -> None:
    assert pod_row(make(), CONTRACT) is None, case


@pytest.mark.parametrize(("case", "make", "counted"), [
    ("deleted while its image pulls", lambda: deleted(placed()), False),
    ("deleted while it runs", lambda: deleted(allocate(placed()), "running"), True),
    ("deleted just after the plugin delivered it", lambda: deleted(allocate(placed())), True),
    ("deleted, its container stopped", lambda: deleted(allocate(placed()), "terminated"), False),
    ("deleted, the reference plugin's pod running", lambda: deleted(
        allocate(assign(pod("ns", "p", {"main": 4}), 1, 16, "n1"), record=False), "running"), True),
])
def test_a_pod_being_deleted_is_promised_only_while_it_may_run(case: str, make: Callable[[], Obj],
                                                                 counted: bool) -> None:
    """As the device plugin counts it: the scheduler extender freed its memory at the deletion."""
    p = make()
    report = build([node("n1", 2, 16)], [p, placed_as("q", 3)], [], CONTRACT)
    (gpu,) = [g for g in report.nodes[0].gpus if g.index == 1]
    assert [(r.name, r.state, r.counted) for r in gpu.pods] == [("p", "deleting", counted), ("q", "assigned", True)]
    assert gpu.promised == 3 + (4 if counted else 0)


def placed_as(name: str, units: int) -> Obj:
    return assign(stamp(pod("ns", name, {"main": units})), 1, 16, "n1")


def test_units_come_from_the_intent_per_container_and_the_pod_total_from_pod() -> None:
    p = assign(stamp(pod("ns", "p", {"a": 3, "b": 0, "c": 2}, init={"i": 6})), 0, 16, "n1")
    row, memory = pod_row(p, CONTRACT) or (None, None)
    assert row is not None and memory == 16
    assert [(c.name, c.units, c.init) for c in row.containers] == [("i", 6, True), ("a", 3, False), ("c", 2, False)]
    assert row.units == 6  # max(init 6, apps 5): the pod's effective request, which the extender writes
    odd = _annotated(p, {POD: "9"})  # what the extender promised is what the GPU carries, even if wrong
    assert (pod_row(odd, CONTRACT) or (None,))[0] == PodRow("ns", "p", "n1", 0, 9, row.containers, "assigned")


def test_other_resource_name_and_prefix() -> None:
    contract = Contract(resource="example.com/vram", unit="MiB", prefix="vram.example.com/")
    p = pod("ns", "p", {"main": 0})
    p["spec"]["containers"][0]["resources"] = {"limits": {"example.com/vram": "512"}}
    p = stamp(p, contract)
    assert contract.intent_key in p["metadata"]["annotations"]
    row = (pod_row(p, contract) or (None,))[0]
    assert row is not None and row.units == 512 and row.state == "stamped"
    assert pod_row(p, CONTRACT) is None  # another resource and prefix: nothing of the default contract's


def test_gpu_figures_of_the_golden_cluster() -> None:
    nodes, pods, events = golden_cluster()
    report = build(nodes, pods, events, CONTRACT)
    figures = {(n.name, g.index): (g.memory, g.promised, g.allocated, [p.name for p in g.pods])
               for n in report.nodes for g in n.gpus}
    assert figures == {
        ("gpu-a", 0): (16, 14, 8, ["serve", "train"]),
        ("gpu-a", 1): (16, 10, 10, ["notebook", "moved"]),
        ("gpu-b", 0): (24, 12, 0, ["eval"]),
    }
    assert [p.name for n in report.nodes for p in n.unplaced] == ["direct"]
    assert [p.name for p in report.pending] == ["fresh", "huge"]


def test_a_refused_pod_that_failed_at_admission_counts_nothing_on_its_gpu() -> None:
    failed = admission_refused(assign(stamp(pod("ns", "f", {"m": 4})), 0, 16, "n1"), "no")
    live = allocate(assign(stamp(pod("ns", "l", {"m": 2})), 0, 16, "n1"))
    (gpu,) = build([node("n1", 1, 16)], [failed, live], [], CONTRACT).nodes[0].gpus
    assert (gpu.promised, gpu.allocated, len(gpu.pods)) == (2, 2, 2)


def test_gpus_come_from_capacity_and_from_the_pods_that_name_them() -> None:
    odd = assign(stamp(pod("ns", "p", {"m": 4})), 5, 40, "n1")  # an index beyond gpu-count still shows
    report = build([node("n1", 2, 32), node("n2", None, 20)], [odd], [], CONTRACT)
    shown = [(n.name, [(g.index, g.memory) for g in n.gpus]) for n in report.nodes]
    # n2 offers memory but publishes no GPU count: nothing says how many GPUs it has.
    assert shown == [("n1", [(0, 32), (1, 32), (5, 40)]), ("n2", [])]
    assert GpuRow(0, None, ()).promised == 0


def test_namespace_and_node_filters() -> None:
    nodes, pods, events = golden_cluster()
    only_ml = build(nodes, [p for p in pods if p["metadata"]["namespace"] == "ml"], events, CONTRACT, namespace="ml")
    assert only_ml.namespace == "ml"
    assert {p.namespace for n in only_ml.nodes for g in n.gpus for p in g.pods} == {"ml"}
    only_b = build(nodes, pods, events, CONTRACT, only_nodes=["gpu-b"])
    assert [n.name for n in only_b.nodes] == ["gpu-b"] and only_b.pending == ()
