"""The plugin's answers to the kubelet: Allocate by slot, PreStartContainer by exact resolution, and GC."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from contract import IDX, pod_ref
from deviceplugin import delivery
from deviceplugin.apiserver import ApiServer
from deviceplugin.blame import allocate_refusal, waiting_pods
from deviceplugin.devices import UnitInventory
from deviceplugin.errors import PluginError, Refusal
from deviceplugin.eventqueue import EventQueue
from deviceplugin.events import EventRecorder, TokenBuckets
from deviceplugin.kubelet import KubeletUnavailable
from deviceplugin.legacy import LegacyAccepted
from deviceplugin.metrics import PluginMetrics
from deviceplugin.nodeindex import NodeIndex
from deviceplugin.nodeplace import NodePlacer
from deviceplugin.offers import allocation_candidates
from deviceplugin.owners import Holdings, Owners
from deviceplugin.pins import Pin
from deviceplugin.placement import preferred_devices
from deviceplugin.resolve import Accepted, NeedsPlacement, Owner, Verdict, slot_of, validate
from deviceplugin.settings import PluginSettings
from deviceplugin.trust import Context
from deviceplugin.usage import recorded_pin
from node import cdiedits
from node.apiclient import ApiServerError, Conflict
from node.cdi import CdiStore, ensure_file, present

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
        self.pins = self.context.pins
        self.placer = NodePlacer(api, inventory, self.context)
        self.index = NodeIndex(self.context)
        self.owners = Owners(kubelet, api, settings.node_name, self.index)
        self.metrics = metrics or PluginMetrics()
        self.events = EventQueue(self._post_event)
        # Every refusal and allocation, rate limited per pod and reason, then queued off the kubelet's critical path.
        self.recorder = EventRecorder(self.events.post, self.metrics, TokenBuckets(clock=clock))
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
            self._check_candidates(len(device_ids), slot)
            with self._lock:
                self._answered[slot] = self.clock()
                handed = next(self._allocations)
                self._handed.update(dict.fromkeys(device_ids, handed))
            if self.contract.delivery == "cdi":
                self._forget_spec(slot)
            answers.append(delivery.allocate_delivery(slot, self.contract.delivery))
            log.info("Allocate: %d device(s) answered with slot %s", len(device_ids), slot)
        return answers

    def _forget_spec(self, slot: str) -> None:
        """A spec left by an earlier holder of these IDs must never reach this container: PreStartContainer, which
        the kubelet calls before every start, writes the spec for the pod that holds the slot now."""
        try:
            self.cdi.remove(slot)
        except OSError as exc:
            raise PluginError(
                "UNAVAILABLE",
                f"the old CDI spec of slot {slot} could not be removed from {self.cdi.directory} ({exc}); mount the "
                "node's CDI directory read-write into the plugin (GPUSHARE_CDI_DIR)",
            ) from exc

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

    def _check_candidates(self, units: int, slot: str) -> None:
        if self.index.synced and self.index.has_candidate(units, slot):
            return
        try:
            found: list[str] = []
            notes: list[str] = []
            pods: list[dict[str, Any]] = []
            if not self.index.synced:
                found, notes = allocation_candidates(self.api.node_pods(), units, slot, self.context)
            if not found:  # the watch cache may lag behind the binding that made the kubelet admit this pod
                pods = self.api.list_node_pods()
                found, notes = allocation_candidates(pods, units, slot, self.context)
        except ApiServerError as exc:
            raise PluginError(
                "UNAVAILABLE",
                f"the gpushare device plugin could not read node {self.settings.node_name}'s pods ({exc}); "
                "check the plugin's API server access (its ServiceAccount and network) and recreate the pod",
            ) from exc
        if found:
            return
        unit = self.contract.unit
        message = (
            f"no pod on node {self.settings.node_name} admitted by the gpushare webhook has a container asking for "
            f"exactly {units} {unit} of {self.contract.resource} that holds no devices yet, so these devices are not "
            f"handed out; check that the gpushare webhook is installed and was running when the pod was created "
            f"(pods need the {self.contract.intent_key} annotation) and that the scheduler extender is configured "
            f"(pods need {IDX})"
        )
        if notes:
            message += "; pods that came close: " + " | ".join(notes[:3])
        waiting = waiting_pods(pods, units, self.context)
        if len(waiting) != 1:
            raise PluginError("FAILED_PRECONDITION", f"{message} ({len(waiting)} pods on this node wait for {units} "
                              f"{unit}, so the refused one is not known)", "GpuShareNoCandidate")
        refusal = allocate_refusal(waiting[0], units, self.context)
        self.recorder.refused("Allocate", waiting[0], refusal.reason, refusal.message)
        raise PluginError("FAILED_PRECONDITION", message, refusal.reason, attributed=True)

    # -- PreStartContainer -------------------------------------------------------------------------------

    def prestart(self, device_ids: Sequence[str]) -> Accepted | LegacyAccepted:
        """Resolve the exact pod holding these devices, validate it, deliver its GPU and record it."""
        with self._unattributed("PreStartContainer"):
            return self._prestart(device_ids)

    def _prestart(self, device_ids: Sequence[str]) -> Accepted | LegacyAccepted:
        self._check_known(device_ids, "PreStartContainer")
        owner = self.owners.owner(device_ids)
        for _ in range(_PATCH_ATTEMPTS):
            pod = self._get(owner)
            try:
                verdict = self._validate(pod, owner, device_ids)
                if isinstance(verdict, NeedsPlacement):
                    self.placer.place(pod, verdict.intent)
                    continue
                if isinstance(verdict, Accepted):  # else a pod of the previous plugin: it gets its kept answer
                    self._deliver(pod, owner, verdict, len(device_ids))
                    if verdict.patch:
                        self._record(pod, verdict)
                self._pin(str(pod["metadata"].get("uid")), Pin(verdict.gpu.index, verdict.gpu.uuid))
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

    def _validate(self, pod: Mapping[str, Any], owner: Owner, device_ids: Sequence[str]) -> Verdict:
        try:
            if self.index.synced:
                return validate(pod, owner.containers, device_ids, self.context, (), usage=self.index.usage_on)
            return validate(pod, owner.containers, device_ids, self.context, self.api.node_pods())
        except Refusal as refusal:
            if refusal.reason != "GpuShareNoRoom":
                raise
        # The watch cache may still list pods that are gone: judge the room on a fresh list before refusing.
        return validate(pod, owner.containers, device_ids, self.context, self.api.list_node_pods())

    def _get(self, owner: Owner) -> dict[str, Any]:
        try:
            pod = self.api.get_pod(owner.namespace, owner.name)
        except ApiServerError as exc:
            raise PluginError("UNAVAILABLE", f"could not read pod {owner.ref} ({exc}); the kubelet retries") from exc
        if pod is None or (owner.pod_uid and pod["metadata"].get("uid") != owner.pod_uid):
            raise PluginError(
                "FAILED_PRECONDITION",
                f"pod {owner.ref}, which holds these devices, no longer exists; its container is not started",
                "GpuSharePodGone",
            )
        return pod

    def _deliver(self, pod: Mapping[str, Any], owner: Owner, accepted: Accepted, units: int) -> None:
        if self.contract.delivery == "cdi":
            self._write_spec(accepted, units)
            return
        for name in owner.containers:
            container = delivery.find_container(pod, name) or {}
            problems = delivery.env_problems(container, accepted.intent.units_of(name), accepted.intent.total)
            if problems:
                raise Refusal(
                    f"pod {accepted.ref} container {name!r} lacks the gpushare webhook's GPU environment "
                    f"({'; '.join(problems)}), so it would not see its GPU; run the webhook with "
                    "GPUSHARE_DELIVERY=env like the plugins and recreate the pod", reason="GpuShareNoEnv",
                )

    def _write_spec(self, accepted: Accepted, units: int) -> None:
        gpu = accepted.gpu
        gpu_file = ""
        if gpu.minor is None:  # a fake GPU has no device node: a file naming it shows containers what they got
            name, text = cdiedits.fake_gpu_file(gpu)
            gpu_file = self._write_file(accepted, self.settings.fake_gpu_dir, "GPUSHARE_FAKE_GPU_DIR",
                                        lambda: ensure_file(os.path.join(self.settings.fake_gpu_dir, name), text))
        nodes = cdiedits.device_nodes(gpu, present(cdiedits.CONTROL_DEVICES))
        spec = cdiedits.cdi_spec(accepted.slot, gpu, nodes, units, accepted.intent.total, gpu_file=gpu_file)
        self._write_file(accepted, self.cdi.directory, "GPUSHARE_CDI_DIR", lambda: self.cdi.write(accepted.slot, spec))

    @staticmethod
    def _write_file(accepted: Accepted, directory: str, setting: str, write: Callable[[], str]) -> str:
        try:
            return write()
        except OSError as exc:
            raise Refusal(
                f"the CDI spec for pod {accepted.ref} could not be written in {directory} ({exc}); mount that node "
                f"directory read-write into the plugin ({setting})", reason="GpuShareCdiFailed",
            ) from exc

    def _record(self, pod: Mapping[str, Any], accepted: Accepted) -> None:
        meta = pod["metadata"]
        self.api.patch_pod_annotations(meta["namespace"], meta["name"], accepted.patch, meta["resourceVersion"])
        unit = self.contract.unit
        containers = ", ".join(f"{n!r} ({s.units} {unit})" for n, s in accepted.allocation.containers.items())
        self.recorder.allocated(pod, f"Pod {accepted.ref} runs on GPU {accepted.gpu.index} ({accepted.gpu.uuid}) of "
                                     f"node {self.settings.node_name}: containers {containers}.")

    def _post_event(self, pod: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        """The queue's thread: the kubelet's call was answered without waiting for the API server."""
        try:
            self.api.create_event(pod, event_type, reason, message)
        except ApiServerError as exc:
            log.warning("could not post Event %s on pod %s: %s", reason, pod_ref(pod), exc)
            return
        self.metrics.events.labels(event_type, reason).inc()

    # -- pins and garbage collection ---------------------------------------------------------------------

    def remember_pins(self) -> None:
        """Pin the pods this node's plugin allocated before it (re)started, from their allocation records, and
        forget the pins of pods that are gone; at start and with every garbage collection."""
        try:
            pods = self.api.list_node_pods()
        except ApiServerError as exc:
            log.info("pins not refreshed (each pod is pinned at its next container start): %s", exc)
            return
        for pod in pods:
            pin = recorded_pin(pod, self.context)
            if pin is not None:
                self._pin(str(pod["metadata"].get("uid")), pin)
        self.pins.keep_only({str((p.get("metadata") or {}).get("uid")) for p in pods})

    def _pin(self, uid: str, pin: Pin) -> None:
        self.pins.hold(uid, pin)
        self.index.repin(uid)  # its units now count on the GPU it is pinned to

    def collect_garbage(self) -> list[str]:
        """Forget slots and remove CDI specs whose devices the kubelet no longer assigns to any container: neither
        PodResources (app and sidecar containers) nor the checkpoint (init containers too) lists them, and no
        Allocate answered them within the grace period."""
        self.remember_pins()
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
