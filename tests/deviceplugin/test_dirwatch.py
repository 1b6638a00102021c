"""The device-plugin directory watch: inotify names what changed, and a wake ends a wait at once."""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path

import pytest

from deviceplugin.dirwatch import EVERYTHING, DirWatch
from deviceplugin.kubelet import RestartWatch

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux only")]


def _collect(watch: DirWatch, until: str) -> set[str]:
    names: set[str] = set()
    while until not in names:
        names |= watch.wait(10)
    return names


def test_names_created_moved_and_deleted(tmp_path: Path) -> None:
    watch = DirWatch(str(tmp_path))
    try:
        assert watch.watching
        (tmp_path / ".tmp").write_text("x")
        os.replace(tmp_path / ".tmp", tmp_path / "kubelet_internal_checkpoint")
        assert {".tmp", "kubelet_internal_checkpoint"} <= _collect(watch, "kubelet_internal_checkpoint")
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(tmp_path / "kubelet.sock"))
            assert "kubelet.sock" in _collect(watch, "kubelet.sock")
        (tmp_path / "kubelet.sock").unlink()
        assert "kubelet.sock" in _collect(watch, "kubelet.sock")
        assert watch.wait(0) == set()
    finally:
        watch.close()


def test_the_directory_itself_going_away(tmp_path: Path) -> None:
    directory = tmp_path / "dp"
    directory.mkdir()
    watch = DirWatch(str(directory))
    try:
        directory.rmdir()
        assert EVERYTHING in _collect(watch, EVERYTHING)
        directory.mkdir()
        watch.wait(0)  # watches the new directory from now on
        (directory / "kubelet.sock").write_text("")
        assert "kubelet.sock" in _collect(watch, "kubelet.sock")
    finally:
        watch.close()


def test_wake_ends_a_wait(tmp_path: Path) -> None:
    watch = DirWatch(str(tmp_path))
    try:
        threading.Timer(0.05, watch.wake).start()
        assert watch.wait(30) == set()  # returns at the wake, long before the timeout
    finally:
        watch.close()


def test_restart_watch_reacts_to_events_not_to_its_poll(tmp_path: Path) -> None:
    """With a poll of an hour, only inotify can make it register again."""
    kubelet, own = tmp_path / "kubelet.sock", tmp_path / "plugin.sock"
    kubelet.write_text("")
    own.write_text("")
    restarted = threading.Event()

    def on_restart() -> None:
        own.write_text("")
        restarted.set()

    watch = RestartWatch(str(kubelet), lambda: str(own), on_restart, interval=3600)
    watch.start()
    try:
        assert watch.notified
        kubelet.unlink()
        own.unlink()  # the kubelet restarts: our socket goes, and its own
        kubelet.write_text("")
        assert restarted.wait(20)
        restarted.clear()
        own.unlink()  # only ours is deleted
        assert restarted.wait(20)
    finally:
        watch.stop()
