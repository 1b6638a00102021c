"""Who may hold a device-ID set, and what the kubelet says of it: the suspects the pod watch names (`Suspects`, kept by
the node index), then PodResources (Get about the suspects, else List), then the kubelet's checkpoint (`held`). Which
of those holders owns the IDs is owners.py's decision."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from deviceplugin.checkpoint import Checkpoint
from deviceplugin.errors import PluginError
from deviceplugin.kubelet import Holding, KubeletUnavailable

# Pods asked about one by one (PodResources Get) before listing the whole node instead: a container starts soon after
# its pod is admitted, so few pods wait for devices of one size at a time.
GET_LIMIT = 4

# (namespace, name, uid) of a pod that may hold the devices.
Suspect = tuple[str, str, str]


class Suspects:
    """Per device size, the pods with a container still waiting for devices of that size; per size and slot, the
    pods whose allocation record names that slot: fed by the node index as the watch delivers pods (their offers were
    verified there), so a call asks PodResources about these few pods instead of listing the node. Until the index
    is synced (and while the watch is broken) `ready` is False: a pod not delivered yet may hold the devices."""

    def __init__(self) -> None:
        self.ready = False
        self._lock = threading.Lock()
        self._names: dict[str, tuple[str, str]] = {}  # uid -> (namespace, name)
        self._waiting: dict[int, dict[str, None]] = {}  # units -> pods with a container of that size and no slot
        self._holding: dict[tuple[int, str], dict[str, None]] = {}  # (units, slot) -> pods holding it

    def add(self, uid: str, namespace: str, name: str, containers: Iterable[tuple[int, str | None]]) -> None:
        with self._lock:
            self._names[uid] = (namespace, name)
            for units, slot in containers:
                table = self._waiting.setdefault(units, {}) if slot is None else self._holding.setdefault(
                    (units, slot), {})
                table[uid] = None

    def drop(self, uid: str, containers: Iterable[tuple[int, str | None]]) -> None:
        with self._lock:
            self._names.pop(uid, None)
            for units, slot in containers:
                key: Any = units if slot is None else (units, slot)
                table: dict[Any, dict[str, None]] = self._waiting if slot is None else self._holding
                members = table.get(key)
                if members is not None:
                    members.pop(uid, None)
                    if not members:
                        del table[key]

    def waiting(self, units: int, slot: str) -> bool:
        """Some verified pod has a container asking for exactly `units` that holds no devices yet, or holds `slot`."""
        with self._lock:
            return bool(self._waiting.get(units)) or bool(self._holding.get((units, slot)))

    def likely(self, units: int, slot: str, limit: int = GET_LIMIT) -> list[Suspect] | None:
        """The pods that may hold these devices: those whose record names the slot first, then those still waiting
        for devices of this size; None when there are more than `limit`, or while not ready."""
        if not self.ready:
            return None
        with self._lock:
            uids = dict.fromkeys([*self._holding.get((units, slot), {}), *self._waiting.get(units, {})])
            if len(uids) > limit:
                return None
            return [(*self._names[u], u) for u in uids]


class Holdings(Protocol):
    def holdings(self) -> list[Holding]: ...  # PodResources List (app and sidecar containers), else the checkpoint

    def from_checkpoint(self) -> list[Holding]: ...  # every container, init containers included

    def pod_holdings(self, namespace: str, name: str) -> list[Holding] | None: ...  # PodResources Get; None: no Get

    def checkpoint(self) -> Checkpoint: ...  # the checkpoint with each container's stored answer, or why it is unread


@dataclass(frozen=True)
class Held:
    """What the kubelet says of a device-ID set: the holdings to find its owner in, where they come from, and the
    whole node's PodResources List when it was read (a checkpoint entry is believed only if no listed pod holds any
    of the IDs)."""

    holdings: list[Holding]
    source: Literal["get", "list", "checkpoint"]
    listed: list[Holding]


def held(kubelet: Holdings, device_ids: Sequence[str], suspects: Sequence[Suspect] | None) -> Held:
    """Ask the kubelet about these IDs: PodResources Get about each suspect until one holds exactly them, else List,
    else (no app or sidecar container holds exactly them) the checkpoint."""
    wanted = frozenset(device_ids)
    for namespace, name, _ in suspects or ():
        try:
            got = kubelet.pod_holdings(namespace, name)
        except KubeletUnavailable:
            break
        if got is None:
            break  # no Get, or Get failing now: List decides
        exact = [h for h in got if frozenset(h.device_ids) == wanted]
        if exact:
            return Held(exact, "get", [])
    try:
        listed = kubelet.holdings()
    except KubeletUnavailable as exc:
        raise PluginError(
            "UNAVAILABLE",
            f"the gpushare device plugin cannot tell which pod holds these devices ({exc}); mount "
            "/var/lib/kubelet/pod-resources into the plugin (Kubernetes 1.20 or newer) and check "
            "GPUSHARE_POD_RESOURCES_SOCKET",
        ) from exc
    if any(frozenset(h.device_ids) == wanted for h in listed):
        return Held(listed, "list", listed)
    # PodResources List reports app and sidecar containers only (pkg/kubelet/apis/podresources/server_v1.go),
    # so a regular init container is found in the checkpoint, which the kubelet writes in
    # allocateContainerResources right after Allocate, during admission, before it ever calls
    # PreStartContainer for that pod (pkg/kubelet/cm/devicemanager/manager.go).
    try:
        recorded = kubelet.from_checkpoint()
    except KubeletUnavailable as exc:
        raise PluginError(
            "UNAVAILABLE",
            f"no container in the kubelet's pod resources holds exactly these devices and {exc}; mount "
            "/var/lib/kubelet/device-plugins into the plugin and check GPUSHARE_KUBELET_CHECKPOINT",
        ) from exc
    return Held(recorded, "checkpoint", listed)
