"""The driver's own record of prepared claims: one JSON file in the state directory, checksummed, written atomically."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from dra.claims import ClaimRef, Share
from node.cdi import write_atomically

VERSION = 1
FILE_NAME = "gpushare-dra-checkpoint.json"
LOCK_NAME = "gpushare-dra-checkpoint.lock"
_CLAIM_FIELDS = {"namespace": str, "name": str, "uid": str, "shares": list}
_SHARE_FIELDS = {"request": str, "pool": str, "device": str, "gpu_index": int, "units": int, "share_id": str}


class CheckpointError(Exception):
    """The checkpoint file cannot be used; the text names the file, what is wrong and what to do."""


@dataclass(frozen=True)
class PreparedClaim:
    ref: ClaimRef
    shares: tuple[Share, ...]


def _checksum(claims: Any) -> str:
    return hashlib.sha256(json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def encode(prepared: Mapping[str, PreparedClaim]) -> str:
    claims = [
        {**asdict(p.ref), "shares": [asdict(s) for s in p.shares]} for _, p in sorted(prepared.items())
    ]
    return json.dumps({"version": VERSION, "checksum": _checksum(claims), "claims": claims}, indent=1)


def _fields(item: Any, fields: Mapping[str, type], where: str) -> Mapping[str, Any]:
    if not isinstance(item, dict) or set(item) != set(fields):
        raise ValueError(f"{where} does not have exactly the fields {', '.join(sorted(fields))}")
    for name, kind in fields.items():
        value = item[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{where}.{name} is not of type {kind.__name__}")
    return item


def decode(text: str) -> dict[str, PreparedClaim]:
    """The prepared claims by UID; ValueError when the text is not a whole checkpoint of this version."""
    doc = _fields(json.loads(text), {"version": int, "checksum": str, "claims": list}, "the document")
    if doc["version"] != VERSION:
        raise ValueError(f"it has version {doc['version']}, and this driver reads version {VERSION}")
    if doc["checksum"] != _checksum(doc["claims"]):
        raise ValueError("its checksum does not match its claims (a partial or edited file)")
    out: dict[str, PreparedClaim] = {}
    for n, item in enumerate(doc["claims"]):
        claim = _fields(item, _CLAIM_FIELDS, f"claims[{n}]")
        shares = tuple(
            Share(**_fields(s, _SHARE_FIELDS, f"claims[{n}].shares[{m}]")) for m, s in enumerate(claim["shares"])
        )
        out[claim["uid"]] = PreparedClaim(ClaimRef(claim["namespace"], claim["name"], claim["uid"]), shares)
    return out


class Checkpoint:
    """The checkpoint file under `state_dir`; a missing file is an empty record (the first start).

    During a rolling update two driver pods of one node serve side by side on the same state directory, and the
    kubelet may call either: update() changes the record under an flock on a lock file beside it, reading the file
    afresh, so neither pod overwrites a claim the other recorded (upstream's kubeletplugin serialises its calls
    the same way, with a lock file in the plugin directory: k8s.io/dynamic-resource-allocation
    kubeletplugin/draplugin.go, serializeGRPCIfEnabled)."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, FILE_NAME)
        self.lock_path = os.path.join(state_dir, LOCK_NAME)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the lock file's exclusive flock (released when the file closes, and by the kernel if the process
        dies)."""
        os.makedirs(os.path.dirname(self.lock_path), exist_ok=True)  # as save() makes it
        with open(self.lock_path, "a", encoding="utf-8") as handle:  # "a": created if missing, never truncated
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def update(
        self, change: Callable[[dict[str, PreparedClaim]], dict[str, PreparedClaim]]
    ) -> dict[str, PreparedClaim]:
        """Under the lock: the record as the file holds it now, changed by `change`, saved; returns it (OSError when
        the lock file or the record cannot be written, CheckpointError when the file is no longer readable)."""
        with self.locked():
            updated = change(self.load())
            self.save(updated)
            return updated

    def load(self) -> dict[str, PreparedClaim]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(
                f"the DRA driver's checkpoint {self.path} cannot be read ({exc}); mount its state directory "
                "read-write into the driver, or delete the file (the kubelet keeps its own record of prepared "
                "claims, and unpreparing a claim the driver does not know succeeds)"
            ) from exc
        try:
            return decode(text)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError, and so are the schema checks
            raise CheckpointError(
                f"the DRA driver's checkpoint {self.path} is corrupt: {exc}; delete the file and start the driver "
                "again (the kubelet keeps its own record of prepared claims, and unpreparing a claim the driver "
                "does not know succeeds)"
            ) from exc

    def save(self, prepared: Mapping[str, PreparedClaim]) -> None:
        """Replace the file whole: a crash leaves the old record or the new one, never half of one."""
        write_atomically(self.path, encode(prepared))
