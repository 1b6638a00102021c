"""Keeping the node's ResourceSlices published: the kubelet deletes them, so they are read again and again, and
written whenever one is missing or says something else than this node's GPUs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from contract.modes import Unit
from dra.events import CAPACITY_OFF, node_event
from dra.slice import capacity_dropped, inventory_slices, pool_plan
from node.apiclient import ApiServerError
from node.inventory import Inventory

log = logging.getLogger(__name__)

# While the API server drops the slices' consumable capacity, the keeper leaves a pool stored that way alone and
# writes it again only every this many steps (five minutes at the default 10 s), to find out that the gate is on.
CAPACITY_RETRY_STEPS = 30


class SliceApi(Protocol):
    """dra.kube.KubeDra's slice methods (tests fake exactly these)."""

    def list_slices(self, node: str) -> list[dict[str, Any]]: ...

    def write_slice(self, body: Mapping[str, Any]) -> Mapping[str, Any] | None: ...

    def delete_slice(self, name: str) -> None: ...

    def node_uid(self, node: str) -> str | None: ...

    def record_event(self, body: Mapping[str, Any]) -> None: ...


class SliceKeeper:
    """One step reads the slice and writes it only when needed; a thread repeats the step every `interval`.

    The kubelet deletes all of a node's ResourceSlices when it starts, and a driver's 30 s after the driver's
    connection drops (pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go:160-180, 215-262 in v1.34.4; the same in
    v1.37.2 at :161-180, :217-264), and does not ask the driver to publish them again: the driver finds them gone
    by reading. A step that finds what the last one found logs nothing, so a healthy driver is quiet and a lasting
    failure is one line, not one per poll.

    Each write's answer is the slice as stored: an API server whose DRAConsumableCapacity gate is off (alpha and
    off by default in Kubernetes 1.35) drops the devices' allowMultipleAllocations and requestPolicy, and the
    scheduler then gives each claim a whole GPU, which the driver refuses to prepare. That is one error line
    naming the gate; the pool stays published as stored and is written again every CAPACITY_RETRY_STEPS steps,
    not every step, until the API server keeps the fields, and one Warning Event on the Node (reason
    DRAConsumableCapacityOff) for `kubectl describe node` and event alerts.

    Every slice is owned by the Node object (dra.slice.node_owner), whose UID each step reads: a Node deleted and
    registered again by its kubelet has a new UID, its slices were garbage-collected with the old one, and the next
    step publishes them owned by the new one. While the Node does not exist nothing is published (a slice owned by
    a missing UID is garbage-collected at once)."""

    def __init__(self, api: SliceApi, node: str, inventory: Inventory, unit: Unit, interval: float) -> None:
        self.api = api
        self.node = node
        self.inventory = inventory
        self.unit = unit
        self.interval = interval
        self.writes = 0
        self.failures = 0
        self.capacity_dropped = False  # the API server's last answer to a write lacked the consumable capacity
        self.event_recorded = False  # the Warning Event saying so was created
        self.node_uid: str | None = None  # the Node object's metadata.uid, read at each step
        self.published = False  # the last step found or left every slice of the node as its GPUs make them
        self._found = ""  # what the last step found, to log only a change
        self._steps_unwritten = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dra-slice", daemon=True)

    def wanted(self) -> list[dict[str, Any]]:
        """The slices this node's GPUs make now: one per healthy GPU (dra.slice.pool_slices)."""
        return inventory_slices(self.node, self.inventory, self.unit, self.node_uid)

    def step(self) -> bool:
        """Read the node's slices and write them when one is missing or differs; True when it wrote. Failures
        are logged (once while they last) and left to the next step."""
        pool = f"the ResourceSlices of node {self.node}"
        sentence = "T" + pool[1:]
        try:
            self.node_uid = self.api.node_uid(self.node)
            existing = self.api.list_slices(self.node) if self.node_uid is not None else []
        except ApiServerError as exc:
            self.failures += 1
            self.published = False
            self._note(f"failed: {exc}", logging.WARNING, "Could not publish %s: %s; the scheduler allocates no "
                       "claim to a GPU whose slice is missing. Trying again every %g s (GPUSHARE_DRA_RESYNC_SECONDS); "
                       "check the driver's API server access.", pool, exc, self.interval)
            return False
        if self.node_uid is None:
            self.published = False
            self._note("no node", logging.WARNING, "Node %s does not exist in the API server (it was deleted, and its "
                       "kubelet has not registered it again): its ResourceSlices are owned by the Node and would be "
                       "garbage-collected, so none is published. Trying again every %g s; the slices are published "
                       "once the Node is back.", self.node, self.interval)
            return False
        retry = self._steps_unwritten + 1 >= CAPACITY_RETRY_STEPS
        writes, deletes = pool_plan(existing, self.wanted(), consumable_capacity=not self.capacity_dropped or retry)
        if not writes and not deletes:
            self._steps_unwritten += 1
            self.published = True
            if self.capacity_dropped:
                self._capacity_error()
            else:
                self._note("current", logging.INFO, "%s are published and current.", sentence)
            return False
        stored, failed = self._apply(writes, deletes)
        self.published = not failed
        if failed:
            # One refused write (another writer's slice, a policy, a conflict) must not keep the node's other GPUs
            # unpublished: every other write and delete was made; the next step reads again and retries the rest.
            self.failures += 1
            self._note(f"failed: {failed}", logging.WARNING, "Could not make %d of the %d changes to %s (%s); the "
                       "others were made. The scheduler allocates no claim to a GPU whose slice is missing, and "
                       "none from a pool while its slices disagree. Trying again every %g s "
                       "(GPUSHARE_DRA_RESYNC_SECONDS); check the driver's API server access and the ResourceSlices "
                       "of node %s.", len(failed), len(writes) + len(deletes), pool, "; ".join(failed),
                       self.interval, self.node)
            if not stored:
                return False
        self.writes += 1
        self._steps_unwritten = 0
        if any(capacity_dropped(body, answer) for body, answer in stored):
            self.capacity_dropped = True
            self._capacity_error()
            self._record_capacity_event()
            return True
        if failed:
            return True
        self._found = "current"  # this line says so: the next step that finds them current is quiet
        if self.capacity_dropped:
            self.capacity_dropped = self.event_recorded = False
            log.info("The API server now keeps the consumable capacity of %s (DRAConsumableCapacity is on); "
                     "published %d, deleted %d: claims get shares of their GPU's memory.",
                     pool, len(writes), len(deletes))
            return True
        why = ("were missing (the kubelet deletes a driver's slices when it starts and when the driver disconnects)"
               if not existing else "differed from this node's GPUs")
        log.info("%s %s; published %d, deleted %d.", sentence, why, len(writes), len(deletes))
        return True

    def _apply(self, writes: list[dict[str, Any]], deletes: list[str]) -> tuple[
            list[tuple[dict[str, Any], Mapping[str, Any] | None]], list[str]]:
        """Every write and delete of a plan, each on its own: (each written body with the API server's answer, the
        text of each failure)."""
        stored: list[tuple[dict[str, Any], Mapping[str, Any] | None]] = []
        failed: list[str] = []
        for body in writes:
            try:
                stored.append((body, self.api.write_slice(body)))
            except ApiServerError as exc:
                failed.append(str(exc))
        for name in deletes:
            try:
                self.api.delete_slice(name)
            except ApiServerError as exc:
                failed.append(str(exc))
        return stored, failed

    def _capacity_error(self) -> None:
        self._note(
            "capacity dropped", logging.ERROR, "The API server dropped allowMultipleAllocations and the memory "
            "capacity's requestPolicy from the ResourceSlices of node %s: its DRAConsumableCapacity feature gate is "
            "off (alpha and off by default in Kubernetes 1.35, on by default from 1.36). The slices are published "
            "without them, so the scheduler gives each claim a whole GPU and this driver refuses to prepare it. Turn "
            "the gate on with --feature-gates=DRAConsumableCapacity=true on kube-apiserver, kube-scheduler and "
            "kube-controller-manager; the driver writes the slices again every %g s and says when they are kept.",
            self.node, self.interval * CAPACITY_RETRY_STEPS)

    def _record_capacity_event(self) -> None:
        """One Warning Event while the gate stays off (a failure to create it is tried again at the next write)."""
        if self.event_recorded or self.node_uid is None:
            return
        message = (f"The API server dropped allowMultipleAllocations and capacity.memory.requestPolicy from the "
                   f"gpushare.io ResourceSlices of node {self.node}: its DRAConsumableCapacity feature gate is off, so "
                   "each claim would get a whole GPU. Turn it on with --feature-gates=DRAConsumableCapacity=true on "
                   "kube-apiserver, kube-scheduler and kube-controller-manager.")
        try:
            self.api.record_event(node_event(self.node, self.node_uid, CAPACITY_OFF, message, datetime.now(UTC)))
        except ApiServerError as exc:
            log.warning("Could not record the %s Event of node %s: %s; the driver's log says the same.",
                        CAPACITY_OFF, self.node, exc)
            return
        self.event_recorded = True

    def _note(self, found: str, level: int, message: str, *args: Any) -> None:
        if found != self._found:
            self._found = found
            log.log(level, message, *args)

    def wake(self) -> None:
        """Step now rather than at the next interval (a GPU's health changed)."""
        self._wake.set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)  # a step's requests are bounded by GPUSHARE_DRA_TIMEOUT_SECONDS

    def _loop(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.step()
            except Exception:  # a bug must not end the thread that keeps the slices published
                log.exception("Keeping the ResourceSlices of node %s failed unexpectedly; trying again in %g s.",
                              self.node, self.interval)
