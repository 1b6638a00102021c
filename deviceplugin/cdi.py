"""CDI spec files (and fake GPUs' name files) on the node's filesystem: atomic writes, listing and removal."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "gpushare-"
_NAME_RE = re.compile(r"^gpushare-([0-9a-f]{16})\.json$")


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


def write_atomically(path: str, text: str) -> str:
    """Write a world-readable file by temp file and rename, so a reader never sees half of it."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=directory, prefix=".gpushare-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return path


def present(paths: Sequence[str]) -> list[str]:
    """The paths among these that exist on this node (device nodes differ between drivers)."""
    return [p for p in paths if os.path.exists(p)]
