"""The plugin's answers to the kubelet, each a straight pipeline over the node index: Allocate (the devices are
known, some pod waits for them, answer by slot) and PreStartContainer (ask who may hold the devices, find the owner,
take its word, judge it, place it where the plugin places, deliver, record); and the garbage collection of slots."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from contract import pod_ref
from deviceplugin import delivery
from deviceplugin.apiserver import ApiServer
from deviceplugin.candidates import Candidates
from deviceplugin.deliver import Deliverer
from deviceplugin.devices import UnitInventory, slot_of
from deviceplugin.errors import PluginError, Refusal
from deviceplugin.eventqueue import EventQueue
from deviceplugin.events import EventRecorder, TokenBuckets
from deviceplugin.evidence import LegacyAccepted, believe
from deviceplugin.holders import Holdings, held
from deviceplugin.judge import Accepted, NeedsPlacement, Verdict, validate
from deviceplugin.kubelet import KubeletUnavailable
from deviceplugin.metrics import PluginMetrics
from deviceplugin.nodeindex import NodeIndex
from deviceplugin.nodeplace import NodePlacer
from deviceplugin.owners import Owners
from deviceplugin.placement import preferred_devices
from deviceplugin.record import Records
from deviceplugin.settings import PluginSettings
from deviceplugin.trust import Context
from node.apiclient import ApiServerError, Conflict
from node.cdi import CdiStore

log = logging.getLogger(__name__)

_PATCH_ATTEMPTS = 5


class Service:
    def __init__(
        self, settings: PluginSettings, inventory: UnitInventory, api: ApiServer, kubelet: Holdings,
        public_key: Ed25519PublicKey, *, cdi: CdiStore | None = None, clock: Callable[[], float] = time.time,
        metrics: PluginMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.contract = settings.contract
        self.inventory = inventory
        self.api = api
        self.kubelet = kubelet
        self.cdi = cdi or CdiStore(settings.cdi_dir)
        self.clock = clock
        self.context = Context(
            contract=settings.contract, node_name=settings.node_name, public_key=public_key,
            gpus={g.index: g for g in inventory.gpus}, healthy=inventory.healthy, placement=settings.placement,
            checkpoint=kubelet.checkpoint,
        )
        self._answered: dict[str, float] = {}  # slot -> when Allocate last answered it; GC keeps its spec meanwhile
        self._handed: dict[str, int] = {}  # device ID -> the Allocate that last handed it out (a counter)
        self._allocations = itertools.count(1)
        self._lock = threading.Lock()
        self.pins = self.context.pins  # read here; the node index alone writes them
        self.index = NodeIndex(self.context)
        self.metrics = metrics or PluginMetrics()
        self.events = EventQueue(self._post_event)
        # Every refusal and allocation, rate limited per pod and reason, then queued off the kubelet's critical path.
        self.recorder = EventRecorder(self.events.post, self.metrics, TokenBuckets(clock=clock))
        self.candidates = Candidates(api, self.index, self.recorder)
        self.owners = Owners(api, settings.node_name)
        self.placer = NodePlacer(api, inventory, self.context)
        self.deliverer = Deliverer(settings, self.cdi)
        self.records = Records(api, self.index, self.recorder)
        api.subscribe(self.index)

    def close(self) -> None:
        """Post the Events still queued (briefly) and end their thread."""
        self.events.close()

    # -- Allocate ----------------------------------------------------------------------------------------

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """GetPreferredAllocation: the kubelet takes this answer for its next Allocate (manager.go,
        devicesToAllocate), so prefer the IDs handed out least recently and one pod's slot rarely goes to the next."""
        with self._lock:
            return preferred_devices(available, must_include, size, self._handed)

    def allocate(self, requests: Sequence[Sequence[str]]) -> list[delivery.ContainerDelivery]:
        """One answer per container request, keyed by the slot of its device IDs; no pod is guessed."""
        with self._unattributed("Allocate"):
            return self._allocate(requests)

    @contextlib.contextmanager
    def _unattributed(self, call: str) -> Iterator[None]:
        """A refusal that no Event on a pod has told of goes to the log and the unattributed counter."""
        try:
            yield
        except PluginError as exc:
            if exc.code in ("FAILED_PRECONDITION", "INVALID_ARGUMENT") and not exc.attributed:
                self.recorder.unattributed(call, exc.reason or exc.code, exc.message)
            raise

    def _allocate(self, requests: Sequence[Sequence[str]]) -> list[delivery.ContainerDelivery]:
        answers = []
        for device_ids in requests:
            self._check_known(device_ids, "Allocate")
            slot = slot_of(device_ids)
            # Checked every time: the same IDs (the same slot) may come back for another pod once the first is gone,
            # so a slot answered before proves nothing about the pod being admitted now.
            self.candidates.check(len(device_ids), slot)
            with self._lock:
                self._answered[slot] = self.clock()
                handed = next(self._allocations)
                self._handed.update(dict.fromkeys(device_ids, handed))
            if self.contract.delivery == "cdi":
                self.deliverer.forget(slot)
            answers.append(delivery.allocate_delivery(slot, self.contract.delivery))
            log.info("Allocate: %d device(s) answered with slot %s", len(device_ids), slot)
        return answers

    def _check_known(self, device_ids: Sequence[str], call: str) -> None:
        if not device_ids:
            raise PluginError("INVALID_ARGUMENT", f"{call} named no device; the kubelet sent an empty request",
                              "GpuShareInvalidRequest")
        unknown = self.inventory.unknown(device_ids)
        if unknown:
            raise PluginError(
                "INVALID_ARGUMENT",
                f"{call} named devices {', '.join(sorted(unknown)[:5])} that node {self.settings.node_name} does not "
                f"have ({len(unknown)} unknown of {len(device_ids)}); restart the kubelet so it forgets devices "
                "from an earlier GPU inventory", "GpuShareUnknownDevices",
            )

    # -- PreStartContainer -------------------------------------------------------------------------------

    def prestart(self, device_ids: Sequence[str]) -> Accepted | LegacyAccepted:
        """Find the pod holding exactly these devices, judge it, place it where the plugin places, deliver its GPU and
        keep what was decided."""
        with self._unattributed("PreStartContainer"):
            return self._prestart(device_ids)

    def _prestart(self, device_ids: Sequence[str]) -> Accepted | LegacyAccepted:
        self._check_known(device_ids, "PreStartContainer")
        suspects = self.index.suspects.likely(len(device_ids), slot_of(device_ids))
        found = held(self.kubelet, device_ids, suspects)
        owner = self.owners.owner(device_ids, found, suspects)
        for _ in range(_PATCH_ATTEMPTS):
            pod = self.owners.pod(owner)
            try:
                belief = believe(pod, owner.containers, device_ids, self.context)
                verdict: Verdict
                if isinstance(belief, LegacyAccepted):
                    verdict = belief
                else:
                    try:
                        verdict = validate(belief, pod, owner.containers, device_ids, self.context, **self._load())
                    except Refusal as refusal:
                        if refusal.reason != "GpuShareNoRoom":
                            raise
                        # The watch cache may still list pods that are gone: the room judged on a fresh list first.
                        verdict = validate(belief, pod, owner.containers, device_ids, self.context,
                                           others=self.api.list_node_pods())
                if isinstance(verdict, NeedsPlacement):
                    self.placer.place(pod, verdict.intent)
                    continue  # judged again on the pod as placed
                if isinstance(verdict, Accepted):  # else a pod of the previous plugin: it gets its kept answer
                    self.deliverer.deliver(pod, owner.containers, verdict, len(device_ids))
                self.records.keep(pod, verdict)
                how = f"slot {verdict.slot}" if isinstance(verdict, Accepted) else "the previous device plugin's answer"
                log.info("PreStartContainer: pod %s container(s) %s get GPU %s (%s)",
                         verdict.ref, ",".join(owner.containers), verdict.gpu.index, how)
                return verdict
            except Conflict:
                continue  # the pod changed since we read it: read it again and decide again
            except Refusal as refusal:
                self.recorder.refused("PreStartContainer", pod, refusal.reason, refusal.message)
                raise PluginError("FAILED_PRECONDITION", refusal.message, refusal.reason, attributed=True) from refusal
            except ApiServerError as exc:
                raise PluginError(
                    "UNAVAILABLE",
                    f"the gpushare device plugin could not record the allocation of pod {owner.ref} ({exc}); "
                    "the kubelet retries the container start; check the plugin's API server access",
                ) from exc
        raise PluginError(
            "UNAVAILABLE",
            f"pod {owner.ref} changed {_PATCH_ATTEMPTS} times while its allocation was being recorded; the kubelet "
            "retries the container start",
        )

    def _load(self) -> dict[str, Any]:
        """What judges the room on a GPU: the node index once synced, else this node's pods from the watch cache."""
        return {"load": self.index} if self.index.synced else {"others": self.api.node_pods()}

    def _post_event(self, pod: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        """The queue's thread: the kubelet's call was answered without waiting for the API server."""
        try:
            self.api.create_event(pod, event_type, reason, message)
        except ApiServerError as exc:
            log.warning("could not post Event %s on pod %s: %s", reason, pod_ref(pod), exc)
            return
        self.metrics.events.labels(event_type, reason).inc()

    # -- garbage collection ------------------------------------------------------------------------------

    def collect_garbage(self) -> list[str]:
        """Forget slots and remove CDI specs whose devices the kubelet no longer assigns to any container: neither
        PodResources (app and sidecar containers) nor the checkpoint (init containers too) lists them, and no
        Allocate answered them within the grace period."""
        self.records.remember_pins()
        try:
            held = [*self.kubelet.holdings(), *self.kubelet.from_checkpoint()]
        except KubeletUnavailable as exc:
            log.info("garbage collection skipped: %s", exc)
            return []
        live = {slot_of(h.device_ids) for h in held}
        now, grace = self.clock(), self.settings.gc_grace_seconds
        with self._lock:
            for slot, when in list(self._answered.items()):
                if slot not in live and now - when > grace:
                    del self._answered[slot]
            keep = live | set(self._answered)
        removed = []
        for slot, mtime in self.cdi.slots().items():
            if slot not in keep and now - mtime > grace:
                self.cdi.remove(slot)
                removed.append(slot)
        return removed
