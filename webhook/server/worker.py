"""gunicorn worker for the webhook: an asyncio front that bounds every read, and a thread pool for the app.

gunicorn's gthread worker gives each connection a thread from the moment its first byte arrives, and reads the
TLS handshake, the headers and the body with no deadline: a few clients that stop mid-request hold every thread
of a replica. Here one event loop per process owns every connection: the handshake, the headers and the body are
each read under GPUSHARE_READ_DEADLINE_SECONDS, costing no thread while they wait, and only a whole request is
handed to the WSGI app. A stalled client costs a socket, never a thread.

Connection limits: webhook/server/connlimits.py; sources: webhook/server/sourcefilter.py. The app runs on the
loop's own thread unless GPUSHARE_THREADS > 0 (gunicorn.conf.py has the figures that chose it).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
import signal
import socket
import ssl
import sys
import time
from asyncio import sslproto
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gunicorn import sock as gunicorn_sock
from gunicorn.workers import base

from common import http1
from webhook.server import sourcefilter
from webhook.server.acceptshare import Shares
from webhook.server.connections import Conn, Connections, Reader
from webhook.server.connlimits import State
from webhook.server.metrics import WireMetrics
from webhook.server.settings import from_environ

log = logging.getLogger(__name__)

_ERRORS = (OSError, EOFError, asyncio.IncompleteReadError, ssl.SSLError)
# Made when gunicorn's arbiter loads this worker class, before it forks the workers: all of them share it.
SHARES = Shares()
# A process holding more connections than another lets that one accept for this long, then accepts itself.
_TURN = 0.005
# Connections from outside GPUSHARE_ADMISSION_SOURCES one wake-up resets at most, before it yields to the loop.
_OUTSIDERS_PER_WAKE = 256
# After the process ran out of file descriptors (or memory) for a new connection, it accepts again this much later.
_ACCEPT_PAUSE = 1.0
# A stopping process waits this long after a connection's handshake for its first request (_drain).
_FRESH = 1.0
# asyncio gives every TLS connection a zeroed 256 KiB read buffer (1,000 idle ones held 280 MiB of a process); a TLS
# record is at most 16 KiB (RFC 8446 5.1) plus its header and tag, so 32 KiB reads any one whole.
TLS_READ_BUFFER = 32 * 1024


def _peer(writer: asyncio.StreamWriter) -> tuple[str, int]:
    peer = writer.get_extra_info("peername")
    return (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) and len(peer) >= 2 else ("unknown", 0)


class WebhookWorker(base.Worker):  # type: ignore[misc]  # gunicorn ships no type hints
    """One asyncio loop per process: bounded TLS and request reads, whole requests to a thread pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = from_environ()
        self.limits = http1.Limits(settings.read_deadline_seconds, float(self.cfg.keepalive), settings.max_body_bytes)
        self.app_threads = settings.threads  # 0: the app runs on the loop's thread
        self.max_connections: int = self.cfg.worker_connections
        self.max_per_client = settings.max_connections_per_client
        self.admission_sources = settings.admission_sources
        self.sources: sourcefilter.Sources | None = None  # checked at accept where the kernel refused the filter
        self.conns: Connections  # made in run(), in the worker process (its counters are that process's)
        self.wire: WireMetrics  # likewise
        self.loop: asyncio.AbstractEventLoop  # made in init_process, in the worker process
        self.pool: ThreadPoolExecutor | None = None
        self.connections: set[asyncio.Task[None]] = set()
        self._attaching: set[asyncio.Task[None]] = set()
        self._slot: int | None = None  # this process's entry in SHARES
        self._deferred = False
        self.busy = 0
        self.quick_exit = False

    # gunicorn lifecycle ------------------------------------------------------------------------------------

    def init_process(self) -> None:
        self.loop = asyncio.new_event_loop()  # in the worker process: the arbiter must not hold one per worker
        sslproto.SSLProtocol.max_size = TLS_READ_BUFFER
        # The kernel drops connections from outside GPUSHARE_ADMISSION_SOURCES; else _accept resets them itself.
        self.sources = sourcefilter.guard([listener.sock for listener in self.sockets], self.admission_sources,
                                          self.cfg.bind[0] if self.cfg.bind else "")
        super().init_process()

    def init_signals(self) -> None:
        for sig in self.SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        self.loop.add_signal_handler(signal.SIGTERM, self._stop, False)
        self.loop.add_signal_handler(signal.SIGINT, self._stop, True)
        self.loop.add_signal_handler(signal.SIGQUIT, self._stop, True)
        self.loop.add_signal_handler(signal.SIGUSR1, self.log.reopen_files)
        self.loop.add_signal_handler(signal.SIGABRT, self._abort)

    def _stop(self, quick: bool) -> None:
        self.quick_exit = self.quick_exit or quick
        self.alive = False

    def _abort(self) -> None:
        self.alive = False
        self.cfg.worker_abort(self)
        sys.exit(1)

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        if self.app_threads:
            self.pool = ThreadPoolExecutor(max_workers=self.app_threads, thread_name_prefix="webhook-app")
        self._slot = SHARES.claim(os.getpid())
        self.conns = Connections(self.max_connections, self.max_per_client)
        self.wire = WireMetrics()
        try:
            self.loop.run_until_complete(self._serve())
        finally:
            if self._slot is not None:
                SHARES.release(self._slot)
            if self.pool is not None:
                self.pool.shutdown(wait=False, cancel_futures=True)
            self.loop.close()

    async def _serve(self) -> None:
        listeners = [listener.sock for listener in self.sockets]
        for sock in listeners:
            sock.setblocking(False)
            self.loop.add_reader(sock.fileno(), self._accept, sock)
        while self.alive:
            self.notify()  # the arbiter's heartbeat: a loop that stops turning gets this process replaced
            if self.ppid != os.getppid():
                log.info("The gunicorn arbiter is gone; this webhook worker stops.")
                break
            await asyncio.sleep(1.0)
        for sock in listeners:
            self.loop.remove_reader(sock.fileno())
        await self._drain()

    async def _drain(self) -> None:
        """Stop without failing a call (SIGTERM; gunicorn's reload on SIGHUP replaces every worker this way): each
        request already arriving is answered, with `Connection: close`, and each connection with none is reset
        (Connections.quiet), so the API server sends its next call on a new connection, which the listening
        socket gives to a process still serving. Closing kept-alive connections at once (a FIN) failed a pod's
        creation during a reload: a POST written on one after the FIN reads EOF and is not retried. Bounded by
        graceful_timeout; a quick exit (SIGINT, SIGQUIT) closes every connection at once."""
        deadline = time.monotonic() + (0 if self.quick_exit else self.cfg.graceful_timeout)
        while (self.busy or self.connections or self._attaching) and time.monotonic() < deadline:
            self.notify()
            for conn in self.conns.quiet(self.loop.time() - _FRESH):
                conn.evict()
                self.conns.remove(conn)
            await asyncio.sleep(0.05)
        for task in list(self.connections):
            task.cancel()
        if self.connections:
            await asyncio.wait(self.connections, timeout=1.0)

    # connections -------------------------------------------------------------------------------------------

    def _accept(self, sock: socket.socket) -> None:
        """One connection per wake-up, so every process takes its share of the API server's burst of keep-alive
        connections (bench/bench_webhook_http.py: 99% / 1% of the CPU over two processes with asyncio's up to 100); a
        process holding more than another (SHARES) first leaves it _TURN. Outsiders are reset here, many a wake-up."""
        if self._slot is not None and not self._deferred and SHARES.holds_more(self._slot):
            self._deferred = True
            self.loop.remove_reader(sock.fileno())
            self.loop.call_later(_TURN, self._resume, sock)
            return
        self._deferred = False
        for _ in range(_OUTSIDERS_PER_WAKE):
            try:
                conn, peer = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # another process took it
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise
                # Linux keeps reporting the socket readable: stop accepting for a moment instead of spinning.
                log.warning("Could not accept a connection (%s); accepting again in %g s.", exc, _ACCEPT_PAUSE)
                self.loop.remove_reader(sock.fileno())
                self.loop.call_later(_ACCEPT_PAUSE, self._resume, sock)
                return
            if self.sources is None or self.sources.admits(peer):
                break
            sourcefilter.reset(conn)  # from outside GPUSHARE_ADMISSION_SOURCES: no TLS, no task, the next one
            self.wire.outsiders.inc()
        else:
            return  # more are waiting: the loop wakes this process again, after its other work
        self.wire.accepted.inc()
        conn.setblocking(False)
        task = self.loop.create_task(self._attach(conn))
        self._attaching.add(task)  # held until _accepted has counted the connection
        task.add_done_callback(self._attached)
        self._publish()

    def _attached(self, task: asyncio.Task[None]) -> None:
        self._attaching.discard(task)
        self._publish()

    def _closed(self, conn: Conn, task: asyncio.Task[None]) -> None:
        self.connections.discard(task)
        self.conns.remove(conn)
        self._publish()

    def _publish(self) -> None:
        if self._slot is not None:
            SHARES.publish(self._slot, self.conns.total + len(self._attaching))

    def _resume(self, sock: socket.socket) -> None:
        if self.alive:
            self.loop.add_reader(sock.fileno(), self._accept, sock)

    async def _attach(self, conn: socket.socket) -> None:
        def protocol() -> asyncio.StreamReaderProtocol:
            reader = Reader(limit=http1.MAX_HEADER_BYTES, loop=self.loop)
            return asyncio.StreamReaderProtocol(reader, self._accepted, loop=self.loop)

        try:
            await self.loop.connect_accepted_socket(protocol, sock=conn)
        except OSError:
            conn.close()  # the client went away before its connection was set up

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Runs inside connection_made: no byte of the handshake can reach the plain-text reader before start_tls."""
        if isinstance(writer.transport, asyncio.ReadTransport):
            writer.transport.pause_reading()
        assert isinstance(reader, Reader)
        client = _peer(writer)
        conn = self.conns.admit(reader, writer, client[0])
        if conn is None:
            writer.transport.abort()
            return
        conn.task = task = self.loop.create_task(self._connection(conn, client))
        self.connections.add(task)
        task.add_done_callback(functools.partial(self._closed, conn))

    async def _connection(self, conn: Conn, client: tuple[str, int]) -> None:
        writer = conn.writer
        graceful = secured = False
        try:
            secured = await self._handshake(writer, client)
            if secured:
                conn.secured_at = self.loop.time()
                graceful = await self._exchange(conn, client)
        except asyncio.CancelledError:
            pass  # the worker is stopping, or the connection gave way to another (webhook/server/connections.py)
        except _ERRORS as exc:  # the client went away or broke TLS mid-request
            log.debug("The connection from %s:%s ended: %r.", client[0], client[1], exc)
        finally:
            if secured:
                self.wire.requests_per_connection.observe(conn.served)
            if graceful:
                writer.close()  # TLS close_notify, bounded by asyncio's SSL shutdown timeout
            else:
                writer.transport.abort()

    async def _handshake(self, writer: asyncio.StreamWriter, client: tuple[str, int]) -> bool:
        """The TLS handshake, bounded and counted; True when it completed."""
        seconds = self.limits.read_deadline
        started = self.loop.time()
        try:
            # Our own bound: asyncio's ssl_handshake_timeout ends in an OSError that cannot be told from a reset.
            async with asyncio.timeout(seconds):
                await writer.start_tls(self.cfg_ssl_context())
        except TimeoutError:
            self.wire.handshake("timed_out")
            log.info("Closed the connection from %s:%s: its TLS handshake did not finish within %g s.",
                     client[0], client[1], seconds)
            return False
        except (ssl.SSLError, OSError, EOFError) as exc:
            self.wire.handshake("failed")
            log.debug("The TLS handshake with %s:%s failed: %s.", client[0], client[1], exc)
            return False
        tls = writer.get_extra_info("ssl_object")
        self.wire.handshake("completed", self.loop.time() - started,
                            resumed=isinstance(tls, ssl.SSLObject) and tls.session_reused)
        return True

    async def _exchange(self, conn: Conn, client: tuple[str, int]) -> bool:
        """Serve requests until the client or the worker stops; True when the connection may close gracefully."""
        reader, writer = conn.reader, conn.writer
        server = writer.get_extra_info("sockname")
        server_addr = (str(server[0]), int(server[1])) if isinstance(server, tuple) else ("localhost", 0)
        # A connection whose handshake is done may wait for its first request as long as a kept-alive one waits for
        # its next: Go's Transport pools connections it dialed but did not use (queueForDial, tryPutIdleConn), and
        # closing them at the read deadline cost handshakes and a failed POST (bench/bench_apiserver_client.py).
        reading = functools.partial(self.conns.mark, conn, State.UNFINISHED)
        while True:  # a stopping process answers what arrives, and resets the connection when nothing does (_drain)
            try:
                req = await http1.read_request(reader, writer, self.limits, first=False, started=reading)
            except http1.Stalled as exc:
                log.info("Closed the connection from %s:%s: %s.", client[0], client[1], exc)
                return False
            except (http1.BadRequest, asyncio.LimitOverrunError) as exc:
                bad = exc if isinstance(exc, http1.BadRequest) else http1.BadRequest("a request line is too long")
                log.warning("Refused a request from %s:%s: %s.", client[0], client[1], bad)
                return await self._send(writer, http1.plain(bad.status, f"The request was refused: {bad}."))
            if req is None:
                return True
            self.conns.mark(conn, State.BUSY)
            keep_alive = req.keep_alive and self.alive
            answer = await self._answer(req, http1.environ(req, server_addr, client), keep_alive)
            if not await self._send(writer, answer):
                return False
            conn.served += 1
            self.wire.request(req.path, self.loop.time() - req.started)
            if not keep_alive:
                if req.content_length > len(req.body):
                    await http1.linger(reader, self.limits.read_deadline)
                return True
            reader.fed = False  # from here until the next request's first byte, the connection is idle
            self.conns.mark(conn, State.IDLE)

    async def _answer(self, req: http1.Request, env: dict[str, Any], keep_alive: bool) -> bytes:
        self.busy += 1
        try:
            if self.pool is None:
                status, headers, body = http1.call_app(self.wsgi, env)
            else:
                status, headers, body = await self.loop.run_in_executor(self.pool, http1.call_app, self.wsgi, env)
        except Exception:
            log.exception("The webhook app failed on %s %s; answered 500.", req.method, req.target)
            return http1.plain("500 Internal Server Error", "The webhook failed on this request; see its log.")
        finally:
            self.busy -= 1
        return http1.response(status, headers, body, keep_alive=keep_alive, head=req.method == "HEAD")

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> bool:
        """Write an answer; a client that does not read it within the read deadline is dropped."""
        writer.write(data)
        try:
            async with asyncio.timeout(self.limits.read_deadline):
                await writer.drain()
        except TimeoutError:
            log.info("Closed the connection from %s:%s: it did not read its answer within %g s.",
                     *_peer(writer), self.limits.read_deadline)
            return False
        return True

    def cfg_ssl_context(self) -> ssl.SSLContext:
        """The context of gunicorn.conf.py's ssl_context hook, asked for each connection (certificate rotation)."""
        context: ssl.SSLContext = gunicorn_sock.ssl_context(self.cfg)
        return context
