from __future__ import annotations

from typing import Any

import pytest

from contract.modes import Unit
from dra.claims import ClaimError, Share, claim_shares
from tests.harness.dra.claims import GPUS, NODE, REF, claim, result


def test_results_of_our_driver_and_pool_become_shares() -> None:
    doc = claim(
        result("gpu-0", "4Gi", request="a", share_id="s-a"),
        result("gpu-7", "1", driver="other.example.com", pool="elsewhere"),  # another driver's: not ours to check
        result("gpu-1", "12288Mi", request="b", share_id="s-b"),
    )
    assert claim_shares(doc, REF, NODE, GPUS, "GiB") == [
        Share(request="a", pool=NODE, device="gpu-0", gpu_index=0, units=4, share_id="s-a"),
        Share(request="b", pool=NODE, device="gpu-1", gpu_index=1, units=12, share_id="s-b"),
    ]


@pytest.mark.parametrize(("memory", "unit", "units"), [("4Gi", "MiB", 4096), ("1536Mi", "MiB", 1536)])
def test_mib_contract_counts_mib(memory: str, unit: Unit, units: int) -> None:
    assert claim_shares(claim(result(memory=memory)), REF, NODE, GPUS, unit)[0].units == units


def test_a_claim_without_our_results_has_no_shares() -> None:
    assert claim_shares(claim(result(driver="other.example.com")), REF, NODE, GPUS, "GiB") == []


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        (claim(result(), allocated=False), "is not allocated"),
        (claim(result(), uid="another-uid"), "now has UID another-uid"),
        (claim(result(pool="node-b")), "of pool node-b, not of this node's pool node-a"),
        (claim(result(device="gpu-5")), "device gpu-5, which node node-a does not have"),
        (claim(result(device="mig-0")), "device mig-0, which node node-a does not have"),
        (claim(result(memory=None)), "DRAConsumableCapacity feature gate is off"),
        (claim(result(memory="1536Mi")), "not a whole number of GiB"),
        (claim(result(memory="0")), "not a positive amount"),
        (claim(result(memory="lots")), "not a Kubernetes quantity"),
    ],
    ids=["unallocated", "recreated", "other-pool", "unknown-device", "foreign-name", "no-consumed", "fraction",
         "zero", "garbage"],
)
def test_refusals_name_the_claim_and_the_fix(doc: dict[str, Any], words: str) -> None:
    with pytest.raises(ClaimError, match=words) as caught:
        claim_shares(doc, REF, NODE, GPUS, "GiB")
    assert f"{REF.namespace}/{REF.name}" in str(caught.value)
