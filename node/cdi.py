"""CDI spec files (and fake GPUs' name files) on the node's filesystem: atomic writes, listing and removal."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from node.cdiedits import SlotEdits

log = logging.getLogger(__name__)

PREFIX = "gpushare-"
_NAME_RE = re.compile(r"^gpushare-([0-9a-f]{16})\.json$")


class CdiWriteError(Exception):
    """A file of a CDI delivery could not be written: `host_file` says whether the fake GPU's host file (else the
    spec), `directory` where."""

    def __init__(self, directory: str, cause: OSError, *, host_file: bool = False) -> None:
        super().__init__(str(cause))
        self.directory = directory
        self.cause = cause
        self.host_file = host_file


class CdiStore:
    """Our spec files in the CDI directory, one per slot; other files there are never touched."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def path_for(self, slot: str) -> str:
        return os.path.join(self.directory, f"{PREFIX}{slot}.json")

    def write(self, slot: str, spec: Mapping[str, Any]) -> str:
        """Write the spec so that a reader sees either the old file or the whole new one: containerd and
        CRI-O refresh the CDI registry right before they inject the device at container creation."""
        return write_atomically(self.path_for(slot), json.dumps(spec, indent=2, sort_keys=True))

    def write_edits(self, edits: SlotEdits) -> str:
        """Write a slot's edits: the fake GPU's host file first (the spec mounts it), then the spec, listing only the
        optional control devices that exist on this node (device nodes differ between drivers). Raises
        CdiWriteError naming the directory that failed."""
        if edits.host_file is not None:
            path, text = edits.host_file
            try:
                ensure_file(path, text)
            except OSError as exc:
                raise CdiWriteError(os.path.dirname(path), exc, host_file=True) from exc
        missing = {p for p in edits.optional_nodes if not os.path.exists(p)}
        try:
            return self.write(edits.slot, _without_nodes(edits.spec, missing) if missing else edits.spec)
        except OSError as exc:
            raise CdiWriteError(self.directory, exc) from exc

    def read(self, slot: str) -> dict[str, Any] | None:
        try:
            with open(self.path_for(slot)) as handle:
                doc = json.load(handle)
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def slots(self) -> dict[str, float]:
        """slot -> modification time of its spec file."""
        out: dict[str, float] = {}
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return out
        for name in names:
            match = _NAME_RE.match(name)
            if match:
                with contextlib.suppress(OSError):
                    out[match.group(1)] = os.stat(os.path.join(self.directory, name)).st_mtime
        return out

    def remove(self, slot: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path_for(slot))
            log.info("removed the CDI spec of slot %s, whose devices the kubelet no longer assigns", slot)


def _without_nodes(spec: Mapping[str, Any], missing: set[str]) -> dict[str, Any]:
    """The spec with the device nodes at `missing` paths left out of every device's edits."""
    devices = []
    for device in spec.get("devices") or []:
        edits = dict(device.get("containerEdits") or {})
        if "deviceNodes" in edits:
            edits["deviceNodes"] = [n for n in edits["deviceNodes"] if n.get("path") not in missing]
        devices.append({**device, "containerEdits": edits})
    return {**spec, "devices": devices}


def write_atomically(path: str, text: str) -> str:
    """Write a world-readable file by temp file and rename, so a reader never sees half of it."""
    with _temp_file(os.path.dirname(path), text) as temp:
        os.replace(temp, path)
    return path


@contextlib.contextmanager
def _temp_file(directory: str, text: str) -> Iterator[str]:
    """A world-readable temporary file in `directory` holding `text`, synced to disk; removed on leaving unless it
    was renamed into place."""
    os.makedirs(directory, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=directory, prefix=".gpushare-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)
        yield temp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)


def ensure_file(path: str, text: str) -> str:
    """Make `path` hold `text`, leaving the file alone (the same inode) when it already does.

    A CDI mount's host file must never be replaced while containers start: runc bind-mounts the path's inode at
    container start, so a rename over it in between mounts the unlinked inode, and runc's check of the mount
    target then fails the start with "possibly malicious path detected -- refusing to operate on
    <rootfs>/run/gpushare/gpu (deleted)" or a mount "no such file or directory" (runc v1.1.5
    libcontainer/utils/utils.go WithProcfd, rootfs_linux.go mountPropagate); under restartPolicy Never the pod then
    fails. So the file is created by hard link (never over another one) and replaced only when its text is wrong.
    """
    if _read_text(path) == text:
        return path
    with _temp_file(os.path.dirname(path), text) as temp:
        try:
            os.link(temp, path)
        except FileExistsError:  # written meanwhile by a concurrent call, or wrong text to replace
            if _read_text(path) != text:
                os.replace(temp, path)
    return path


def _read_text(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def present(paths: Sequence[str]) -> list[str]:
    """The paths among these that exist on this node (device nodes differ between drivers)."""
    return [p for p in paths if os.path.exists(p)]
