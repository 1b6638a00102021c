"""This node's pods indexed for the kubelet's calls, kept up to date by the pod watch: the cost of a call does not
grow with the pods on the node."""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contract import Intent, pod_ref
from deviceplugin.offers import Offer, allocation_offer
from deviceplugin.pins import Pin
from deviceplugin.trust import Context
from deviceplugin.usage import Holder, Tally, held_at, holding_of, legacy_candidate, legacy_usage


@dataclass(frozen=True)
class _Entry:
    version: str
    namespace: str
    name: str
    ref: str
    pod: Mapping[str, Any]  # never changed: the watch replaces a changed pod by a new object
    offer: Offer | None


class NodeIndex:
    """Per pod version (UID and resourceVersion): its verified Allocate offer; per device size: the pods with a
    container still waiting for devices; per slot: the pods holding it; per GPU: the units believed pods hold, and
    their sum, kept as pods come, change and go; the pods not believed that may hold units from a previous device
    plugin, which the kubelet's checkpoint (read again only when the kubelet rewrites it) places at each call; and the
    GPU each pod is pinned to, which only this index writes (ctx.pins), so the units follow the pin.

    The signature of a pod is checked once per version, when the watch delivers it (ctx.verdicts), never per call.
    Every change of a pod is a new version, so its deletionTimestamp and each container's new state count it again
    (a pod being deleted holds its units only while a GPU-share container of it may run: deviceplugin/usage.py).
    Until the first listing arrives (and while the watch is broken) `synced` is False and callers list instead.
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._lock = threading.Lock()
        self._synced = False
        self._entries: dict[str, _Entry] = {}
        self._waiting: dict[int, dict[str, None]] = {}  # units -> pods with a container of that size and no slot
        self._holding: dict[tuple[int, str], dict[str, None]] = {}  # (units, slot) -> pods holding it
        self._tally = Tally()  # what believed pods hold on each GPU
        self._legacy: dict[str, Mapping[str, Any]] = {}  # pod uid -> a pod counted from the checkpoint

    # -- fed by the watch ------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A full listing: what it lacks is gone."""
        listed = list(pods)
        keep = {_uid(p) for p in listed}
        for uid in [u for u in list(self._entries) if u not in keep]:
            self.remove(uid)
        for pod in listed:
            self.upsert(pod)
        self._synced = True

    def stale(self) -> None:
        """The watch broke: callers list the node's pods until the next full listing."""
        self._synced = False

    def upsert(self, pod: Mapping[str, Any]) -> None:
        uid = _uid(pod)
        if not uid:
            return
        meta = pod.get("metadata") or {}
        version = str(meta.get("resourceVersion") or "")
        known = self._entries.get(uid)
        if known is not None and version and known.version == version:
            return
        offer = allocation_offer(pod, self.ctx)  # outside the lock: it may check a signature
        held = holding_of(pod, uid, self.ctx)
        legacy = held is None and legacy_candidate(pod, self.ctx)
        entry = _Entry(version, str(meta.get("namespace") or ""), str(meta.get("name") or ""), pod_ref(pod), pod,
                       offer if isinstance(offer, Offer) else None)
        with self._lock:
            self._drop(uid)
            self._entries[uid] = entry
            for units, slot in entry.offer.containers if entry.offer else ():
                table = self._waiting.setdefault(units, {}) if slot is None else self._holding.setdefault(
                    (units, slot), {})
                table[uid] = None
            self._tally.recount(uid, held)
            if legacy:
                self._legacy[uid] = pod

    def remove(self, uid: str) -> None:
        with self._lock:
            self._drop(uid)

    def pin(self, uid: str, pin: Pin) -> None:
        """Pin the pod to the GPU its allocation record names (a pin once held stays: deviceplugin/pins.py) and count
        its units there."""
        self.ctx.pins.hold(uid, pin)
        self.repin(uid)

    def record(self, uid: str, pin: Pin, intent: Intent | None) -> None:
        """PreStartContainer allocated the pod this GPU: pin it (a pin once held stays) and, unless it is counted on
        the GPU it is pinned to already, count the units of `intent` (just verified on the pod read fresh) there; a
        pod of the previous device plugin (no intent) is only pinned: the checkpoint counts it."""
        in_force = self.ctx.pins.hold(uid, pin)
        with self._lock:
            entry = self._entries.get(uid)
            if entry is not None and intent is not None and self._tally.counted_on(uid) != in_force.index:
                self._tally.recount(uid, held_at(entry.pod, uid, in_force.index, intent, self.ctx))

    def keep_pins(self, uids: Collection[str]) -> None:
        """Forget the pins of the pods that are gone (their UIDs never come back)."""
        self.ctx.pins.keep_only(uids)

    def repin(self, uid: str) -> None:
        """The pod's pin changed: count its units on the GPU it is pinned to."""
        with self._lock:
            entry = self._entries.get(uid)
            if entry is not None:
                self._tally.recount(uid, holding_of(entry.pod, uid, self.ctx))

    # -- read by the kubelet's calls -------------------------------------------------------------------

    def has_candidate(self, units: int, slot: str) -> bool:
        """Some validated pod has a container asking for exactly `units` that holds no devices yet, or this slot."""
        with self._lock:
            return bool(self._waiting.get(units)) or bool(self._holding.get((units, slot)))

    def likely_holders(self, units: int, slot: str, limit: int) -> list[tuple[str, str, str]] | None:
        """(namespace, name, uid) of the pods that may hold these devices: those whose record names the slot
        first, then those still waiting for devices of this size; None when there are more than `limit`, or while
        the index is not synced (a pod the watch has not delivered yet may hold them)."""
        if not self._synced:
            return None
        with self._lock:
            uids = [*self._holding.get((units, slot), {}), *self._waiting.get(units, {})]
            if len(uids) > limit:
                return None
            return [(self._entries[u].namespace, self._entries[u].name, u) for u in dict.fromkeys(uids)]

    def units_on(self, index: int, exclude_uid: str = "") -> int:
        """Units promised on GPU `index`, the pod `exclude_uid` left out: the kept sum, not a count per call."""
        with self._lock:
            used = self._tally.units(index, exclude_uid)
            legacy = self._legacy_except(exclude_uid)
        return used + sum(h.units for h in self._legacy_on(index, legacy))

    def holders_on(self, index: int, exclude_uid: str = "") -> list[Holder]:
        """Who holds the units on GPU `index`, the pod `exclude_uid` left out (to word a refusal)."""
        with self._lock:
            holders = self._tally.holders(index, exclude_uid)
            legacy = self._legacy_except(exclude_uid)
        return holders + self._legacy_on(index, legacy)

    def __contains__(self, uid: object) -> bool:
        """Whether the watch has delivered the pod with this UID (and not its deletion)."""
        with self._lock:
            return uid in self._entries

    # -- under the lock --------------------------------------------------------------------------------

    def _drop(self, uid: str) -> None:
        entry = self._entries.pop(uid, None)
        if entry is None:
            return
        for units, slot in entry.offer.containers if entry.offer else ():
            key: Any = units if slot is None else (units, slot)
            table = self._waiting if slot is None else self._holding
            members = table.get(key)
            if members is not None:
                members.pop(uid, None)
                if not members:
                    del table[key]
        self._tally.uncount(uid)
        self._legacy.pop(uid, None)

    def _legacy_except(self, exclude_uid: str) -> dict[str, Mapping[str, Any]]:
        return {uid: pod for uid, pod in self._legacy.items() if uid != exclude_uid} if self._legacy else {}

    def _legacy_on(self, index: int, legacy: Mapping[str, Mapping[str, Any]]) -> list[Holder]:
        """Outside the lock: it may read the checkpoint."""
        return legacy_usage(legacy, self.ctx).get(index, []) if legacy else []


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")
