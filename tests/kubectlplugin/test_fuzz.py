"""A bounded fuzz run of what `kubectl gpushare` reads from the cluster: nodes, pods (annotations, intents, names,
statuses) and Events with any text in them. 0 crashes, and no character in the tables (summary and -d) that is not
printable, nor a row that was not a container; the JSON is the report, escaped by json.dumps. GPUSHARE_FUZZ_CASES
(tests/harness/fuzzing.py) raises the number of cases."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract import ASSIGNED, ASSUME_TIME, DEV, IDX, POD
from contract.keys import GPU_COUNT
from kubectlplugin import render
from kubectlplugin.events import PLUGIN_COMPONENT
from kubectlplugin.model import START_FAILURES, build
from tests.harness.fuzzing import CASES, annotation_values, quantities
from tests.harness.kubectl_fixtures import CONTRACT, RESOURCE, Obj, allocate, assign, pod, stamp

pytestmark = pytest.mark.timeout(300)
FUZZ = settings(max_examples=CASES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NOW = datetime.datetime(2026, 6, 1, 12, tzinfo=datetime.UTC)

# What breaks a line, moves the cursor or hides text, and digits Python reads but the protocol does not.
NASTY = ["\n", "\r", "\x1b[2J", "\x1b]0;t\x07", "\x85", "\u2028", "\u202e", "\t", "\x00", "\x7f", "²", "٣", "\uff13",
         "1\n2", "main\ngpu-x   0   ns   fake"]
texts = st.one_of(st.text(max_size=24), st.sampled_from(NASTY),
                  st.lists(st.sampled_from(NASTY), max_size=3).map("".join))
UIDS = ["u-1", "u-2", "u-3"]
NODES = ["n1", "n2\n", "n3\x1b[1m"]


def mostly(usual: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(usual, usual, usual, odd)


def _stamp(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# Around NOW, within and beyond CLOCK_SKEW (Events believed or not), and times that are no time or odd ones.
times = mostly(st.integers(-3 * 3600, 600).map(lambda s: _stamp(NOW + datetime.timedelta(seconds=s))),
               st.one_of(st.sampled_from(["9999-12-31T23:59:59Z", "0001-01-01T00:00:00+14:00", "",
                                          "2026-06-01T12:00:00"]), st.text(max_size=25)))
node_names = mostly(st.sampled_from(NODES), texts)
waiting = st.fixed_dictionaries({"reason": st.sampled_from([*START_FAILURES, "ContainerCreating", ""]),
                                 "message": mostly(texts.map(lambda t: f"PreStartContainer {t}"), texts)})
statuses = st.fixed_dictionaries({}, optional={
    "phase": st.sampled_from(["Pending", "Running", "Failed"]),
    "reason": st.sampled_from(["UnexpectedAdmissionError", "Evicted"]),
    "message": texts,
    "containerStatuses": st.lists(st.fixed_dictionaries({"name": texts, "state": st.one_of(
        st.fixed_dictionaries({"waiting": waiting}), st.just({"running": {}}))}), max_size=2),
})

# What the kubelet writes when the plugin's PreStartContainer refused a start: the Events' words are shown for it.
start_failures = st.builds(lambda text: {"containerStatuses": [{"name": "c", "state": {"waiting": {
    "reason": "CreateContainerConfigError",
    "message": f"device plugin PreStartContainer rpc failed with err: {text}"}}}]}, texts)


def _wellformed(namespace: str, name: str, uid: str, names: list[str], node_name: str, index: int, stage: int,
                status: dict[str, Any], created: str | None) -> Obj:
    """A pod as the webhook, the extender and the plugin leave it (`stage` 0 stamped, 1 assigned, 2 allocated), with
    any names, any status and, maybe, a creation time."""
    out = stamp(pod(namespace, name, dict.fromkeys(names, 4)))
    out["metadata"]["uid"] = uid
    if stage:
        out = assign(out, index, 16, node_name)
    if stage == 2:
        out = allocate(out)
    out["status"].update(status)
    if created is not None:
        out["metadata"]["creationTimestamp"] = created
    return out


wellformed = st.builds(_wellformed, texts, texts, st.sampled_from(UIDS), st.lists(texts, min_size=1, max_size=3,
                       unique=True), st.sampled_from(NODES), st.integers(0, 2), st.sampled_from([2, 1, 0]),
                       st.one_of(start_failures, statuses),
                       st.one_of(st.none(), times))


def _intent(containers: dict[str, Any], total: Any) -> str:
    return json.dumps({"version": 1, "allocationId": "a", "resource": RESOURCE, "unit": "GiB", "total": total,
                       "containers": containers, "initContainers": {}})


intents = mostly(st.builds(_intent, st.dictionaries(texts, st.integers(1, 80), max_size=3), st.integers(0, 100)),
                 annotation_values)
annotation_maps = st.fixed_dictionaries({}, optional={
    IDX: mostly(st.sampled_from(["0", "1", "7"]), annotation_values),
    DEV: mostly(st.just("16"), annotation_values),
    POD: mostly(st.just("4"), annotation_values),
    ASSIGNED: mostly(st.sampled_from(["true", "false"]), annotation_values),
    ASSUME_TIME: mostly(st.just("1780300000000000000"), annotation_values),
    CONTRACT.intent_key: intents,
    CONTRACT.signature_key: st.just("c2ln"),
    CONTRACT.allocation_key: annotation_values,
})
containers = st.lists(st.fixed_dictionaries({"name": texts, "resources": st.fixed_dictionaries(
    {"limits": st.dictionaries(st.just(RESOURCE), mostly(st.sampled_from(["4", "2"]),
                                                        st.one_of(st.sampled_from(["²", "٣"]), quantities)))})}),
    min_size=1, max_size=3)
# Anything in the annotations, the limits, the names and the status.
raw = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({"namespace": texts, "name": texts, "uid": st.sampled_from(UIDS),
                                       "annotations": annotation_maps},
                                      optional={"creationTimestamp": times, "deletionTimestamp": times}),
    "spec": st.fixed_dictionaries({"containers": containers}, optional={"nodeName": node_names}),
    "status": statuses,
})
pods = st.one_of(wellformed, wellformed, raw)


def _plugin_event(uid: str, host: str, reason: str, message: str, kind: str, when: datetime.datetime,
                  lag: int) -> Obj:
    """An Event as the device plugin posts it (deviceplugin/apiserver.py event_body), or a forgery of one; the API
    server stored it `lag` seconds after the time it claims."""
    stored = when + datetime.timedelta(seconds=lag)
    return {"metadata": {"name": "e", "creationTimestamp": _stamp(stored)},
            "involvedObject": {"kind": "Pod", "uid": uid}, "reason": reason, "message": message, "type": kind,
            "source": {"component": PLUGIN_COMPONENT, "host": host}, "reportingComponent": PLUGIN_COMPONENT,
            "reportingInstance": host, "lastTimestamp": _stamp(when)}


moments = st.integers(-3 * 3600, 600).map(lambda s: NOW + datetime.timedelta(seconds=s))
plugin_events = st.builds(_plugin_event, st.sampled_from(UIDS), st.sampled_from(NODES), texts, texts,
                          st.sampled_from(["Warning", "Normal"]), moments, st.integers(-180, 60))
# Events of any shape: about one of the pods' uids, from one of the nodes, at any time.
odd_events = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({"name": texts}, optional={"creationTimestamp": times}),
    "involvedObject": st.fixed_dictionaries({"kind": mostly(st.just("Pod"), st.just("Node")),
                                             "uid": st.sampled_from(UIDS)}),
    "reason": texts, "message": texts, "type": st.sampled_from(["Warning", "Normal"]),
    "source": st.fixed_dictionaries({"component": mostly(st.just(PLUGIN_COMPONENT), st.just("kubelet")),
                                     "host": node_names}),
    "lastTimestamp": times,
}, optional={"reportingComponent": mostly(st.just(PLUGIN_COMPONENT), st.just("x")), "reportingInstance": node_names,
             "eventTime": times})
events = st.one_of(plugin_events, plugin_events, odd_events)
capacities = mostly(st.sampled_from(["2", "16", "64", "1k"]), annotation_values)
nodes = st.fixed_dictionaries({
    "metadata": st.fixed_dictionaries({"name": node_names}),
    "status": st.fixed_dictionaries({"capacity": st.fixed_dictionaries({}, optional={
        GPU_COUNT: capacities, RESOURCE: capacities})}),
})


def printable(text: str) -> bool:
    return all(c.isprintable() for line in text.split("\n") for c in line)


@FUZZ
@given(nodes=st.lists(nodes, max_size=2), pods=st.lists(pods, min_size=1, max_size=3),
       events=st.lists(events, min_size=1, max_size=4),
       namespace=st.one_of(st.none(), texts))
def test_what_the_cluster_holds_never_crashes_nor_reaches_the_terminal_raw(
        nodes: list[Any], pods: list[Any], events: list[Any], namespace: str | None) -> None:
    report = build(nodes, pods, events, CONTRACT, namespace=namespace, now=NOW)
    summary, details = render.summary(report), render.details(report)
    assert printable(summary) and printable(details), (summary, details)
    rows = sum(max(1, len(p.containers)) for n in report.nodes for g in n.gpus for p in g.pods) + sum(
        max(1, len(p.containers)) for n in report.nodes for p in n.unplaced) + sum(
        max(1, len(p.containers)) for p in report.pending)
    assert len(details.split("\n")) == (1 + rows if rows else 1), details
    shown = render.as_json(report)
    assert printable(shown)
    assert json.loads(shown) == render.document(report)
