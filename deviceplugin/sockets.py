"""This plugin's sockets in the device-plugin directory: a new name for each serve, and those earlier instances left."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import stat
from typing import Literal

from deviceplugin.settings import SOCKET_TOKEN_LENGTH, PluginSettings
from node import lifecycle

log = logging.getLogger(__name__)

# How long a probe waits for its connection. A frozen process's socket still accepts (the kernel queues the
# connection); only a full queue makes a connect wait, and that socket is as much in use as one that accepts.
PROBE_TIMEOUT_SECONDS = 0.5

Probe = Literal["gone", "refused", "accepts"]


def probe(path: str) -> Probe:
    """Whether a process listens on the unix socket at `path`: the file is gone, nobody listens, or it accepts."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(PROBE_TIMEOUT_SECONDS)
        try:
            client.connect(path)
        except FileNotFoundError:
            return "gone"
        except ConnectionRefusedError:
            return "refused"
        except OSError:
            return "accepts"  # a timeout (a full queue) or a permission error: someone holds it; leave it alone
    return "accepts"


def fresh_socket_path(settings: PluginSettings) -> str:
    """A path for the next serve that no file has: the resource's prefix and a new random token."""
    while True:
        path = settings.socket_path(secrets.token_hex(SOCKET_TOKEN_LENGTH // 2))
        if not os.path.lexists(path):
            return path


def clear_stale(settings: PluginSettings) -> list[str]:
    """Remove this resource's sockets that nobody listens on (left by instances that were killed or crashed), one log
    line each; return those that still accept connections: older instances still serving, stopping or frozen.

    Only names of this resource count (settings.is_own_socket): other plugins' sockets and kubelet.sock are never
    touched, nor a file of ours that is not a socket.
    """
    directory = settings.device_plugin_dir
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        log.warning("could not list %s for stale sockets of this plugin (%s); none removed", directory, exc.strerror)
        return []
    live = []
    for name in names:
        if not settings.is_own_socket(name):
            continue
        path = os.path.join(directory, name)
        before = lifecycle.socket_id(path)
        try:
            is_socket = stat.S_ISSOCK(os.lstat(path).st_mode)
        except OSError:
            continue  # gone meanwhile
        if not is_socket:
            log.info("left %s in place: it is named like this plugin's sockets but is not a socket", path)
            continue
        state = probe(path)
        if state == "refused" and lifecycle.socket_id(path) == before:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            log.info("removed the stale socket %s: nobody listens on it (an earlier instance of this plugin did not "
                     "stop cleanly)", path)
        elif state == "accepts":
            live.append(path)
            log.info("left the socket %s in place: an earlier instance of this plugin still accepts connections on "
                     "it (it is still running, stopping or frozen); this plugin registers beside it",
                     path)
    return live
