"""gRPC servers on unix sockets, as the test kubelet and the simulated reference plugin serve them: started on the
path (a stale socket file removed first), stopped at once with their socket file removed."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from concurrent import futures

import grpc


def serve(add: Callable[[grpc.Server], None], socket_path: str, workers: int, name: str) -> grpc.Server:
    """A started server on `socket_path`; `add` adds the servicers."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name))
    add(server)
    remove(socket_path)
    server.add_insecure_port("unix://" + socket_path)
    server.start()
    return server


def stop(server: grpc.Server | None, socket_path: str | None = None) -> None:
    """Stop the server (if any) without grace, waiting up to 5 s, and remove its socket file."""
    if server is not None:
        server.stop(0).wait(5)
    if socket_path is not None:
        remove(socket_path)


def remove(socket_path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
