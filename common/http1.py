"""HTTP/1.1 for the webhook's front and /metrics: read requests under deadlines, build WSGI environs, frame answers."""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

# A request line and headers larger than this are refused (the API server sends well under 1 KiB of headers).
MAX_HEADER_BYTES = 16384
MAX_HEADERS = 100
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class BadRequest(Exception):
    """A request that cannot be framed; answered with a 400 (or the status given) and the connection closed."""

    def __init__(self, message: str, status: str = "400 Bad Request") -> None:
        super().__init__(message)
        self.status = status


class Stalled(Exception):
    """The client did not send a phase of its request (headers, body) within the read deadline."""

    def __init__(self, phase: str, seconds: float) -> None:
        super().__init__(f"the request {phase} did not arrive within {seconds:g} s")
        self.phase = phase


@dataclass(frozen=True)
class Limits:
    read_deadline: float  # seconds for the headers, and again for the body, of one request
    keepalive: float  # seconds an idle kept-alive connection may wait for its next request
    max_body_bytes: int


@dataclass
class Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes
    # The length to report to the app: a body over the limit is not read, and the app refuses it by its length.
    content_length: int
    keep_alive: bool
    started: float = 0.0  # the event loop's time when the request's first byte was read

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    def header(self, name: str) -> str | None:
        values = [value for key, value in self.headers if key == name]
        return ",".join(values) if values else None


async def _within(deadline: float, phase: str, seconds: float, step: Any) -> Any:
    remaining = deadline - asyncio.get_running_loop().time()
    try:
        async with asyncio.timeout(max(remaining, 0.0)):
            return await step
    except TimeoutError as exc:
        raise Stalled(phase, seconds) from exc


def _parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[0] not in _METHODS or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1]:
        raise BadRequest("the request line is not an HTTP/1.1 request line")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest(f"the request has more than {MAX_HEADERS} header fields")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or line[0] in " \t":
            raise BadRequest("a header field is malformed")
        headers.append((name.lower(), value.strip(" \t")))
    return parts[0], parts[1], parts[2], headers


def _content_length(value: str | None) -> int | None:
    if value is None:
        return None
    values = {part.strip() for part in value.split(",")}
    if len(values) != 1:
        raise BadRequest("the request has conflicting Content-Length headers")
    text = values.pop()
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise BadRequest("the Content-Length header is not a whole number of bytes")
    return int(text)


async def _read_chunked(reader: asyncio.StreamReader, limit: int) -> tuple[bytes, int]:
    """The body of a chunked request, or (b"", limit + 1) once it grows past `limit` (the rest is not read)."""
    body = bytearray()
    while True:
        line = await reader.readuntil(b"\r\n")
        size_text = line[:-2].split(b";", 1)[0].strip()
        if not size_text or len(size_text) > 16 or size_text.strip(b"0123456789abcdefABCDEF"):
            raise BadRequest("a chunk size is malformed")
        size = int(size_text, 16)
        if size == 0:
            break
        if len(body) + size > limit:
            return b"", limit + 1
        body += await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise BadRequest("a chunk does not end with CRLF")
    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailer fields, ignored
        pass
    return bytes(body), len(body)


