"""`kubectl gpushare` on the real cluster, found by the real kubectl as a plugin: after pods run, one is refused by
the plugin and one waits for room, its JSON and its table say what the annotations say; a user without rights to
list nodes, a kubeconfig that does not exist and a server that does not answer each give one line and exit 1."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from contract import ASSIGNED, IDX, POD
from e2e.cluster import Cluster
from e2e.kube import Kubectl
from tests.harness.realtier import workloads as w

# GPU-share pods here are placed by the reference scheduler extender (skipped, with the reason, without it).
pytestmark = pytest.mark.usefixtures("needs_extender")

gpushare = w.kubectl_gpushare


def expected(pods: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[int, int, list[str]]]:
    """(node, GPU) -> (units promised, units allocated, pod names), read straight from the annotations."""
    out: dict[tuple[str, int], tuple[int, int, list[str]]] = {}
    for pod in pods:
        annotations = w.annotations_of(pod)
        if IDX not in annotations or w.phase(pod) in ("Failed", "Succeeded"):
            continue
        key = (pod["spec"]["nodeName"], int(annotations[IDX]))
        promised, allocated, names = out.get(key, (0, 0, []))
        units = int(annotations[POD])
        out[key] = (promised + units, allocated + (units if annotations.get(ASSIGNED) == "true" else 0),
                    sorted([*names, pod["metadata"]["name"]]))
    return out


def test_the_table_and_json_say_what_the_annotations_say(cluster: Cluster, kubectl: Kubectl,
                                                         namespace: str) -> None:
    img = w.image(cluster)
    node = cluster.settings.node_name
    # Past the extender, and of a size no other pod asks for: the plugin refuses Allocate, the kubelet fails the pod.
    # (Were another pod of that size waiting for its devices, Allocate would answer and PreStartContainer refuse.)
    direct = w.pod("direct", [w.container("main", img, 3)])
    direct["spec"]["nodeName"] = node
    pods = [w.pod("small", [w.container("main", img, 4)]),
            w.pod("pair", [w.container("a", img, 8), w.container("b", img, 2)]),
            w.pod("prepared", [w.container("main", img, 12)], [w.container("prep", img, 6, then="exit 0")]),
            w.pod("huge", [w.container("main", img, 80)]), direct]
    assert w.create(kubectl, namespace, *pods)[0] == 0

    def settled() -> bool:
        by_name = {p["metadata"]["name"]: p for p in w.pods(kubectl, namespace)}
        return (all(w.running(by_name[n]) for n in ("small", "pair", "prepared"))
                and w.phase(by_name["direct"]) == "Failed")

    w.wait("three pods running and one refused", settled, 180)
    admin = str(cluster.admin_kubeconfig)
    shown = gpushare("--kubeconfig", admin, "-n", namespace, "-o", "json")
    assert (shown.returncode, shown.stderr) == (0, "")
    doc = json.loads(shown.stdout)
    live = w.pods(kubectl, namespace)
    gpus = {(n["name"], g["index"]): (g["promised"], g["allocated"], sorted(p["name"] for p in g["pods"]))
            for n in doc["nodes"] for g in n["gpus"]}
    wanted = expected(live)
    assert {k: v for k, v in gpus.items() if v[2]} == wanted
    assert {g["memory"] for n in doc["nodes"] for g in n["gpus"]} == {64}  # GPUSHARE_E2E_FAKE_GPUS=4x64GiB
    assert {p["name"]: p["state"] for n in doc["nodes"] for g in n["gpus"] for p in g["pods"]} == {
        "small": "allocated", "pair": "allocated", "prepared": "allocated"}
    assert [(p["name"], p["state"]) for p in doc["pending"]] == [("huge", "stamped")]
    (refused,) = [p for n in doc["nodes"] for p in n["unplaced"]]
    assert (refused["name"], refused["state"], refused["counted"]) == ("direct", "refused", False)
    # kubelet 1.34 words it "Pod was rejected: Allocate failed due to <the plugin's error>, which is unexpected".
    assert refused["reason"].startswith("UnexpectedAdmissionError: ")
    assert "Allocate failed due to" in refused["reason"] and "ALIYUN_COM_GPU_MEM_IDX" in refused["reason"]

    table = gpushare("--kubeconfig", admin, "-n", namespace, "-d")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    rows = {(r[0], int(r[1])): (int(r[3]), int(r[4])) for r in (line.split() for line in lines[1:5])}
    assert {k: v for k, v in rows.items() if k in wanted} == {k: v[:2] for k, v in wanted.items()}
    assert all(v == (0, 0) for k, v in rows.items() if k not in wanted)
    detail = cells(lines[lines.index("") + 1:])
    assert {(r["POD"], r["CONTAINER"], r["UNITS"], r["STATE"]) for r in detail} == {
        ("small", "main", "4", "allocated"), ("pair", "a", "8", "allocated"), ("pair", "b", "2", "allocated"),
        ("prepared", "prep (init)", "6", "allocated"), ("prepared", "main", "12", "allocated"),
        ("direct", "main", "3", "refused"), ("huge", "main", "80", "stamped")}
    assert {r["REASON"] for r in detail if r["POD"] == "direct"} == {refused["reason"]}

    every = json.loads(gpushare("--kubeconfig", admin, "-o", "json").stdout)  # every namespace, mine among them
    mine = {p["name"] for n in every["nodes"] for g in n["gpus"] for p in g["pods"] if p["namespace"] == namespace}
    assert mine == {"small", "pair", "prepared"}


def cells(lines: list[str]) -> list[dict[str, str]]:
    """A kubectl-style table as rows of named cells, cut at the header's column starts (cells may hold blanks)."""
    names = lines[0].split()
    starts = [lines[0].index(name) for name in names]
    ends = [*starts[1:], None]
    return [{n: line[a:b].strip() for n, a, b in zip(names, starts, ends, strict=True)} for line in lines[1:]]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_no_rights_and_no_cluster_give_one_line(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    tenant = gpushare("--kubeconfig", str(cluster.tenant_kubeconfig), "-n", namespace)
    assert (tenant.returncode, tenant.stdout) == (1, "")
    assert tenant.stderr.startswith('error: You may not list nodes (403 Forbidden: nodes is forbidden: User '
                                    '"tenant-user" cannot list resource "nodes" in API group "" at the cluster '
                                    'scope); ask for a role'), tenant.stderr
    missing = gpushare("--kubeconfig", str(tmp_path / "absent"))
    assert (missing.returncode, missing.stdout) == (1, "")
    assert "given by --kubeconfig does not exist" in missing.stderr
    moved = tmp_path / "moved.kubeconfig"
    moved.write_text(cluster.admin_kubeconfig.read_text().replace(cluster.server,
                                                                  f"https://127.0.0.1:{_closed_port()}"))
    down = gpushare("--kubeconfig", str(moved))
    assert (down.returncode, down.stdout) == (1, "")
    assert "could not be reached" in down.stderr and "Connection refused" in down.stderr
    for failed in (tenant, missing, down):
        assert failed.stderr.count("\n") == 1, failed.stderr
