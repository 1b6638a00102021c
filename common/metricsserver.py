"""Plain-HTTP /metrics for the webhook's arbiter and the device plugin, with bounded threads, connections and reads.

prometheus_client's start_http_server gives every connection a thread that waits for its request without a deadline:
idle connections make as many threads as a client opens, until memory runs out. Here one thread runs an event loop
that owns every connection, reads each request under a deadline, and answers one request per connection (as the
server it replaces did); the collection runs on a pool of COLLECTORS threads; at MAX_CONNECTIONS a new connection
takes the place of the one that has waited longest for its request, or is refused when every one is being answered.
The answer is prometheus_client's own WSGI app: the same formats (text, OpenMetrics, gzip) and the same registry.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import make_wsgi_app
from prometheus_client.registry import Collector

from common import http1

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64  # Prometheus keeps one connection per target; a few scrapers need a handful
COLLECTORS = 2  # threads that collect and encode; more scrapes wait for one, costing no thread
READ_DEADLINE = 5.0  # seconds for the request line and headers: a scraper sends them at once
# Prometheus' default scrape_timeout is 10 s: a collection that takes longer is answered 503 and abandoned.
ANSWER_DEADLINE = 10.0
_WARN_EVERY = 10.0


class MetricsServer:
    """Serves `registry` on `bind` (host, port; port 0 picks one) from a daemon thread until stop()."""

    def __init__(self, bind: tuple[str, int], registry: Collector, *, name: str = "metrics",
                 max_connections: int = MAX_CONNECTIONS, read_deadline: float = READ_DEADLINE) -> None:
        host, port = bind
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind(address)
            self._sock.listen(128)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self.address = (host, int(self._sock.getsockname()[1]))
        self.port = self.address[1]
        self._app = make_wsgi_app(registry)
        self._limits = http1.Limits(read_deadline, 0.0, 0)  # no body: a GET needs none
        self._max = max_connections
        self._open: set[asyncio.StreamWriter] = set()
        self._waiting: dict[asyncio.StreamWriter, None] = {}  # still reading their request, the longest first
        self._warned_at = 0.0
        self._pool = ThreadPoolExecutor(max_workers=COLLECTORS, thread_name_prefix=f"{name}-collect")
        self._loop = asyncio.new_event_loop()
        self._stopping = asyncio.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait(timeout=10)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()
            self._sock.close()

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._connection, sock=self._sock, limit=http1.MAX_HEADER_BYTES)
        self._ready.set()
        async with server:
            await self._stopping.wait()

    def _make_room(self) -> bool:
        """At the cap: close the connection that has waited longest for its request; False when every open one is
        being answered (the new one is refused)."""
        if len(self._open) < self._max:
            return True
        oldest = next(iter(self._waiting), None)
        if oldest is not None:
            del self._waiting[oldest]
            self._open.discard(oldest)
            oldest.transport.abort()
        now = time.monotonic()
        if now - self._warned_at > _WARN_EVERY:
            self._warned_at = now
            log.warning("The /metrics listener holds %s connections, its most; %s. Restrict who may reach the metrics "
                        "port with the NetworkPolicy (docs/deploy.md).", self._max,
                        "closed the one waiting longest for its request" if oldest else "refused a new one")
        return oldest is not None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._make_room():
            writer.transport.abort()
            return
        self._open.add(writer)
        self._waiting[writer] = None
        graceful = False
        try:
            graceful = await self._exchange(reader, writer)
        except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, http1.Stalled):
            pass  # gone, too slow, or too big: nothing to answer
        finally:
            self._open.discard(writer)
            self._waiting.pop(writer, None)
            if graceful:
                writer.close()
            else:
                writer.transport.abort()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            req = await http1.read_request(reader, writer, self._limits, first=True)
        except http1.BadRequest as exc:
            writer.write(http1.plain(exc.status, f"The request was refused: {exc}."))
            return await self._drained(writer)
        if req is None:
            return False
        if writer not in self._waiting:
            return False  # closed to make room while its last bytes were read
        del self._waiting[writer]
        env = http1.environ(req, _address(writer, "sockname"), _address(writer, "peername"))
        env["wsgi.url_scheme"] = "http"
        try:
            async with asyncio.timeout(ANSWER_DEADLINE):
                status, headers, body = await asyncio.get_running_loop().run_in_executor(
                    self._pool, http1.call_app, self._app, env)
        except TimeoutError:
            log.warning("A /metrics collection took over %g s; answered 503.", ANSWER_DEADLINE)
            writer.write(http1.plain("503 Service Unavailable", "Collecting the metrics took too long."))
            return await self._drained(writer)
        except Exception as exc:  # a collector failed: the scraper is told, and the next scrape tries again
            log.warning("A /metrics collection failed (%s: %s); answered 503.", type(exc).__name__, exc)
            writer.write(http1.plain("503 Service Unavailable", f"Collecting the metrics failed: {exc}"))
            return await self._drained(writer)
        writer.write(http1.response(status, headers, body, keep_alive=False, head=req.method == "HEAD"))
        return await self._drained(writer)

    async def _drained(self, writer: asyncio.StreamWriter) -> bool:
        try:
            async with asyncio.timeout(self._limits.read_deadline):
                await writer.drain()
        except TimeoutError:
            return False
        return True


def _address(writer: asyncio.StreamWriter, which: str) -> tuple[str, int]:
    address = writer.get_extra_info(which)
    return (str(address[0]), int(address[1])) if isinstance(address, tuple) and len(address) >= 2 else ("", 0)