async def read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: Limits, *, first: bool,
    started: Callable[[], None] | None = None,
) -> Request | None:
    """The next whole request on the connection, or None when the client closed it between requests.

    The headers must arrive within `read_deadline` of the first byte and the body within `read_deadline` of the
    headers. A kept-alive connection may stay idle for `keepalive` before its next request; `started` is called when
    the first byte of that request arrives (the connection is no longer idle). With `first`, the first byte too must
    arrive within `read_deadline` (of the handshake's end), so a client cannot hold a connection it never used: the
    metrics port; the webhook's worker lets a new connection wait like a kept-alive one (webhook/server/worker.py).
    """
    loop = asyncio.get_running_loop()
    seconds = limits.read_deadline
    deadline = loop.time() + seconds
    if first:
        start = await _within(deadline, "headers", seconds, reader.read(1))
    else:
        try:
            async with asyncio.timeout(limits.keepalive):
                start = await reader.read(1)
        except TimeoutError:
            return None  # an idle kept-alive connection: close it quietly
        deadline = loop.time() + seconds
        if start and started is not None:
            started()
    if not start:
        return None
    arrived = loop.time()
    try:
        head = start + await _within(deadline, "headers", seconds, reader.readuntil(b"\r\n\r\n"))
    except asyncio.LimitOverrunError as exc:
        raise BadRequest(f"the request headers are over {MAX_HEADER_BYTES} bytes",
                         "431 Request Header Fields Too Large") from exc
    method, target, version, headers = _parse_head(head[:-4])
    req = Request(method, target, version, headers, b"", 0, keep_alive=False, started=arrived)
    connection = (req.header("connection") or "").lower()
    req.keep_alive = version == "HTTP/1.1" and "close" not in connection
    length = _content_length(req.header("content-length"))
    chunked = req.header("transfer-encoding")
    if chunked is not None and (length is not None or chunked.lower() != "chunked"):
        raise BadRequest("the request's Transfer-Encoding is not plain chunked, or comes with a Content-Length")
    if length is None and chunked is None:
        return req
    if (length or 0) > limits.max_body_bytes:
        req.content_length, req.keep_alive = length or 0, False  # the app refuses it; the body is never read
        return req
    if (req.header("expect") or "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    deadline = loop.time() + seconds
    if length is not None:
        req.body = await _within(deadline, "body", seconds, reader.readexactly(length))
        req.content_length = length
    else:
        req.body, req.content_length = await _within(
            deadline, "body", seconds, _read_chunked(reader, limits.max_body_bytes))
        if req.content_length > limits.max_body_bytes:
            req.keep_alive = False
    return req


def environ(req: Request, server: tuple[str, int], client: tuple[str, int]) -> dict[str, Any]:
    """The WSGI environ (PEP 3333) of a whole request; the body is in memory already."""
    path, _, query = req.target.partition("?")
    env: dict[str, Any] = {
        "REQUEST_METHOD": req.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
        "QUERY_STRING": query,
        "SERVER_NAME": server[0],
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": req.version,
        "REMOTE_ADDR": client[0],
        "REMOTE_PORT": str(client[1]),
        "CONTENT_LENGTH": str(req.content_length) if req.content_length else "",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "https",
        "wsgi.input": io.BytesIO(req.body),
        "wsgi.input_terminated": True,
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    for name, value in req.headers:
        if name == "content-type":
            env["CONTENT_TYPE"] = value
        elif name not in ("content-length", "transfer-encoding") and "_" not in name:
            key = "HTTP_" + name.upper().replace("-", "_")
            env[key] = f"{env[key]},{value}" if key in env else value
    return env


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def call_app(app: WSGIApp, env: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
    """Run the WSGI app to completion: (status, headers, body). Exceptions propagate to the caller."""
    started: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], Any]:
        started[:] = [(status, list(headers))]
        return lambda data: None  # the legacy write() callable; Flask does not use it

    result = app(env, start_response)
    try:
        body = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    if not started:
        raise RuntimeError("the WSGI app returned without calling start_response")
    return started[0][0], started[0][1], body


def response(status: str, headers: list[tuple[str, str]], body: bytes, *, keep_alive: bool, head: bool) -> bytes:
    """An HTTP/1.1 response with a Content-Length (the whole body is known) and, when closing, Connection: close."""
    lines = [f"HTTP/1.1 {status}"]
    lines += [f"{name}: {value}" for name, value in headers
              if name.lower() not in ("content-length", "connection", "transfer-encoding")]
    lines.append(f"Content-Length: {len(body)}")
    if not keep_alive:
        lines.append("Connection: close")
    out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return out if head else out + body


def plain(status: str, message: str) -> bytes:
    """A one-line text answer the front gives itself (a request it could not frame), closing the connection."""
    body = (message + "\n").encode()
    return response(status, [("Content-Type", "text/plain; charset=utf-8")], body, keep_alive=False, head=False)


# At most this much of a refused, unread body is read and dropped before the connection closes.
LINGER_BYTES = 64 * 1024 * 1024


async def linger(reader: asyncio.StreamReader, deadline: float) -> None:
    """Read and drop what the client still sends of a body refused unread (bounded in bytes and time): closing a
    socket with unread data resets the connection, and the client would lose its answer."""
    dropped = 0
    try:
        async with asyncio.timeout(deadline):
            while dropped < LINGER_BYTES:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                dropped += len(chunk)
    except (TimeoutError, OSError, EOFError, asyncio.IncompleteReadError):
        return
