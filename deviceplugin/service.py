"""The plugin's answers to the kubelet: Allocate by slot, PreStartContainer by exact resolution, and GC."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from deviceplugin import delivery
from deviceplugin.apiserver import ApiServer, ApiServerError, Conflict
from deviceplugin.cdi import CdiStore, present
from deviceplugin.inventory import Inventory
from deviceplugin.kubelet import KubeletUnavailable
from deviceplugin.placement import best_fit, placement_annotations, usage_by_gpu
from deviceplugin.resolve import (
    Accepted,
    Context,
    Holding,
    NeedsPlacement,
    Owner,
    Refusal,
    allocation_candidates,
    find_owner,
    slot_of,
    validate,
)
from deviceplugin.settings import PluginSettings
from webhook.protocol import IDX, Intent, pod_ref

log = logging.getLogger(__name__)

_PATCH_ATTEMPTS = 5


class PluginError(Exception):
    """An answer the kubelet receives as a gRPC error: `code` is a grpc.StatusCode name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Holdings(Protocol):
    def holdings(self) -> list[Holding]: ...


class Service:
    def __init__(
        self, settings: PluginSettings, inventory: Inventory, api: ApiServer, kubelet: Holdings,
        public_key: Ed25519PublicKey, *, cdi: CdiStore | None = None, clock: Callable[[], float] = time.time,
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
        )
        self._answered: dict[str, float] = {}
        self._lock = threading.Lock()
        self._place_lock = threading.Lock()
        self._in_flight: dict[str, tuple[int, int]] = {}  # pod uid -> (GPU index, units) placed here

    # -- Allocate ----------------------------------------------------------------------------------------

    def allocate(self, requests: Sequence[Sequence[str]]) -> list[delivery.ContainerDelivery]:
        """One answer per container request, keyed by the slot of its device IDs; no pod is guessed."""
        answers = []
        for device_ids in requests:
            self._check_known(device_ids, "Allocate")
            slot = slot_of(device_ids)
            with self._lock:
                seen = slot in self._answered
            if not seen:
                self._check_candidates(len(device_ids), slot)
            with self._lock:
                self._answered[slot] = self.clock()
            answers.append(delivery.allocate_delivery(slot, self.contract.delivery))
            log.info("Allocate: %d device(s) answered with slot %s", len(device_ids), slot)
        return answers

    def _check_known(self, device_ids: Sequence[str], call: str) -> None:
        if not device_ids:
            raise PluginError("INVALID_ARGUMENT", f"{call} named no device; the kubelet sent an empty request")
        unknown = self.inventory.unknown(device_ids)
        if unknown:
            raise PluginError(
                "INVALID_ARGUMENT",
                f"{call} named devices {', '.join(sorted(unknown)[:5])} that node {self.settings.node_name} does not "
                f"have ({len(unknown)} unknown of {len(device_ids)}); restart the kubelet so it forgets devices "
                "from an earlier GPU inventory",
            )

    def _check_candidates(self, units: int, slot: str) -> None:
        try:
            found, notes = allocation_candidates(self.api.node_pods(), units, slot, self.context)
            if not found:  # the watch cache may lag behind the binding that made the kubelet admit this pod
                found, notes = allocation_candidates(self.api.list_node_pods(), units, slot, self.context)
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
        log.warning("Allocate refused: %s", message)
        raise PluginError("FAILED_PRECONDITION", message)

    # -- PreStartContainer -------------------------------------------------------------------------------

    def prestart(self, device_ids: Sequence[str]) -> Accepted:
        """Resolve the exact pod holding these devices, validate it, deliver its GPU and record it."""
        self._check_known(device_ids, "PreStartContainer")
        owner = self._owner(device_ids)
        for _ in range(_PATCH_ATTEMPTS):
            pod = self._get(owner)
            try:
                verdict = self._validate(pod, owner, device_ids)
                if isinstance(verdict, NeedsPlacement):
                    self._place(pod, verdict.intent)
                    continue
                self._deliver(pod, owner, verdict, len(device_ids))
                if verdict.patch:
                    self._record(pod, verdict)
                log.info("PreStartContainer: pod %s container(s) %s get GPU %s (slot %s)",
                         verdict.ref, ",".join(owner.containers), verdict.gpu.index, verdict.slot)
                return verdict
            except Conflict:
                continue  # the pod changed since we read it: read it again and decide again
            except Refusal as refusal:
                self._event(pod, "Warning", refusal.reason, refusal.message)
                log.warning("PreStartContainer refused: %s", refusal.message)
                raise PluginError("FAILED_PRECONDITION", refusal.message) from refusal
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

    def _validate(self, pod: Mapping[str, Any], owner: Owner, device_ids: Sequence[str]) -> Accepted | NeedsPlacement:
        try:
            return validate(pod, owner.containers, device_ids, self.context, self.api.node_pods())
        except Refusal as refusal:
            if refusal.reason != "GpuShareNoRoom":
                raise
        # The watch cache may still list pods that are gone: judge the room on a fresh list before refusing.
        return validate(pod, owner.containers, device_ids, self.context, self.api.list_node_pods())

    def _holdings(self) -> list[Holding]:
        try:
            return self.kubelet.holdings()
        except KubeletUnavailable as exc:
            raise PluginError(
                "UNAVAILABLE",
                f"the gpushare device plugin cannot tell which pod holds these devices ({exc}); mount "
                "/var/lib/kubelet/pod-resources into the plugin (Kubernetes 1.20 or newer) and check "
                "GPUSHARE_POD_RESOURCES_SOCKET",
            ) from exc

    def _owner(self, device_ids: Sequence[str]) -> Owner:
        try:
            owner = find_owner(self._holdings(), device_ids)
        except Refusal as refusal:
            log.warning("PreStartContainer refused: %s", refusal.message)
            raise PluginError("FAILED_PRECONDITION", refusal.message) from refusal
        if owner.name:
            return owner
        # The checkpoint knows pod UIDs only: find the pod's name among this node's pods.
        try:
            pods = self.api.node_pods()
            match = [p for p in pods if (p.get("metadata") or {}).get("uid") == owner.pod_uid]
            if not match:
                match = [p for p in self.api.list_node_pods() if p["metadata"].get("uid") == owner.pod_uid]
        except ApiServerError as exc:
            raise PluginError("UNAVAILABLE", f"could not list node {self.settings.node_name}'s pods ({exc})") from exc
        if not match:
            raise PluginError(
                "FAILED_PRECONDITION",
                f"the pod with UID {owner.pod_uid} that holds these devices is not on node "
                f"{self.settings.node_name} any more; the container is not started",
            )
        meta = match[0]["metadata"]
        return Owner(str(meta.get("namespace")), str(meta.get("name")), owner.pod_uid, owner.containers)

    def _get(self, owner: Owner) -> dict[str, Any]:
        try:
            pod = self.api.get_pod(owner.namespace, owner.name)
        except ApiServerError as exc:
            raise PluginError("UNAVAILABLE", f"could not read pod {owner.ref} ({exc}); the kubelet retries") from exc
        if pod is None or (owner.pod_uid and pod["metadata"].get("uid") != owner.pod_uid):
            raise PluginError(
                "FAILED_PRECONDITION",
                f"pod {owner.ref}, which holds these devices, no longer exists; its container is not started",
            )
        return pod

    def _deliver(self, pod: Mapping[str, Any], owner: Owner, accepted: Accepted, units: int) -> None:
        if self.contract.delivery == "cdi":
            nodes = delivery.device_nodes(accepted.gpu, present(delivery.CONTROL_DEVICES))
            spec = delivery.cdi_spec(accepted.slot, accepted.gpu, nodes, units, accepted.intent.total)
            try:
                self.cdi.write(accepted.slot, spec)
            except OSError as exc:
                raise Refusal(
                    f"the CDI spec for pod {accepted.ref} could not be written in {self.cdi.directory} ({exc}); "
                    "mount the node's CDI directory into the plugin (GPUSHARE_CDI_DIR)", reason="GpuShareCdiFailed",
                ) from exc
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

    def _record(self, pod: Mapping[str, Any], accepted: Accepted) -> None:
        meta = pod["metadata"]
        self.api.patch_pod_annotations(meta["namespace"], meta["name"], accepted.patch, meta["resourceVersion"])
        unit = self.contract.unit
        containers = ", ".join(f"{n!r} ({s.units} {unit})" for n, s in accepted.allocation.containers.items())
        self._event(
            pod, "Normal", "GpuShareAllocated",
            f"Pod {accepted.ref} runs on GPU {accepted.gpu.index} ({accepted.gpu.uuid}) of node "
            f"{self.settings.node_name}: containers {containers}.",
        )

    def _place(self, pod: Mapping[str, Any], intent: Intent) -> None:
        """Node-local placement (cdi mode): best fit over what this node's pods already hold, one at a time."""
        meta = pod["metadata"]
        uid = str(meta.get("uid"))
        with self._place_lock:
            pods = self.api.list_node_pods()
            used = usage_by_gpu(pods, self.settings.node_name, self.contract.resource, exclude_uid=uid)
            unplaced = {p["metadata"].get("uid") for p in pods if IDX not in (p["metadata"].get("annotations") or {})}
            for other, (index, units) in list(self._in_flight.items()):
                if other == uid or other not in unplaced:
                    del self._in_flight[other]  # visible in the listing now, or gone
                else:
                    used[index] = used.get(index, 0) + units
            gpu = best_fit(self.inventory.gpus, used, intent.total, self.inventory.healthy)
            if gpu is None:
                free = ", ".join(f"GPU {g.index}: {g.memory_units - used.get(g.index, 0)}" for g in self.inventory.gpus)
                raise Refusal(
                    f"pod {pod_ref(pod)} needs {intent.total} {self.contract.unit} on one GPU but no GPU of node "
                    f"{self.settings.node_name} has that much room (free {self.contract.unit}: {free}); delete "
                    "pods or recreate this one so it lands on another node", reason="GpuShareNoRoom",
                )
            annotations = placement_annotations(gpu, intent, time.time_ns())
            self.api.patch_pod_annotations(meta["namespace"], meta["name"], annotations, meta["resourceVersion"])
            self._in_flight[uid] = (gpu.index, intent.total)
        log.info("placed pod %s on GPU %s of this node (best fit)", pod_ref(pod), gpu.index)

    def _event(self, pod: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        try:
            self.api.create_event(pod, event_type, reason, message)
        except ApiServerError as exc:
            log.warning("could not post Event %s on pod %s: %s", reason, pod_ref(pod), exc)

    # -- garbage collection ----------------------------------------------------------------------------

    def collect_garbage(self) -> list[str]:
        """Forget slots and remove CDI specs whose devices the kubelet no longer assigns to any container."""
        try:
            live = {slot_of(h.device_ids) for h in self.kubelet.holdings()}
        except KubeletUnavailable as exc:
            log.info("garbage collection skipped: %s", exc)
            return []
        now, grace = self.clock(), self.settings.gc_grace_seconds
        removed = []
        for slot, mtime in self.cdi.slots().items():
            if slot not in live and now - mtime > grace:
                self.cdi.remove(slot)
                removed.append(slot)
        with self._lock:
            for slot, when in list(self._answered.items()):
                if slot not in live and now - when > grace:
                    del self._answered[slot]
        return removed
