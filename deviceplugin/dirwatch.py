"""Changes in one directory from Linux inotify, through libc with ctypes; without inotify it only waits.

Three libc calls and one event layout: a package for them (inotify_simple is itself ctypes over the same calls;
watchdog adds threads and, without inotify, polling) would add a dependency to the node image for no feature
this needs.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import select
import struct

log = logging.getLogger(__name__)

# <sys/inotify.h>
IN_ATTRIB = 0x004
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
_MASK = IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of NUL-padded name
# A name of "" in what wait() returns: the directory itself went away, or the kernel dropped events.
EVERYTHING = ""


def _libc() -> ctypes.CDLL | None:
    for name in (None, ctypes.util.find_library("c")):
        try:
            libc = ctypes.CDLL(name, use_errno=True)
            init, add = libc.inotify_init1, libc.inotify_add_watch
        except (OSError, AttributeError, TypeError):
            continue
        init.argtypes, init.restype = [ctypes.c_int], ctypes.c_int
        add.argtypes, add.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32], ctypes.c_int
        return libc
    return None


class DirWatch:
    """wait() returns the names created, deleted, moved or changed in the directory since the last call; wake()
    ends a wait at once from another thread. Where inotify is missing, wait() just sleeps (callers poll)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._libc = _libc()
        self._fd = -1
        self._watching = False
        self._wake_read, self._wake_write = os.pipe()
        if self._libc is not None:
            self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if self._fd < 0:
                log.warning("inotify is not available (%s); polling %s instead", os.strerror(ctypes.get_errno()),
                            directory)
        self._add_watch()

    @property
    def watching(self) -> bool:
        return self._watching

    def _add_watch(self) -> None:
        if self._fd < 0 or self._libc is None or self._watching:
            return
        if self._libc.inotify_add_watch(self._fd, os.fsencode(self.directory), _MASK) >= 0:
            self._watching = True

    def wait(self, timeout: float) -> set[str]:
        """Names changed within `timeout` seconds (empty when nothing happened or wake() was called)."""
        self._add_watch()  # the directory may have been created (again) since
        fds = [self._wake_read] + ([self._fd] if self._watching else [])
        ready, _, _ = select.select(fds, [], [], timeout)
        if self._wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_read, 64)
        return self._drain() if self._fd in ready else set()

    def _drain(self) -> set[str]:
        names: set[str] = set()
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return names
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED | IN_Q_OVERFLOW):
                    names.add(EVERYTHING)
                    if mask & IN_IGNORED:
                        self._watching = False  # the kernel dropped the watch: add it again when the directory is back
                else:
                    names.add(os.fsdecode(name))

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")

    def close(self) -> None:
        for fd in (self._fd, self._wake_read, self._wake_write):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = -1
        self._watching = False
