"""The report as kubectl-style tables, or as one JSON or YAML document of kind GpushareStatus (pure).

Names, reasons and messages come from the cluster, where anyone who may create a pod or an Event chooses them: every
table cell and sentence is printed through `printable` (a newline as \\n, ESC as \\x1b), so none can add a row or
drive the terminal; the JSON is json.dumps's, which escapes every control character by itself, and the YAML is
PyYAML's safe_dump without allow_unicode, which escapes every other control character and all but ASCII (a newline
stays a line break inside a quoted scalar).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import yaml

from common.escape import printable
from kubectlplugin.model import GpuRow, PodRow, Report

NONE = "-"
# The document's version: a field is added under the same version, never renamed or removed (docs/kubectl-plugin.md).
API_VERSION = "gpushare.io/v1"
KIND = "GpushareStatus"


def columns(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns three spaces apart, as kubectl prints them; no trailing blanks; every cell printable."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def _memory(value: int | None) -> str:
    return NONE if value is None else str(value)


def _free(gpu: GpuRow) -> int | None:
    return None if gpu.memory is None else gpu.memory - gpu.promised


def _names(pods: Sequence[PodRow]) -> str:
    return ",".join(f"{p.namespace}/{p.name}" for p in pods) or NONE


def summary(report: Report, wide: bool = False) -> str:
    """One row per node and GPU: memory, units promised and allocated, what is free, how many pods (`wide`: and
    which, as namespace/name)."""
    unit = report.unit
    rows = [["NODE", "GPU", f"MEMORY({unit})", f"PROMISED({unit})", f"ALLOCATED({unit})", f"FREE({unit})", "PODS",
             *(["NAMESPACE/POD"] if wide else [])]]
    for node in report.nodes:
        for gpu in node.gpus:
            rows.append([node.name, str(gpu.index), _memory(gpu.memory), str(gpu.promised), str(gpu.allocated),
                         _memory(_free(gpu)), str(len(gpu.pods)), *([_names(gpu.pods)] if wide else [])])
        if node.unplaced:
            rows.append([node.name, NONE, NONE, NONE, NONE, NONE, str(len(node.unplaced)),
                         *([_names(node.unplaced)] if wide else [])])
    if len(rows) == 1:
        return printable(f"No node offers {report.resource} and no pod asks for it.") + _scope(report)
    lines = [columns(rows)]
    if report.pending:
        lines.append(printable(f"{len(report.pending)} pod(s) asking for {report.resource} are not on a node yet "
                               "(-d lists them)."))
    memory = sum(g.memory or 0 for n in report.nodes for g in n.gpus)
    promised = sum(g.promised for n in report.nodes for g in n.gpus)
    allocated = sum(g.allocated for n in report.nodes for g in n.gpus)
    lines.append(f"In all: {promised} of {memory} {unit} promised, {allocated} {unit} allocated.{_scope(report)}")
    return "\n".join(lines)


def _scope(report: Report) -> str:
    said = ""
    if report.namespace is not None:
        said += printable(f" Only pods of namespace {report.namespace} are counted; run without -n to count every "
                          "namespace.")
    if report.selector:
        said += printable(f" Only pods matching {report.selector} are counted; run without -l to count every pod.")
    return said


def details(report: Report) -> str:
    """One row per GPU-share container: where its pod is, its units, the pod's state and why it was refused."""
    rows = [["NODE", "GPU", "NAMESPACE", "POD", "CONTAINER", "UNITS", "STATE", "REASON"]]
    pods: list[PodRow] = []
    for node in report.nodes:
        for gpu in node.gpus:
            pods += gpu.pods
        pods += node.unplaced
    pods += report.pending
    for pod in pods:
        where = [pod.node or NONE, NONE if pod.gpu is None else str(pod.gpu), pod.namespace, pod.name]
        containers = pod.containers or ()
        if not containers:
            rows.append([*where, NONE, str(pod.units), pod.state, pod.reason])
        for container in containers:
            name = f"{container.name} (init)" if container.init else container.name
            rows.append([*where, name, str(container.units), pod.state, pod.reason])
    if len(rows) == 1:
        return printable(f"No pod asks for {report.resource}.") + _scope(report)
    return columns(rows)


def _pod(pod: PodRow) -> dict[str, Any]:
    return {
        "namespace": pod.namespace, "name": pod.name, "node": pod.node, "gpu": pod.gpu, "units": pod.units,
        "state": pod.state, "reason": pod.reason, "counted": pod.counted,
        "containers": [{"name": c.name, "units": c.units, "init": c.init} for c in pod.containers],
    }


def document(report: Report) -> dict[str, Any]:
    """The report as plain data, -o json and -o yaml alike: every figure of the tables, and every pod."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "resource": report.resource,
        "unit": report.unit,
        "namespace": report.namespace,
        "selector": report.selector or None,
        "nodes": [
            {
                "name": node.name,
                "gpus": [
                    {"index": g.index, "memory": g.memory, "promised": g.promised, "allocated": g.allocated,
                     "free": _free(g), "pods": [_pod(p) for p in g.pods]}
                    for g in node.gpus
                ],
                "unplaced": [_pod(p) for p in node.unplaced],
            }
            for node in report.nodes
        ],
        "pending": [_pod(p) for p in report.pending],
    }


def as_json(report: Report) -> str:
    return json.dumps(document(report), indent=2)


def as_yaml(report: Report) -> str:
    """The same document as YAML, its keys in the JSON's order, each value on one line where it has no newline."""
    return str(yaml.safe_dump(document(report), sort_keys=False, allow_unicode=False, width=1 << 16)).rstrip("\n")
