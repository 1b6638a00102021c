"""The kubelet's device-manager checkpoint as plain data: each container's device IDs of our resource and the GPU the
Allocate answer it keeps for that container names (pure).

The kubelet writes `kubelet_internal_checkpoint` itself, from the answers of the device plugins on its node, after
every allocation (pkg/kubelet/cm/devicemanager/manager.go, writeCheckpoint); no pod can write it. Its layout is
checkpoint.PodDevicesEntry (pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go, the same from v1.34.4 to
v1.37.2): `DeviceIDs` a map of NUMA node ("-1": none) to IDs (older kubelets: a list), and `AllocResp` the
container's ContainerAllocateResponse serialized by proto.Marshal (pod_devices.go, toCheckpointData), which Go's
encoding/json writes as standard base64. On a container's restart the kubelet hands that stored answer to the
runtime again without calling Allocate (pod_devices.go, deviceRunContainerOptions).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from contract import ENV_VISIBLE
from deviceplugin.api.deviceplugin_pb2 import ContainerAllocateResponse
from node.inventory import Gpu

# An index as nvidia-container-cli reads one, written the one way the reference plugin writes it (fmt "%v" of an
# int): no sign, no leading zero; anything longer than a few digits is no GPU index.
_INDEX_RE = re.compile(r"0|[1-9][0-9]{0,5}")


@dataclass(frozen=True)
class Entry:
    """One container's devices of our resource and what the plugin that allocated them answered: `visible` is the
    answer's NVIDIA_VISIBLE_DEVICES, None when it sets none (gpushare's own answers never do) or cannot be read."""

    pod_uid: str
    container: str
    device_ids: tuple[str, ...]
    visible: str | None = None


@dataclass(frozen=True)
class Checkpoint:
    """The entries of one reading of the checkpoint, or why it could not be read (`problem`; then no entries)."""

    entries: tuple[Entry, ...] = ()
    problem: str = ""


def checkpoint_entries(text: str, resource: str) -> list[Entry]:
    """Every container's entry of `resource` that holds devices, init containers included; ValueError when the text
    is not the device manager's JSON."""
    try:
        doc = json.loads(text)
        entries = doc["Data"]["PodDeviceEntries"] or []
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise ValueError(f"the kubelet checkpoint is not the device manager's JSON ({exc!r})") from exc
    if not isinstance(entries, list):
        raise ValueError(f"the kubelet checkpoint's PodDeviceEntries is not a list ({type(entries).__name__})")
    out: list[Entry] = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("ResourceName") != resource:
            continue
        raw = entry.get("DeviceIDs")
        groups = raw.values() if isinstance(raw, dict) else [raw]
        ids = tuple(str(d) for group in groups if isinstance(group, list) for d in group)
        if ids:
            out.append(Entry(str(entry.get("PodUID", "")), str(entry.get("ContainerName", "")), ids,
                             _visible(entry.get("AllocResp"))))
    return out


def _visible(alloc_resp: Any) -> str | None:
    """NVIDIA_VISIBLE_DEVICES of a stored answer; None when it has none, or the bytes are not an answer."""
    if not isinstance(alloc_resp, str) or not alloc_resp:
        return None
    try:
        response = ContainerAllocateResponse.FromString(base64.b64decode(alloc_resp, validate=True))
    except (binascii.Error, ValueError, DecodeError, RecursionError):
        return None
    return response.envs.get(ENV_VISIBLE)


def visible_gpu(visible: str, gpus: Mapping[int, Gpu]) -> Gpu | None:
    """The one GPU of this node that an NVIDIA_VISIBLE_DEVICES value names: a decimal index (what the reference
    plugin answers since its #50) or a GPU UUID (its earlier releases, and its one-GPU branch). Anything else names
    no GPU: several (`0,1`), `all`, `none`, `void`, empty, or `no-gpu-has-8GiB-to-run`, the reference plugin's answer
    when it found no pod, which the NVIDIA runtime refuses."""
    if _INDEX_RE.fullmatch(visible):
        return gpus.get(int(visible))
    return next((g for g in gpus.values() if g.uuid == visible), None)
