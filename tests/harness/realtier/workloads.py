"""Pods for the real-cluster tier, and reading back what their containers received.

Every test container runs `e2e.images.REPORT` (one `gpushare-e2e ...` line) and sleeps; `report()` reads it
with `kubectl logs`. Pods use hostNetwork: they need no network, and a sandbox without one of its own starts
without a veth and an address of the pod network (e2e/podnet.py), which the installed gpushare pods use.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from contract import IDX, POD
from contract.keys import DEFAULT_RESOURCE
from e2e import settings as ports
from e2e.cluster import Cluster
from e2e.images import REPORT
from e2e.kube import Kubectl, kubectl_path
from e2e.settings import E2eSettings
from node.inventory import fake_gpus
from tests.harness.judge import Counts

RESOURCE = DEFAULT_RESOURCE
_LINE = re.compile(r"gpushare-e2e container=(?P<container>\S*) visible=(?P<visible>\S*) idx=(?P<idx>\S*) "
                   r"slot=(?P<slot>\S*) mount=(?P<mount>.*)")


def image(cluster: Cluster, delay_ms: int = 0, repository: str = "busybox") -> str:
    """A test image tag; with a delay, a fresh tag whose pull takes that long."""
    registry = f"127.0.0.1:{cluster.settings.port(ports.REGISTRY)}/gpushare-e2e/{repository}"
    if delay_ms:
        return f"{registry}:slow-{delay_ms}-{uuid.uuid4().hex[:10]}"
    return f"{registry}:latest"


def container(name: str, img: str, units: int | None = None, *, sidecar: bool = False,
              then: str = "exec sleep 3600") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name, "image": img, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", f"{REPORT}; {then}"],
        "env": [{"name": "GPUSHARE_E2E_CONTAINER", "value": name}],
    }
    if units is not None:
        spec["resources"] = {"limits": {RESOURCE: str(units)}}
    if sidecar:
        spec["restartPolicy"] = "Always"
    return spec


def pod(name: str, containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None,
        labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"hostNetwork": True, "dnsPolicy": "Default", "terminationGracePeriodSeconds": 1,
                            "containers": containers, "automountServiceAccountToken": False}
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": spec}


def replicaset(name: str, replicas: int, template: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": template["spec"]}}}


def create(kubectl: Kubectl, namespace: str, *objects: dict[str, Any]) -> tuple[int, str]:
    """`kubectl create -f -`, as users do; returns (exit status, stderr + stdout)."""
    text = "\n".join(json.dumps(o) for o in objects)
    code, out, err = kubectl.run(["create", "-n", namespace, "-f", "-"], stdin=text)
    return code, err + out


def pods(kubectl: Kubectl, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
    args = ["get", "pods", "-n", namespace]
    if selector:
        args += ["-l", selector]
    items: list[dict[str, Any]] = kubectl.json(args)["items"]
    return items


def wait(what: str, check: Callable[[], bool], timeout: float, interval: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def wait_running(kubectl: Kubectl, namespace: str, count: int, timeout: float) -> list[dict[str, Any]]:
    """Wait for `count` pods all running; fail naming every pod that is not, with its reason."""
    deadline = time.monotonic() + timeout
    while True:
        items = pods(kubectl, namespace)
        if len(items) == count and all(map(running, items)):
            return items
        if time.monotonic() > deadline:
            stuck = {p["metadata"]["name"]: reason(p) for p in items if not running(p)}
            raise AssertionError(f"{len(items)} pods, not all running after {timeout:g} s: {stuck}")
        time.sleep(1)


def phase(p: Mapping[str, Any]) -> str:
    return str((p.get("status") or {}).get("phase", ""))


def running(p: Mapping[str, Any]) -> bool:
    statuses = (p.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)


def settled(p: Mapping[str, Any]) -> bool:
    """Running, or finished for good (Failed, e.g. UnexpectedAdmissionError)."""
    return running(p) or phase(p) in ("Failed", "Succeeded")


def stamp(text: str) -> datetime:
    """An API timestamp (RFC 3339, whole seconds)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def started_at(p: Mapping[str, Any]) -> list[datetime]:
    """When each running container of the pod started."""
    return [stamp(s["state"]["running"]["startedAt"]) for s in (p.get("status") or {}).get("containerStatuses") or []
            if ((s.get("state") or {}).get("running") or {}).get("startedAt")]


def last_start_path(live: Iterable[Mapping[str, Any]], since: datetime) -> dict[str, Any]:
    """Where the time of the pod that started last went: its creation, its scheduling (PodScheduled) and its last
    container's start, in seconds after `since` (the first creation), on the API server's clock in whole seconds."""
    started = [(max(times), p) for p in live if (times := started_at(p))]
    if not started:
        return {}
    last, p = max(started, key=lambda pair: pair[0])
    scheduled = next((c.get("lastTransitionTime") for c in (p.get("status") or {}).get("conditions") or []
                      if c.get("type") == "PodScheduled" and c.get("status") == "True"), None)
    created = stamp(p["metadata"]["creationTimestamp"])
    path: dict[str, Any] = {"pod": p["metadata"]["name"], "created": (created - since).total_seconds()}
    if scheduled:
        path["scheduled"] = (stamp(scheduled) - since).total_seconds()
    path["started"] = (last - since).total_seconds()
    return path


