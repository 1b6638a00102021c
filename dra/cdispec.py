"""The CDI spec of a prepared claim and the answer the kubelet gets: one CDI device per allocation result (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra.claims import Share
from node.cdiedits import CDI_KIND, CDI_VERSION, cdi_device_name, cdi_spec, device_nodes
from node.inventory import Gpu

# CDI names of DRA devices start so; the device plugin's slots are 16 hex digits, so the two never meet.
CLAIM_PREFIX = "dra-"


@dataclass(frozen=True)
class PreparedDevice:
    """One Device of NodePrepareResourceResponse: the request it serves and its CDI device IDs."""

    request: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...]


def claim_slot(uid: str) -> str:
    """The CdiStore slot of a claim's spec file (gpushare-dra-<uid>.json): one file per claim."""
    return f"{CLAIM_PREFIX}{uid}"


def share_name(uid: str, number: int) -> str:
    """The CDI device name of a claim's result `number`: unique per claim UID and allocation result."""
    return f"{CLAIM_PREFIX}{uid}-{number}"


def prepared_devices(uid: str, shares: Sequence[Share]) -> list[PreparedDevice]:
    return [
        PreparedDevice(share.request, share.pool, share.device, (cdi_device_name(share_name(uid, n)),))
        for n, share in enumerate(shares)
    ]


def claim_cdi_spec(
    uid: str, shares: Sequence[Share], gpus: Sequence[Gpu], present: Sequence[str], gpu_files: Mapping[int, str]
) -> dict[str, Any]:
    """The device plugin's container edits for each result: its GPU's device nodes (or the fake GPU's file in
    `gpu_files`, by index), and the env with the result's units for the container and the claim's for the pod."""
    by_index = {gpu.index: gpu for gpu in gpus}
    total = sum(share.units for share in shares)
    devices = []
    for n, share in enumerate(shares):
        gpu = by_index[share.gpu_index]
        spec = cdi_spec(share_name(uid, n), gpu, device_nodes(gpu, present), share.units, total,
                        gpu_file=gpu_files.get(gpu.index, ""))
        devices.extend(spec["devices"])
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices}
