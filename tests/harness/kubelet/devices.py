"""The test kubelet's device manager: who holds which device IDs, init-container reuse, the checkpoint file."""

from __future__ import annotations

import base64
import functools
import json
import os
import random
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from deviceplugin.api import deviceplugin_pb2 as dp
from e2e.refalloc import Decision, container_envs


@dataclass(frozen=True)
class Entry:
    """One container's devices, recorded after Allocate returned (what PodResources and the checkpoint hold)."""

    pod_uid: str
    namespace: str
    pod_name: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    response: bytes  # the serialized ContainerAllocateResponse, as the kubelet checkpoints it

    def allocate_response(self) -> dp.ContainerAllocateResponse:
        return dp.ContainerAllocateResponse.FromString(self.response)

    @functools.cached_property
    def checkpoint_json(self) -> str:
        """This entry as the checkpoint holds it, canonical JSON, made once: the file is rewritten from these."""
        return json.dumps(checkpoint_item(self), sort_keys=True)


# GetPreferredAllocation: (available IDs, IDs that must be included, allocation size) -> the plugin's answer.
Prefer = Callable[[list[str], list[str], int], list[str]]


class Unavailable(Exception):
    """Not enough free healthy devices: the kubelet refuses admission before calling the plugin."""


def checkpoint_item(e: Entry) -> dict[str, object]:
    """One entry of kubelet_internal_checkpoint (pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go, v1.34 to
    v1.37): DeviceIDs per NUMA node ("-1": no topology), AllocResp the serialized answer as Go's encoding/json writes
    []byte (standard base64)."""
    return {"PodUID": e.pod_uid, "ContainerName": e.container, "ResourceName": e.resource,
            "DeviceIDs": {"-1": list(e.device_ids)}, "AllocResp": base64.b64encode(e.response).decode()}


def checkpoint_text(items: Iterable[str], registered: Mapping[str, list[str]]) -> str:
    """The checkpoint file from its entries, each already JSON (canonical: `json.dumps(item, sort_keys=True)`).

    The real checksum is FNV-32a over Go's printed form of Data (pkg/kubelet/checkpointmanager/checksum/checksum.go),
    which nothing outside the kubelet recomputes, and no reader the plugin has checks it; CRC-32 over Data's canonical
    JSON is the stand-in. The kubelet rewrites the whole file after every Allocate and every removal; built from kept
    pieces and hashed in C, a rewrite at 800 pods costs this double about 0.5 ms (a JSON dump of every entry and a
    byte-by-byte FNV in Python took 16 ms, and slowed whatever ran next, in any process:
    bench/bench_deviceplugin_calls.py)."""
    data = ('{"PodDeviceEntries": [' + ", ".join(items) + '], "RegisteredDevices": '
            + json.dumps(registered, sort_keys=True) + "}")
    return '{"Data": ' + data + ', "Checksum": ' + str(zlib.crc32(data.encode())) + "}"


def checkpoint_document(entries: Iterable[Entry], registered: Mapping[str, list[str]]) -> dict[str, object]:
    """kubelet_internal_checkpoint as the kubelet writes it, parsed."""
    parsed: dict[str, object] = json.loads(checkpoint_text((e.checkpoint_json for e in entries), registered))
    return parsed


def reference_answer(
    visible: str, units: int, pod_units: int | None = None, dev_units: int = 8
) -> dp.ContainerAllocateResponse:
    """The reference device plugin's Allocate answer for one container: its five envs (pkg/gpu/nvidia/allocate.go),
    NVIDIA_VISIBLE_DEVICES `visible` (a GPU index, a UUID, or no-gpu-has-<N><unit>-to-run)."""
    index = int(visible) if visible.isdigit() else -1
    return dp.ContainerAllocateResponse(envs=container_envs(Decision(visible, index), pod_units or units, units,
                                                            dev_units))