def sort_live(live: Iterable[dict[str, Any]], failed: list[str], stuck: list[str]) -> list[dict[str, Any]]:
    """The live pods that run; each other one goes, with its reason, into `failed` (its phase is Failed) or `stuck`."""
    out = []
    for p in live:
        where = failed if phase(p) == "Failed" else None if running(p) else stuck
        if where is None:
            out.append(p)
        else:
            where.append(f"{p['metadata']['name']}: {reason(p)}")
    return out


def time_to_start(out: Counts, running: Iterable[Mapping[str, Any]], live: Iterable[Mapping[str, Any]],
                  created: list[datetime]) -> None:
    """The first creation to the last container start of a running pod, and where that time went (over every live
    pod), once both are known."""
    starts = [t for p in running for t in started_at(p)]
    if starts and created:
        out.seconds = (max(starts) - min(created)).total_seconds()
        out.last_pod = last_start_path(live, min(created))


def reason(p: Mapping[str, Any]) -> str:
    status = p.get("status") or {}
    if status.get("reason"):
        return f"{status['reason']}: {status.get('message', '')}"
    for s in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (s.get("state") or {}).get("waiting")
        if waiting:
            return f"{s.get('name')}: {waiting.get('reason')}: {waiting.get('message', '')}"
    for s in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        ended = (s.get("state") or {}).get("terminated")
        if ended and ended.get("exitCode"):
            return (f"{s.get('name')}: {ended.get('reason')} (exit {ended.get('exitCode')}): "
                    f"{ended.get('message', '')}")
    return phase(p)


@dataclass(frozen=True)
class Report:
    container: str
    visible: str
    idx: str
    slot: str
    mount: str


def container_log(kubectl: Kubectl, namespace: str, name: str, container_name: str) -> tuple[bool, str]:
    """(read, the log or why it could not be read). The API server fetches a log from the kubelet, which a busy
    node may answer late: a failed read is tried twice more before it counts."""
    why = ""
    for attempt in range(3):
        code, out, err = kubectl.run(["logs", "-n", namespace, name, "-c", container_name], timeout=20)
        if code == 0:
            return True, out
        why = (err or out).strip()
        time.sleep(1 + attempt)
    return False, why


def report(kubectl: Kubectl, namespace: str, name: str, container_name: str) -> Report | None:
    read, out = container_log(kubectl, namespace, name, container_name)
    match = next((m for m in map(_LINE.match, out.splitlines()) if m), None) if read else None
    if match is None:
        return None
    return Report(match["container"], match["visible"], match["idx"], match["slot"], match["mount"].strip())


def why_no_gpu(kubectl: Kubectl, namespace: str, name: str, container_name: str, rep: Report | None) -> str:
    """For a failure message: what the container reported, or why nothing could be read."""
    if rep is not None:
        return f"it reported {rep}"
    read, out = container_log(kubectl, namespace, name, container_name)
    return f"its log has no report line: {out[-300:]!r}" if read else f"its log could not be read: {out[-300:]}"


def gpu_of(rep: Report, delivery: str, node: str, fake: str) -> int | None:
    """The GPU index a container really received: in env mode the index in NVIDIA_VISIBLE_DEVICES; in cdi mode
    the UUID the CDI spec set, which must agree with the file the spec mounted (else None: made up)."""
    gpus = fake_gpus(fake, node, "GiB")
    if delivery == "env":
        return int(rep.visible) if rep.visible.isdigit() and int(rep.visible) < len(gpus) else None
    by_uuid = {g.uuid: g.index for g in gpus}
    index = by_uuid.get(rep.visible)
    if index is None or rep.visible not in rep.mount:
        return None
    return index


def fake_capacity(settings: E2eSettings) -> int:
    """The memory of one of the tier's (fake) GPUs, in GiB."""
    return fake_gpus(settings.fake_gpus, settings.node_name, "GiB")[0].memory_units


def annotations_of(p: Mapping[str, Any]) -> dict[str, str]:
    return dict((p.get("metadata") or {}).get("annotations") or {})


def assigned_index(p: Mapping[str, Any]) -> int | None:
    value = annotations_of(p).get(IDX, "")
    return int(value) if value.isdigit() else None


def promised(live: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """Units promised per GPU by the given pods' annotations (a finished pod, e.g. one the kubelet rejected, holds
    nothing, for the extender as for the plugin)."""
    used: dict[int, int] = {}
    for p in live:
        if phase(p) in ("Failed", "Succeeded"):
            continue
        index, total = assigned_index(p), annotations_of(p).get(POD, "0")
        if index is not None and total.isdigit():
            used[index] = used.get(index, 0) + int(total)
    return used


def events(kubectl: Kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl.json(
        ["get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"])["items"]
    return items


PLUGIN_DIR = Path(sys.executable).parent  # where `pip install` put kubectl-gpushare


def kubectl_gpushare(*args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl gpushare ARGS`: kubectl finds kubectl-gpushare on PATH (flags must follow the plugin's name)."""
    env = {**os.environ, "PATH": f"{PLUGIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([kubectl_path(), "gpushare", *args], capture_output=True, text=True, timeout=60,
                          env=env, check=False)
