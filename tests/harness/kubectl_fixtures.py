"""Nodes, pods and Events in the API's JSON shape for the plugin's pure tests, and one fixed cluster for the golden
table: two GPU nodes beside the reference extender, pods in every state."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping
from typing import Any

from contract import ASSIGNED, IDX, Allocation, ContainerSlot, Contract, demand_of, intent_for
from contract.keys import GPU_COUNT
from kubectlplugin.events import PLUGIN_COMPONENT
from tests.harness.pods import assigned, unit_pod

CONTRACT = Contract()
RESOURCE = CONTRACT.resource
Obj = dict[str, Any]


def node(name: str, gpus: int | None, memory: int | None) -> Obj:
    capacity = {"cpu": "8"}
    if memory is not None:
        capacity[RESOURCE] = str(memory * (gpus or 1))
    if gpus is not None:
        capacity[GPU_COUNT] = str(gpus)
    return {"metadata": {"name": name}, "status": {"capacity": capacity}}


def pod(namespace: str, name: str, units: Mapping[str, int], *, init: Mapping[str, int] | None = None,
        node_name: str | None = None, phase: str = "Pending") -> Obj:
    """tests/harness/pods.py's pod as the API server returns it: a UID, annotations, a node, a phase."""
    out = unit_pod(name, units, init, namespace=namespace, image="app:1")
    out["metadata"].update({"uid": f"uid-{namespace}-{name}", "annotations": {}})
    if node_name:
        out["spec"]["nodeName"] = node_name
    out["status"] = {"phase": phase}
    return out


def stamp(p: Obj, contract: Contract = CONTRACT) -> Obj:
    """What the mutating webhook adds (the signature is not read by the plugin, so any text stands in)."""
    out = copy.deepcopy(p)
    intent = intent_for(demand_of(out, contract.resource), contract, f"alloc-{out['metadata']['name']}")
    out["metadata"]["annotations"].update({contract.intent_key: intent.to_json(), contract.signature_key: "c2ln"})
    return out


def assign(p: Obj, index: int, device: int, node_name: str) -> Obj:
    """What the scheduler extender writes before binding, and the binding."""
    out = assigned(p, index, device)
    out["spec"]["nodeName"] = node_name
    return out


def allocate(p: Obj, *, record: bool = True, contract: Contract = CONTRACT) -> Obj:
    """What a device plugin writes once the containers got the GPU; the reference plugin writes no record."""
    out = copy.deepcopy(p)
    annotations = out["metadata"]["annotations"]
    annotations[ASSIGNED] = "true"
    if record:
        demand = demand_of(out, contract.resource)
        slots = {n: ContainerSlot(u, "slot") for n, u in demand.containers if u}
        allocation = Allocation(f"alloc-{out['metadata']['name']}", out["spec"]["nodeName"], int(annotations[IDX]),
                                "GPU-uuid", slots)
        annotations[contract.allocation_key] = allocation.to_json()
    out["status"]["phase"] = "Running"
    return out


def event(p: Obj, reason: str, message: str, when: str, event_type: str = "Warning",
          component: str = PLUGIN_COMPONENT) -> Obj:
    """An Event about pod `p` as the device plugin of its node posts it (deviceplugin/apiserver.py event_body)."""
    meta = p["metadata"]
    host = p["spec"].get("nodeName", "")
    return {"metadata": {"name": f"{meta['name']}.{reason.lower()}.{when[11:19].replace(':', '')}",
                         "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta["uid"]},
            "reason": reason, "message": message, "type": event_type,
            "source": {"component": component, "host": host}, "reportingComponent": component,
            "reportingInstance": host, "lastTimestamp": when}


def admission_refused(p: Obj, message: str) -> Obj:
    out = copy.deepcopy(p)
    out["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                     "message": f"Allocate failed due to {message}, which is unexpected"}
    return out


def ago(seconds: int) -> str:
    """A time that many seconds before now, as the API writes it: the Events of the golden cluster happened just
    before it is shown, since kubectl gpushare believes no Event from before its pod or after now."""
    moment = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def start_failed(p: Obj, message: str) -> Obj:
    """The pod once the kubelet failed its first container's start on the plugin's PreStartContainer answer
    (pkg/kubelet/cm/devicemanager: "device plugin PreStartContainer rpc failed with err: ...")."""
    out = copy.deepcopy(p)
    name = out["spec"]["containers"][0]["name"]
    out["status"]["containerStatuses"] = [{"name": name, "state": {"waiting": {
        "reason": "CreateContainerConfigError",
        "message": f"device plugin PreStartContainer rpc failed with err: {message}"}}}]
    return out


def golden_cluster() -> tuple[list[Obj], list[Obj], list[Obj]]:
    """(nodes, pods, events) of the golden table."""
    nodes = [node("gpu-a", 2, 16), node("gpu-b", 1, 24), node("cpu-only", None, None)]
    train = allocate(assign(stamp(pod("ml", "train", {"main": 8, "log": 0}, init={"fetch": 2})), 0, 16, "gpu-a"))
    serve = assign(stamp(pod("ml", "serve", {"api": 4, "cache": 2})), 0, 16, "gpu-a")
    legacy = allocate(assign(pod("legacy", "notebook", {"jupyter": 6}), 1, 16, "gpu-a"), record=False)
    moved = allocate(assign(stamp(pod("ml", "moved", {"main": 4})), 1, 16, "gpu-a"))
    noroom = start_failed(assign(stamp(pod("ml", "eval", {"main": 12})), 0, 24, "gpu-b"),
                          "rpc error: code = ResourceExhausted desc = Pod ml/eval does not fit")
    unplaced = admission_refused(stamp(pod("ml", "direct", {"main": 4}, node_name="gpu-b")),
                                 "rpc error: code = FailedPrecondition desc = no pod on node gpu-b admitted by the "
                                 "gpushare webhook has a container asking for exactly 4 GiB")
    waiting = stamp(pod("ml", "huge", {"main": 80}))
    asked = pod("legacy", "fresh", {"main": 2})
    done = allocate(assign(stamp(pod("ml", "finished", {"main": 8})), 1, 16, "gpu-a"))
    done["status"]["phase"] = "Succeeded"
    plain = pod("web", "nginx", {"web": 0}, node_name="gpu-a")
    events = [
        event(moved, "GpuShareAllocated", "Pod ml/moved runs on GPU 1.", ago(5), "Normal"),
        event(noroom, "GpuShareNoRoom", "Pod ml/eval does not fit on GPU 0 of node gpu-b: 12 GiB asked, "
              "8 GiB free; delete pods on that GPU or recreate the pod.", ago(1)),
        event(train, "GpuShareNoRoom", "Pod ml/train did not fit.", ago(10)),
        event(train, "GpuShareAllocated", "Pod ml/train runs on GPU 0.", ago(9), "Normal"),
        event(serve, "Scheduled", "Successfully assigned ml/serve to gpu-a", ago(10), "Normal",
              "default-scheduler"),
    ]
    pods = [train, serve, legacy, moved, noroom, unplaced, waiting, asked, done, plain]
    return nodes, pods, events
