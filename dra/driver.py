"""Preparing and unpreparing claims: read the claim, write its CDI spec, keep the checkpoint (no gRPC here)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from contract.modes import Unit
from dra.cdispec import PreparedDevice, claim_cdi_spec, claim_slot, prepared_devices
from dra.checkpoint import Checkpoint, PreparedClaim
from dra.claims import ClaimError, ClaimRef, Share, checked, claim_shares
from node import cdiedits
from node.cdi import CdiStore, ensure_file, present
from node.inventory import Gpu, Inventory

log = logging.getLogger(__name__)
T = TypeVar("T")


class ClaimSource(Protocol):
    """Where claims are read: the API server (dra/kube.py), or a fake in tests."""

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim as the API server's JSON; raises with a message naming the claim when it cannot."""
        ...


class Driver:
    """Prepares claims once: a claim already in the checkpoint (same UID) gets its recorded answer without a read,
    and unpreparing removes the claim's CDI spec and record, known or not (the kubelet keeps its own record and
    does not prepare again after a driver restart, so both calls must be idempotent)."""

    def __init__(self, node: str, inventory: Inventory, unit: Unit, *, source: ClaimSource,
                 checkpoint: Checkpoint, cdi: CdiStore, fake_gpu_dir: str) -> None:
        self.node = node
        self.inventory = inventory
        self.unit = unit
        self.source = source
        self.checkpoint = checkpoint
        self.cdi = cdi
        self.fake_gpu_dir = fake_gpu_dir
        self._lock = threading.Lock()
        self._prepared = checkpoint.load()  # raises CheckpointError at start: never serve over a corrupt record

    def prepared(self) -> dict[str, PreparedClaim]:
        with self._lock:
            return dict(self._prepared)

    def _recorded(self, uid: str) -> list[PreparedDevice] | None:
        with self._lock:
            known = self._prepared.get(uid)
        return None if known is None else prepared_devices(uid, known.shares)

    def prepare(self, ref: ClaimRef) -> list[PreparedDevice]:
        recorded = self._recorded(checked(ref).uid)
        if recorded is not None:
            log.info("ResourceClaim %s is already prepared; answering from the checkpoint", ref)
            return recorded
        try:
            claim = self.source.get_claim(ref.namespace, ref.name)
        except ClaimError:
            raise
        except Exception as exc:  # the source's own failure (API server unreachable, refused, timed out)
            raise ClaimError(
                f"ResourceClaim {ref} could not be read from the API server ({exc}); check the driver's API server "
                "access in its log (the kubelet retries the pod)"
            ) from exc
        shares = claim_shares(claim, ref, self.node, self.inventory.gpus, self.unit)
        used = {share.gpu_index for share in shares}
        # A fake GPU has no device node: a file naming it shows containers what they got (as the device plugin's).
        gpu_files = {gpu.index: self._gpu_file(ref, gpu) for gpu in self.inventory.gpus
                     if gpu.index in used and gpu.minor is None}
        spec = claim_cdi_spec(ref.uid, shares, self.inventory.gpus, present(cdiedits.CONTROL_DEVICES), gpu_files)
        with self._lock:
            if ref.uid not in self._prepared:  # else a concurrent call prepared it meanwhile: keep that answer
                self._commit(ref, tuple(shares), spec)
            answer = prepared_devices(ref.uid, self._prepared[ref.uid].shares)
        log.info("prepared ResourceClaim %s: %s", ref, ", ".join(
            f"{s.device} {s.units} {self.unit} for request {s.request}" for s in shares) or "no device of ours")
        return answer

    def _gpu_file(self, ref: ClaimRef, gpu: Gpu) -> str:
        name, text = cdiedits.fake_gpu_file(gpu)
        path = os.path.join(self.fake_gpu_dir, name)
        return _written(ref, self.fake_gpu_dir, "GPUSHARE_FAKE_GPU_DIR", lambda: ensure_file(path, text))

    def _commit(self, ref: ClaimRef, shares: tuple[Share, ...], spec: dict[str, Any]) -> None:
        """Under the lock: the spec file first, then the record that points at it (a crash between leaves a file
        that unprepare removes by the claim's UID)."""
        slot = claim_slot(ref.uid)
        if shares:  # CDI does not allow a device without container edits; no result of ours needs no file
            _written(ref, self.cdi.directory, "GPUSHARE_CDI_DIR", lambda: self.cdi.write(slot, spec))
        claim = PreparedClaim(ref, shares)
        try:
            # Another driver pod of this node (a rolling update) may have recorded claims since: merge into the file.
            self._prepared = _written(ref, os.path.dirname(self.checkpoint.path), "GPUSHARE_DRA_STATE_DIR",
                                      lambda: self.checkpoint.update(lambda now: {ref.uid: claim, **now}))
        except ClaimError:
            self.cdi.remove(slot)
            raise

    def unprepare(self, ref: ClaimRef) -> None:
        checked(ref)
        with self._lock:
            try:
                self.cdi.remove(claim_slot(ref.uid))
            except OSError as exc:
                raise ClaimError(
                    f"the CDI spec of ResourceClaim {ref} could not be removed from {self.cdi.directory} ({exc}); "
                    "mount that node directory read-write into the driver (GPUSHARE_CDI_DIR)"
                ) from exc
            known: list[bool] = []

            def without(now: dict[str, PreparedClaim]) -> dict[str, PreparedClaim]:
                known.append(ref.uid in now)
                return {uid: p for uid, p in now.items() if uid != ref.uid}

            # Read afresh under the lock: the claim may have been prepared by another driver pod of this node.
            self._prepared = _written(ref, os.path.dirname(self.checkpoint.path), "GPUSHARE_DRA_STATE_DIR",
                                      lambda: self.checkpoint.update(without))
        if not any(known):
            log.info("ResourceClaim %s is not in the checkpoint; nothing more to unprepare", ref)
            return
        log.info("unprepared ResourceClaim %s", ref)


def _written(ref: ClaimRef, directory: str, setting: str, write: Callable[[], T]) -> T:
    try:
        return write()
    except OSError as exc:
        raise ClaimError(
            f"ResourceClaim {ref}: a file could not be written in {directory} ({exc}); mount that node directory "
            f"read-write into the driver ({setting})"
        ) from exc
