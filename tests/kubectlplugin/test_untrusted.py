"""What `kubectl gpushare` makes of what others may write: Events anyone allowed to create Events in a namespace can
forge, annotation values in digits other than ASCII, and names and messages with control characters."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import pytest
import yaml

from contract import DEV, IDX, POD
from contract.keys import GPU_COUNT
from kubectlplugin import cli, cluster, render
from kubectlplugin.model import build, pod_row
from tests.harness.kubectl_fixtures import CONTRACT, allocate, assign, event, node, pod, stamp

Obj = dict[str, Any]
NOW = datetime.datetime.now(datetime.UTC)
START_FAILED = "failed to generate container: device plugin PreStartContainer rpc failed with err: no room"


def stamp_of(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


FUTURE = stamp_of(NOW + datetime.timedelta(days=400))
JUST_NOW = stamp_of(NOW - datetime.timedelta(seconds=5))


def placed() -> Obj:
    return assign(stamp(pod("ns", "p", {"main": 4})), 1, 16, "n1")


def start_failed(p: Obj, message: str = START_FAILED) -> Obj:
    """The pod once the kubelet failed a container start on the plugin's PreStartContainer answer."""
    out = copy.deepcopy(p)
    out["status"]["containerStatuses"] = [{"name": "main", "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": message}}}]
    return out


def annotated(p: Obj, changes: dict[str, str]) -> Obj:
    out = copy.deepcopy(p)
    out["metadata"]["annotations"].update(changes)
    return out


def row_of(p: Obj, events: list[Obj]) -> tuple[str, str]:
    found = pod_row(p, CONTRACT, events)
    assert found is not None
    return found[0].state, found[0].reason


# ---------------------------------------------------------------------------------------------------------
# Events decide no state: anyone who may create Events in the namespace can write any reason, source and time.


