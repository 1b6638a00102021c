"""ResourceClaims as the API server's JSON, and GPUs, for the DRA driver's tests (this package's own helpers)."""

from __future__ import annotations

from typing import Any

from contract.dra import MEMORY
from contract.keys import DRA_DRIVER
from dra.claims import ClaimRef
from node.inventory import Gpu

NODE = "node-a"
UID = "0b5e2a4c-1d9e-4f2a-8c3b-6a7d9e0f1a2b"
REF = ClaimRef("team", "gpu-claim", UID)
# A real GPU (a device node) and a fake one (none), 16 units each.
GPUS = (Gpu(index=0, uuid="GPU-0000aaaa", memory_units=16, minor=0), Gpu(index=1, uuid="GPU-1111bbbb", memory_units=16))


def result(device: str = "gpu-0", memory: str | None = "4Gi", request: str = "gpu", pool: str = NODE,
           driver: str = DRA_DRIVER, share_id: str = "share-1") -> dict[str, Any]:
    out: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device, "shareID": share_id}
    if memory is not None:
        out["consumedCapacity"] = {MEMORY: memory}
    return out


def claim(*results: dict[str, Any], uid: str = UID, allocated: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {"devices": {"results": list(results)}, "nodeSelector": {}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": REF.namespace, "name": REF.name, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpushare"}}]}},
        "status": status,
    }
