"""This node's pods indexed for the kubelet's calls, kept up to date by the pod watch: the cost of a call does not
grow with the pods on the node."""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contract import Intent, pod_ref
from deviceplugin.holders import Suspects
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
    """Per pod version (UID and resourceVersion): its verified Allocate offer, whose containers make the suspects of
    the devices they wait for or hold (`suspects`, read by the owner's search and by Allocate); per GPU: the units
    believed pods hold, and their sum, kept as pods come, change and go; the pods not believed that may hold units
    from a previous device plugin, which the kubelet's checkpoint (read again only when the kubelet rewrites it)
    places at each call; and the GPU each pod is pinned to, which only this index writes (ctx.pins), so the units
    follow the pin.

    The signature of a pod is checked once per version, when the watch delivers it (ctx.verdicts), never per call.
    Every change of a pod is a new version, so its deletionTimestamp and each container's new state count it again
    (a pod being deleted holds its units only while a GPU-share container of it may run: deviceplugin/usage.py).
    Until the first listing arrives (and while the watch is broken) `synced` is False and callers list instead.
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self.suspects = Suspects()
        self._tally = Tally()  # what believed pods hold on each GPU
        self._legacy: dict[str, Mapping[str, Any]] = {}  # pod uid -> a pod counted from the checkpoint

    # -- fed by the watch ------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self.suspects.ready  # one flag, set by replace() and stale()

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A full listing: what it lacks is gone."""
        listed = list(pods)
        keep = {_uid(p) for p in listed}
        for uid in [u for u in list(self._entries) if u not in keep]:
            self.remove(uid)
        for pod in listed:
            self.upsert(pod)
        self.suspects.ready = True

    def stale(self) -> None:
        """The watch broke: callers list the node's pods until the next full listing."""
        self.suspects.ready = False

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
            if entry.offer:
                self.suspects.add(uid, entry.namespace, entry.name, entry.offer.containers)
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
        if entry.offer:
            self.suspects.drop(uid, entry.offer.containers)
        self._tally.uncount(uid)
        self._legacy.pop(uid, None)

    def _legacy_except(self, exclude_uid: str) -> dict[str, Mapping[str, Any]]:
        return {uid: pod for uid, pod in self._legacy.items() if uid != exclude_uid} if self._legacy else {}

    def _legacy_on(self, index: int, legacy: Mapping[str, Mapping[str, Any]]) -> list[Holder]:
        """Outside the lock: it may read the checkpoint."""
        return legacy_usage(legacy, self.ctx).get(index, []) if legacy else []


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")
