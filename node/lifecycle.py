"""How a node program runs as a process: started, serving gRPC on unix sockets until SIGTERM or SIGINT, stopped
within a bound with its own sockets removed, and one line with exit status 2 when it cannot start (the device plugin
and the DRA driver alike)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Protocol, TypeVar

import grpc

from common import cli, heap
from common.settings import SettingsError

T = TypeVar("T")

# How often the main thread wakes to run signal handlers (see serve_until_signalled).
SIGNAL_POLL_SECONDS = 0.2


class Program(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


SocketId = tuple[int, int, int]


def socket_id(path: str) -> SocketId | None:
    """What tells this process's socket from one another process put at the same path since."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def serve_unix(socket_path: str, add: Callable[[grpc.Server], None], threads: int, name: str,
               max_calls: int | None = None) -> grpc.Server:
    """Serve the services `add` puts on a gRPC server on the unix socket at `socket_path`, with `threads` handler
    threads (named after `name`) and at most `max_calls` calls at once (None: no bound). A file already at the path
    is the caller's to judge: it may be another process's socket."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
    server = grpc.server(pool, maximum_concurrent_rpcs=max_calls)
    add(server)
    # "unix:PATH", not "unix://PATH": grpcio (1.85) refuses a server address "unix://" + a path of 106 or 107 bytes,
    # which the kubelet and a unix socket address (107 bytes, node.settings.UNIX_PATH_MAX) take.
    server.add_insecure_port("unix:" + socket_path)
    server.start()
    return server


def remove_own_socket(path: str, made: SocketId) -> str:
    """Remove the socket this process made at `path` (`made`: its socket_id then), never one another process put
    there since; a few words on what was done, for the stop's log line."""
    current = socket_id(path)
    if current is not None and current != made:
        return f"the socket {path} is another process's now, so it was left in place"
    if current is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return f"socket {path} removed"  # by us, or by the gRPC server as it stopped


def run(program: Program, stop_event: threading.Event, failures: tuple[type[BaseException], ...], what: str,
        logger: logging.Logger) -> int:
    """Start `program`, serve until `stop_event`, stop it: 0; a start failing with one of `failures`: one line in
    the program's `logger` naming why, the program stopped, 2."""
    try:
        program.start()
    except failures as exc:
        logger.error("The %s cannot start: %s.", what, " ".join(str(exc).split()))
        program.stop()
        return 2
    heap.freeze_start_up()  # full collections now skip everything start-up made (common/heap.py)
    try:
        stop_event.wait()
    finally:
        program.stop()
    return 0


def serve_until_signalled(run_program: Callable[[threading.Event], int], bound: float, what: str,
                          logger: logging.Logger) -> int:
    """Run the program in a thread; the main thread only waits, so SIGTERM and SIGINT are handled at once.

    A signal arms faulthandler's watchdog (a C thread that needs neither the GIL nor the main thread): if the
    process has not exited `bound` seconds later (a thread stuck in a call, or the interpreter waiting for a gRPC
    worker thread at exit), it writes every thread's stack to stderr and calls _exit(1). Call this only as the
    process's entry: the watchdog stays armed until the process ends.
    """
    stop_event = threading.Event()
    codes: list[int] = []

    def arm() -> None:
        faulthandler.dump_traceback_later(bound, exit=True, file=sys.stderr)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop_event.is_set():
            return  # a second signal: the watchdog runs already
        arm()  # first: logging itself could block (a full stderr pipe, a lock held by a stuck thread)
        logger.info("Received %s; stopping. If the %s has not stopped within %g s (GPUSHARE_SHUTDOWN_SECONDS), every "
                 "thread's stack is written to the log and the process exits.", signal.Signals(signum).name, what,
                 bound)
        stop_event.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    worker = threading.Thread(target=lambda: codes.append(run_program(stop_event)), name=what, daemon=True)
    worker.start()
    while worker.is_alive():
        # A timed wait: a signal the kernel delivers to another thread (gRPC's, say) does not interrupt an untimed
        # one, and Python runs handlers only in the main thread, so an untimed wait could ignore SIGTERM for good.
        worker.join(timeout=SIGNAL_POLL_SECONDS)
    if not stop_event.is_set():
        arm()  # a failed start: the same bound for the interpreter's exit
    return codes[0] if codes else 1


def command_line_settings(  # noqa: PLR0917 - the program's own parts, each named once
    argv: Sequence[str] | None, prog: str, description: str, variables: Sequence[cli.Variable],
    flags: Mapping[str, str], read: Callable[[Mapping[str, str]], T], what: str,
) -> T | None:
    """The settings from the environment with the flags (each overrides its variable); None after printing one line
    naming the bad setting (the caller exits 2)."""
    parser = cli.parser(
        prog, description, variables,
        f"The flags override the variables of the same name. Every setting is checked before the {what} serves; a "
        "bad one stops it with one line naming the variable and exit status 2.",
    )
    for flag, variable in flags.items():
        parser.add_argument(flag, dest=variable, metavar="VALUE", help=f"overrides {variable}")
    args = parser.parse_args(argv)
    try:
        return read({k: v for k, v in vars(args).items() if v is not None})
    except SettingsError as exc:
        print(f"The {what} cannot start: {' '.join(str(exc).split())}.", file=sys.stderr)
        return None
