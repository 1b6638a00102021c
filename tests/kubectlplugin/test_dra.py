"""DRA shares beside annotation-based ones: the gpushare driver's allocated claims become rows on their GPU, with
the memory their allocation consumed and the containers that list them."""

from __future__ import annotations

from typing import Any

from contract import Contract
from kubectlplugin.dra import claim_rows
from kubectlplugin.model import ContainerRow, PodRow, build


def _claim(name: str, results: list[dict[str, Any]], users: tuple[str, ...] = ("p1",), deleting: bool = False
           ) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "team", "name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    return {"metadata": meta, "status": {
        "allocation": {"devices": {"results": results}},
        "reservedFor": [{"resource": "pods", "name": u, "uid": f"uid-{u}"} for u in users]}}


def _result(device: str, memory: str, driver: str = "gpushare.io") -> dict[str, Any]:
    return {"driver": driver, "pool": "node-a", "device": device, "request": "gpu",
            "consumedCapacity": {"memory": memory}}


POD = {"metadata": {"namespace": "team", "name": "p1"},
       "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu-8gi"}],
                "initContainers": [{"name": "prep", "resources": {"claims": [{"name": "gpu"}]}}],
                "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}, {"name": "side"}]},
       "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p1-gpu-x"}]}}


def test_an_allocated_claim_is_a_row_on_its_gpu_with_the_containers_that_list_it() -> None:
    claims = [_claim("p1-gpu-x", [_result("gpu-2", "8Gi"), _result("gpu-0", "1", driver="other.example.com")])]
    assert claim_rows(claims, [POD], "GiB") == [
        PodRow("team", "p1", "node-a", 2, 8, (ContainerRow("prep", 8, True), ContainerRow("main", 8)), "allocated",
               "DRA claim p1-gpu-x"),
    ]


def test_unreserved_deleting_and_unreadable_claims() -> None:
    rows = claim_rows([_claim("idle", [_result("gpu-1", "4Gi")], users=()),
                       _claim("gone", [_result("gpu-1", "4Gi")], deleting=True),
                       _claim("odd", [_result("gpu-1", "1.5Gi")])], [], "GiB")
    assert [(r.name, r.gpu, r.units, r.state) for r in rows] == [
        ("<claim idle>", 1, 4, "allocated"), ("p1", 1, 4, "deleting"), ("p1", 1, 0, "invalid")]
    assert rows[2].reason == "DRA claim odd: 1.5Gi is not a whole number of GiB (GPUSHARE_UNIT)"


def test_dra_shares_count_on_their_gpu_beside_annotation_pods() -> None:
    shares = claim_rows([_claim("p1-gpu-x", [_result("gpu-2", "8Gi")])], [POD], "GiB")
    report = build([], [], [], Contract(), shares=shares)
    (node,) = report.nodes
    (gpu,) = node.gpus
    assert (node.name, gpu.index, gpu.promised, gpu.allocated) == ("node-a", 2, 8, 8)
