"""Named network namespaces with only a loopback, and a TCP forwarder across their boundary, all on 127.0.0.1.

    python -m e2e.netns create NAME
    python -m e2e.netns forward NAME --into 24005:39999 --out 24003:24003
    python -m e2e.netns remove NAME

A server that listens on every interface (the reference extender: `http.ListenAndServe(":"+port)`) runs inside
such a namespace (`exec_argv`), where every interface is its own loopback. `forward` listens on the host's
127.0.0.1:HOSTPORT and connects to 127.0.0.1:NSPORT inside the namespace for each `--into HOSTPORT:NSPORT`, and
listens on 127.0.0.1:NSPORT inside it and connects to the host's 127.0.0.1:HOSTPORT for each
`--out NSPORT:HOSTPORT`. It prints one "forwarding ..." line once every listener is up, and stops on SIGTERM.

A socket belongs to the network namespace of the thread that created it, so one thread switches into the
namespace with setns(2), creates the socket and switches back; an asyncio loop in that thread does the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

NETNS_DIR = Path("/run/netns")  # where `ip netns add` binds a namespace by name
CLONE_NEWNET = 0x40000000  # linux/sched.h
CONNECT_TIMEOUT = 5.0  # seconds to reach the other side before the accepted connection is closed
CHUNK = 65536
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class NetnsError(Exception):
    """A namespace could not be created, entered or removed; the text names the command or call that failed."""


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise NetnsError(f"{name!r} is not a network namespace name: use letters, digits, '_', '.' and '-'")


def _ip(*args: str) -> None:
    argv = ["ip", *args]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"`{' '.join(argv)}` could not run: {exc}") from None
    if result.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed (exit {result.returncode}): {result.stderr.strip()}")


def path(name: str) -> Path:
    return NETNS_DIR / name


def create(name: str) -> None:
    """A network namespace `name` with its loopback up; one that exists already is kept (its loopback brought up)."""
    _check_name(name)
    if not path(name).exists():
        _ip("netns", "add", name)
    _ip("-n", name, "link", "set", "lo", "up")


def remove(name: str) -> None:
    """Removes the namespace `name`; nothing to do when it does not exist."""
    _check_name(name)
    if path(name).exists():
        _ip("netns", "delete", name)


def exec_argv(name: str, argv: Sequence[str]) -> list[str]:
    """The command line that runs `argv` inside the namespace `name`."""
    _check_name(name)
    return ["ip", "netns", "exec", name, *argv]


class Switch:
    """Moves the calling thread between its own network namespace and one named namespace, checking each move."""

    def __init__(self, name: str) -> None:
        _check_name(name)
        self.name = name
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._target = os.open(path(name), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            os.close(self._home)
            raise NetnsError(f"cannot open the network namespace {name} ({path(name)}): {exc.strerror}") from None

    def close(self) -> None:
        os.close(self._target)
        os.close(self._home)

    def _enter(self, descriptor: int, what: str) -> None:
        if self._libc.setns(descriptor, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise NetnsError(f"setns into {what} failed: {os.strerror(error)}")
        wanted, now = os.fstat(descriptor), os.stat("/proc/thread-self/ns/net")
        if (now.st_dev, now.st_ino) != (wanted.st_dev, wanted.st_ino):
            raise NetnsError(f"setns into {what} returned but the thread is not in it")

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        self._enter(self._target, f"the network namespace {self.name}")
        try:
            yield
        finally:
            self._enter(self._home, "this process's network namespace")

    def socket(self) -> socket.socket:
        """A non-blocking TCP socket of the namespace."""
        with self.inside():
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        return sock


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(CHUNK):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()  # a half-close travels on: the other side may still answer


async def _splice(a: Stream, b: Stream, what: str) -> None:
    """Copies both ways until both sides finished; an error on either closes both."""
    pipes = [asyncio.ensure_future(_pipe(a[0], b[1])), asyncio.ensure_future(_pipe(b[0], a[1]))]
    try:
        done, pending = await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
        for task in pending:
            task.cancel()
        failures = [task.exception() for task in done if task.exception() is not None]
        if failures:
            log.warning("%s: connection dropped: %s", what, failures[0])
    finally:
        for task in pipes:
            task.cancel()
        for writer in (a[1], b[1]):
            writer.close()


async def _connect(sock: socket.socket, port: int, what: str) -> Stream | None:
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), CONNECT_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        sock.close()
        log.warning("%s: cannot connect to 127.0.0.1:%s: %s", what, port, str(exc) or "timed out")
        return None
    return await asyncio.open_connection(sock=sock)


async def carry(client: Stream, sock: socket.socket, port: int, what: str) -> None:
    """Connects `sock` to 127.0.0.1:`port` and copies both ways between it and `client` until both sides finished;
    the client is closed when the connection fails (e2e.relay uses it too)."""
    sock.setblocking(False)
    other = await _connect(sock, port, what)
    if other is None:
        client[1].close()
        return
    await _splice(client, other, what)


class Forwarder:
    def __init__(self, switch: Switch, into: Sequence[tuple[int, int]], out: Sequence[tuple[int, int]]) -> None:
        self.switch = switch
        self.into = into
        self.out = out
        self.servers: list[asyncio.Server] = []

    async def start(self) -> None:
        for host_port, ns_port in self.into:
            what = f"into {self.switch.name}: host 127.0.0.1:{host_port} -> namespace 127.0.0.1:{ns_port}"
            try:
                self.servers.append(await asyncio.start_server(self._handler(ns_port, what, inward=True),
                                                              "127.0.0.1", host_port))
            except OSError as exc:
                raise NetnsError(f"{what}: cannot listen: {exc.strerror}") from None
        for ns_port, host_port in self.out:
            what = f"out of {self.switch.name}: namespace 127.0.0.1:{ns_port} -> host 127.0.0.1:{host_port}"
            sock = self.switch.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", ns_port))
            except OSError as exc:
                sock.close()
                raise NetnsError(f"{what}: cannot listen: {exc.strerror}") from None
            self.servers.append(await asyncio.start_server(self._handler(host_port, what, inward=False), sock=sock))

    def _handler(self, port: int, what: str, *, inward: bool) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                sock = self.switch.socket() if inward else socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            except (NetnsError, OSError) as exc:
                log.warning("%s: cannot open a socket: %s", what, exc)
                writer.close()
                return
            await carry((reader, writer), sock, port, what)
        return handle

    def close(self) -> None:
        for server in self.servers:
            server.close()


def _ports(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d{1,5}):(\d{1,5})", text)
    if not match or not all(0 < int(p) < 65536 for p in match.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not PORT:PORT (two TCP ports, e.g. 24005:39999)")
    return int(match[1]), int(match[2])


async def forward(name: str, into: Sequence[tuple[int, int]], out: Sequence[tuple[int, int]]) -> None:
    """Forwards until SIGTERM or SIGINT."""
    switch = Switch(name)
    forwarder = Forwarder(switch, into, out)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await forwarder.start()
        routes = [f"127.0.0.1:{h} -> {name} 127.0.0.1:{n}" for h, n in into]
        routes += [f"{name} 127.0.0.1:{n} -> 127.0.0.1:{h}" for n, h in out]
        print(f"forwarding {', '.join(routes)}", flush=True)
        await stop.wait()
    finally:
        forwarder.close()
        switch.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.netns", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["create", "remove", "forward"])
    parser.add_argument("name", help="the network namespace's name (ip netns)")
    parser.add_argument("--into", type=_ports, action="append", default=[], metavar="HOSTPORT:NSPORT")
    parser.add_argument("--out", type=_ports, action="append", default=[], metavar="NSPORT:HOSTPORT")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.action == "create":
            create(args.name)
        elif args.action == "remove":
            remove(args.name)
        elif not args.into and not args.out:
            parser.error("forward needs at least one --into or --out")
        else:
            asyncio.run(forward(args.name, args.into, args.out))
    except NetnsError as exc:
        print(f"python -m e2e.netns {args.action} {args.name}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