class DeviceState:
    """Thread-safe map of (pod UID, container) -> Entry, plus the per-pod reusable init-container devices."""

    def __init__(self, checkpoint_path: str, resource: str) -> None:
        self.checkpoint_path = checkpoint_path
        self.resource = resource
        self._lock = threading.RLock()
        self._entries: dict[tuple[str, str], Entry] = {}
        self._reusable: dict[str, set[str]] = {}
        self._names: dict[str, tuple[str, str]] = {}
        self.registered: list[str] = []

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    def entry(self, pod_uid: str, container: str) -> Entry | None:
        with self._lock:
            return self._entries.get((pod_uid, container))

    def reusable(self, pod_uid: str) -> list[str]:
        """The devices of the pod's finished regular init containers, which its next container takes first."""
        with self._lock:
            return sorted(self._reusable.get(pod_uid, set()))

    def in_use(self) -> set[str]:
        with self._lock:
            return {d for e in self._entries.values() for d in e.device_ids}

    def pick(
        self, pod_uid: str, count: int, healthy: Sequence[str], rng: random.Random, prefer: Prefer | None = None
    ) -> list[str]:
        """Devices for one container, as devicesToAllocate (pkg/kubelet/cm/devicemanager/manager.go) picks them:
        this pod's reusable init-container devices first; then, without topology, the plugin's
        GetPreferredAllocation answer (called with the available devices, the ones already chosen and the full
        size, when the plugin offers it) among the free ones; then any free ones."""
        with self._lock:
            chosen = self.reusable(pod_uid)[:count]
            if len(chosen) == count:
                return chosen
            used = self.in_use()
            free = [d for d in healthy if d not in used and d not in chosen]
        need = count - len(chosen)
        if len(free) < need:
            raise Unavailable(
                f"requested number of devices unavailable for {self.resource}. Requested: {need}, "
                f"Available: {len(free)}"
            )
        if prefer is not None:
            available = set(free)
            answer = [d for d in dict.fromkeys(prefer([*free, *chosen], list(chosen), count)) if d in available]
            chosen += answer[:need]
            need = count - len(chosen)
        rest = [d for d in free if d not in chosen]
        return chosen + rng.sample(rest, need)

    def record(self, entry: Entry, init: bool, restartable: bool) -> None:
        """After Allocate returned: hold the devices; an init container's become reusable by its pod."""
        with self._lock:
            self._entries[(entry.pod_uid, entry.container)] = entry
            self._names[entry.pod_uid] = (entry.namespace, entry.pod_name)
            reuse = self._reusable.setdefault(entry.pod_uid, set())
            if init and not restartable:
                reuse.update(entry.device_ids)
            else:
                reuse.difference_update(entry.device_ids)
            self.save()

    def release(self, pod_uid: str) -> bool:
        with self._lock:
            keys = [k for k in self._entries if k[0] == pod_uid]
            for key in keys:
                del self._entries[key]
            self._reusable.pop(pod_uid, None)
            self._names.pop(pod_uid, None)
            if keys:
                self.save()
            return bool(keys)

    def by_pod(self) -> dict[str, list[Entry]]:
        with self._lock:
            out: dict[str, list[Entry]] = {}
            for entry in self._entries.values():
                out.setdefault(entry.pod_uid, []).append(entry)
            return out

    # -- checkpoint: the kubelet_internal_checkpoint JSON layout -------------------------------------------

    def checkpoint(self) -> dict[str, object]:
        with self._lock:
            return checkpoint_document(self._entries.values(), {self.resource: list(self.registered)})

    def save(self) -> None:
        with self._lock:
            text = checkpoint_text((e.checkpoint_json for e in self._entries.values()),
                                   {self.resource: list(self.registered)})
        tmp = self.checkpoint_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, self.checkpoint_path)

    def load(self, names: dict[str, tuple[str, str]]) -> None:
        """Re-read the checkpoint after a restart; pod names come from the API server (the file has UIDs only)."""
        with self._lock:
            self._entries.clear()
            try:
                with open(self.checkpoint_path, encoding="utf-8") as fh:
                    doc = json.load(fh)
            except FileNotFoundError:
                return
            for item in doc["Data"]["PodDeviceEntries"]:
                uid = item["PodUID"]
                namespace, name = names.get(uid) or self._names.get(uid) or ("", "")
                ids = tuple(d for group in item["DeviceIDs"].values() for d in group)
                entry = Entry(uid, namespace, name, item["ContainerName"], item["ResourceName"], ids,
                              base64.b64decode(item["AllocResp"]))
                self._entries[(uid, entry.container)] = entry
            self.registered = list(doc["Data"]["RegisteredDevices"].get(self.resource, []))