@pytest.mark.parametrize("when", [FUTURE, JUST_NOW], ids=["dated in the future", "dated now"])
@pytest.mark.parametrize("make", [lambda: allocate(placed()), placed], ids=["allocated", "assigned"])
def test_a_forged_warning_does_not_refuse_a_pod(make: Any, when: str) -> None:
    p = make()
    forged = event(p, "GpuShareNoRoom", "Pod ns/p does not fit; delete it.", when)
    state, reason = row_of(p, [forged])
    assert state == ("allocated" if p["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "true"
                     else "assigned")
    assert reason == ""


def test_a_refusal_the_kubelet_recorded_takes_its_reason_from_the_plugins_event() -> None:
    p = start_failed(placed())
    genuine = event(p, "GpuShareNoRoom", "Pod ns/p does not fit on GPU 1.", JUST_NOW)
    assert row_of(p, [genuine]) == ("refused", "GpuShareNoRoom: Pod ns/p does not fit on GPU 1.")


def _other_host(e: Obj) -> Obj:
    e["source"]["host"] = e["reportingInstance"] = "n2"
    return e


def _older_than_the_pod(e: Obj) -> Obj:
    e["lastTimestamp"] = "2020-01-01T00:00:00Z"
    return e


def _dated_after_its_creation(e: Obj) -> Obj:
    e["lastTimestamp"] = stamp_of(NOW + datetime.timedelta(hours=1))
    e["metadata"]["creationTimestamp"] = JUST_NOW
    return e


def _from_another_component(e: Obj) -> Obj:
    e["source"]["component"] = e["reportingComponent"] = "someone"
    return e


@pytest.mark.parametrize("forge", [
    lambda e: {**e, "lastTimestamp": FUTURE}, _other_host, _older_than_the_pod, _dated_after_its_creation,
    _from_another_component,
], ids=["dated in the future", "from another node", "older than the pod", "dated after the API server stored it",
        "from another component"])
def test_an_event_that_cannot_be_the_plugins_gives_no_reason(forge: Any) -> None:
    p = start_failed(placed())
    p["metadata"]["creationTimestamp"] = stamp_of(NOW - datetime.timedelta(minutes=10))
    forged = forge(event(p, "GpuShareBadSignature", "forged", JUST_NOW))
    assert row_of(p, [forged]) == ("refused", f"CreateContainerConfigError: {START_FAILED}")


# ---------------------------------------------------------------------------------------------------------
# Numbers: ASCII digits only, as the protocol reads them (Python's int() and str.isdigit() take others).


@pytest.mark.parametrize("key", [IDX, DEV, POD])
@pytest.mark.parametrize("value", ["²", "٣", "\uff13", "¹⁰", "\U0001d7d9"])
def test_an_annotation_in_other_digits_is_invalid(key: str, value: str) -> None:
    found = pod_row(annotated(placed(), {key: value}), CONTRACT)
    assert found is not None
    row, memory = found
    assert row.state == "invalid" and key in row.reason, row
    assert (row.gpu if key == IDX else memory if key == DEV else row.units) != 3


@pytest.mark.parametrize("value", ["²", "٣", "\uff13"])
def test_a_node_capacity_in_other_digits_is_no_gpu_count(value: str) -> None:
    n1 = node("n1", 2, 16)
    n1["status"]["capacity"][GPU_COUNT] = value
    report = build([n1], [], [], CONTRACT)
    assert [(n.name, len(n.gpus)) for n in report.nodes] == [("n1", 0)]


# ---------------------------------------------------------------------------------------------------------
# Everything printed that came from the cluster is printable: no row or escape sequence can be injected.


def printable(text: str) -> bool:
    return all(c.isprintable() or c == "\n" for c in text)


def test_an_intent_container_name_cannot_add_a_row() -> None:
    p = placed()
    intent = json.loads(p["metadata"]["annotations"][CONTRACT.intent_key])
    intent["containers"] = {"main\ngpu-x   0     ns   fake   c   1   allocated": 4}
    p["metadata"]["annotations"][CONTRACT.intent_key] = json.dumps(intent)
    shown = render.details(build([node("n1", 2, 16)], [p], [], CONTRACT))
    assert len(shown.splitlines()) == 2, shown
    assert "main\\ngpu-x" in shown


def test_a_refusal_message_cannot_drive_the_terminal() -> None:
    p = start_failed(placed(), "device plugin PreStartContainer rpc failed: \x1b[2J\x1b[31mdelete everything\x07")
    report = build([node("n1", 2, 16)], [p], [], CONTRACT)
    shown = render.summary(report) + "\n" + render.details(report)
    assert printable(shown), shown
    assert "\\x1b[2J\\x1b[31mdelete everything\\x07" in shown
    assert json.loads(render.as_json(report))["nodes"][0]["gpus"][1]["pods"][0]["reason"].count("\x1b") == 2


def test_names_with_control_characters_are_escaped_in_every_table() -> None:
    p = placed()
    p["metadata"].update(namespace="ns\r", name="p\u2028x")
    p["spec"]["nodeName"] = "n1\x1b]0;title\x07"
    report = build([], [p], [], CONTRACT)
    shown = render.summary(report) + "\n" + render.details(report)
    assert printable(shown), shown
    assert "p\\u2028x" in shown and "ns\\r" in shown and "n1\\x1b]0;title\\x07" in shown
    assert printable(render.as_json(report))
    shown_yaml = render.as_yaml(report)
    assert printable(shown_yaml) and shown_yaml.isascii(), shown_yaml
    assert yaml.safe_load(shown_yaml) == render.document(report)


def test_the_error_line_is_printable(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def refused(access: cluster.Access, namespace: str | None, selector: str = "") -> cluster.Snapshot:
        raise cluster.ClusterError("the API server at https://h refused (HTTP 500: \x1b[2Jgone\nerror: forged)")

    monkeypatch.setattr(cluster, "read", refused)
    assert cli.main(["--kubeconfig", "/dev/null"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and printable(err), err
    assert "\\x1b[2Jgone\\nerror: forged" in err


def test_a_node_claiming_too_many_gpus_gets_no_row_per_gpu() -> None:
    """A node's status may say anything (its plugin writes the count): 10**18 GPUs must not become 10**18 rows."""
    n1 = node("n1", 2, 16)
    n1["status"]["capacity"][GPU_COUNT] = "1000000000000000000"
    (shown,) = build([n1], [], [], CONTRACT).nodes
    assert (shown.name, shown.gpus) == ("n1", ())
