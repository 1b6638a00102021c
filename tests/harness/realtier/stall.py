"""A TCP relay in front of the API server that can hang: a client's view of an API server that stops answering.

    with StallRelay(api_port) as relay:      # listens on 127.0.0.1:relay.port, carries bytes to 127.0.0.1:api_port
        relay.hang()     # from now on no byte goes either way, and new connections are accepted and held
        relay.resume()   # every held connection is closed (clients reconnect) and new ones are carried again

It runs on its own event loop thread in the test process and stops, with every connection, when the block ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType

CHUNK = 64 * 1024


class StallRelay:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target_port = target_port
        self.host = host
        self.port = 0
        self.hung = False
        self.held = 0  # connections accepted while hung
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stall-relay", daemon=True)
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.AbstractServer | None = None

    def __enter__(self) -> StallRelay:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, self.host, 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def hang(self) -> None:
        asyncio.run_coroutine_threadsafe(self._hang(), self._loop).result(10)

    async def _hang(self) -> None:
        self.hung = True

    def resume(self) -> None:
        asyncio.run_coroutine_threadsafe(self._resume(), self._loop).result(10)

    async def _resume(self) -> None:
        self.hung = False
        for writer in list(self._writers):
            writer.transport.abort()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            if self.hung:
                self.held += 1
                await reader.read()  # until the client goes or resume() closes it
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._writers.add(up_writer)
            try:
                await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
            finally:
                self._writers.discard(up_writer)
                up_writer.transport.abort()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while True:
            data = await source.read(CHUNK)
            if not data:
                with contextlib.suppress(OSError):
                    sink.write_eof()
                return
            while self.hung:  # hold what arrived: nothing goes either way until resume() closes the connection
                await asyncio.sleep(0.05)
            sink.write(data)
            await sink.drain()
