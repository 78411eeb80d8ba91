"""A small asyncio HTTP/1.1 server standing in for uvicorn (as vLLM 0.5.4 runs it).

What it keeps of uvicorn 0.30 (httptools): persistent connections with a 5 s keep-alive timeout
(vLLM passes timeout_keep_alive=5), `date` and `server: uvicorn` headers first, Content-Length bodies,
chunked streaming responses, request bodies by Content-Length or chunked transfer coding, `Expect:
100-continue`, pipelined requests answered in order, `400 Invalid HTTP request received.` on garbage,
and the access log line `INFO:     client - "METHOD path HTTP/1.1" status phrase`.
A client that disconnects is noticed at once (connection_lost), so its request can be aborted; a
streaming response can be ended cleanly (terminating chunk) or cut (the connection is aborted without
the terminating chunk, which a client sees as an incomplete chunked read).
"""
from __future__ import annotations

import asyncio
import email.utils
import sys
from dataclasses import dataclass
from http import HTTPStatus
from typing import Awaitable, Callable, Dict, List, Optional, Tuple
from urllib.parse import unquote

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_WRITE_BUFFER = 32 * 1024 * 1024


@dataclass
class Request:
    method: str
    target: str
    path: str
    query: str
    version: str
    headers: Dict[str, str]
    body: bytes
    client: str

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "1.0":
            return "keep-alive" in connection
        return "close" not in connection


class BadRequest(Exception):
    pass


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class Exchange:
    """One request on one connection: how the application answers it."""

    def __init__(self, protocol: "HttpProtocol", request: Request):
        self.protocol = protocol
        self.request = request
        self.started = False
        self.finished = False
        self.cut = False
        self.status = 0
        self.disconnected = protocol.disconnected

    def _head(self, status: int, headers: List[Tuple[str, str]]) -> bytes:
        lines = [f"HTTP/1.1 {status} {_phrase(status)}", f"date: {email.utils.formatdate(usegmt=True)}",
                 "server: uvicorn"]
        lines += [f"{name}: {value}" for name, value in headers]
        if not self.request.keep_alive:
            lines.append("connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def respond(self, status: int, body: bytes = b"", content_type: Optional[str] = None,
                headers: Optional[List[Tuple[str, str]]] = None) -> None:
        """A complete response with Content-Length."""
        all_headers = [("content-length", str(len(body)))]
        if content_type:
            all_headers.append(("content-type", content_type))
        all_headers += headers or []
        self.status = status
        self.started = self.finished = True
        self.protocol.access_log(self.request, status)
        payload = self._head(status, all_headers) + (body if self.request.method != "HEAD" else b"")
        self.protocol.write(payload)

    def start_stream(self, status: int, content_type: str, headers: Optional[List[Tuple[str, str]]] = None) -> None:
        all_headers = [("content-type", content_type)] + (headers or []) + [("transfer-encoding", "chunked")]
        self.status = status
        self.started = True
        self.protocol.access_log(self.request, status)
        self.protocol.write(self._head(status, all_headers))

    def send_chunk(self, data: bytes) -> None:
        if data and not self.finished and not self.protocol.closed:
            self.protocol.write(b"%x\r\n%b\r\n" % (len(data), data))

    def end_stream(self) -> None:
        if not self.finished:
            self.finished = True
            self.protocol.write(b"0\r\n\r\n")

    def cut_stream(self) -> None:
        """Close the connection without the terminating chunk (what a dying server does)."""
        if not self.finished:
            self.finished = True
            self.cut = True
            self.protocol.abort()


Application = Callable[[Exchange], Awaitable[None]]


class HttpProtocol(asyncio.Protocol):
    def __init__(self, server: "HttpServer"):
        self.server = server
        self.transport: Optional[asyncio.Transport] = None
        self.buffer = bytearray()
        self.closed = False
        self.busy = False
        self.disconnected = asyncio.Event()
        self.client = "-"
        self.keepalive_handle: Optional[asyncio.TimerHandle] = None
        self.task: Optional[asyncio.Task] = None

    # --- transport callbacks --------------------------------------------------------------------
    def connection_made(self, transport):  # type: ignore[override]
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.client = f"{peer[0]}:{peer[1]}"
        self.server.connections.add(self)
        self._arm_keepalive()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > MAX_BODY_BYTES + MAX_HEADER_BYTES:
            self.abort()
            return
        if not self.busy:
            self._next()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.disconnected.set()
        self.server.connections.discard(self)
        if self.keepalive_handle:
            self.keepalive_handle.cancel()

    # --- helpers --------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.closed or self.transport is None:
            return
        self.transport.write(data)
        if self.transport.get_write_buffer_size() > MAX_WRITE_BUFFER:
            self.abort()

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True
        self.disconnected.set()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True

    def access_log(self, request: Request, status: int) -> None:
        if self.server.access_log:
            self.server.log(f'INFO:     {self.client} - "{request.method} {request.target} HTTP/{request.version}" '
                            f"{status} {_phrase(status)}")

    def _arm_keepalive(self) -> None:
        if self.keepalive_handle:
            self.keepalive_handle.cancel()
        loop = asyncio.get_running_loop()
        self.keepalive_handle = loop.call_later(self.server.keep_alive_timeout, self._idle_timeout)

    def _idle_timeout(self) -> None:
        if not self.busy and not self.buffer:
            self.close()

    def _next(self) -> None:
        if self.closed or self.busy:
            return
        try:
            parsed = self._parse()
        except BadRequest:
            self.server.log("WARNING:  Invalid HTTP request received.")
            body = b"Invalid HTTP request received."
            self.write(b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
                       b"content-length: %d\r\n\r\n%b" % (len(body), body))
            self.close()
            return
        if parsed is None:
            return
        self.busy = True
        if self.keepalive_handle:
            self.keepalive_handle.cancel()
        if self.server.stopping:
            parsed.headers["connection"] = "close"
        self.task = asyncio.get_running_loop().create_task(self._serve(parsed))

    def _parse(self) -> Optional[Request]:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEADER_BYTES:
                raise BadRequest()
            return None
        head = bytes(self.buffer[:end]).decode("latin-1")
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha():
            raise BadRequest()
        method, target, version = parts[0], parts[1], parts[2][5:]
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise BadRequest()
            headers[name.lower()] = value.strip()
        body_start = end + 4
        body = b""
        if "chunked" in headers.get("transfer-encoding", "").lower():
            decoded = self._dechunk(body_start)
            if decoded is None:
                self._maybe_continue(headers)
                return None
            body, consumed = decoded
            del self.buffer[:consumed]
        else:
            try:
                length = int(headers.get("content-length", "0") or "0")
            except ValueError:
                raise BadRequest() from None
            if length < 0 or length > MAX_BODY_BYTES:
                raise BadRequest()
            if len(self.buffer) < body_start + length:
                self._maybe_continue(headers)
                return None
            body = bytes(self.buffer[body_start:body_start + length])
            del self.buffer[:body_start + length]
        path, _, query = target.partition("?")
        return Request(method=method, target=target, path=unquote(path), query=query, version=version,
                       headers=headers, body=body, client=self.client)

    def _maybe_continue(self, headers: Dict[str, str]) -> None:
        if headers.get("expect", "").lower() == "100-continue" and not headers.get("_continued"):
            headers["_continued"] = "1"
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _dechunk(self, start: int) -> Optional[Tuple[bytes, int]]:
        body = bytearray()
        pos = start
        while True:
            line_end = self.buffer.find(b"\r\n", pos)
            if line_end < 0:
                return None
            try:
                size = int(bytes(self.buffer[pos:line_end]).split(b";")[0], 16)
            except ValueError:
                raise BadRequest() from None
            pos = line_end + 2
            if size == 0:
                trailer_end = self.buffer.find(b"\r\n", pos)
                if trailer_end < 0:
                    return None
                return bytes(body), trailer_end + 2
            if len(self.buffer) < pos + size + 2:
                return None
            body += self.buffer[pos:pos + size]
            pos += size + 2
            if len(body) > MAX_BODY_BYTES:
                raise BadRequest()

    async def _serve(self, request: Request) -> None:
        exchange = Exchange(self, request)
        try:
            await self.server.app(exchange)
        except Exception:  # noqa: BLE001 - uvicorn's behaviour: log, 500 if nothing was sent, else cut
            import traceback
            self.server.log("ERROR:    Exception in ASGI application\n" + traceback.format_exc().rstrip())
            if not exchange.started:
                exchange.respond(500, b"Internal Server Error", "text/plain; charset=utf-8")
            elif not exchange.finished:
                exchange.cut_stream()
        if not exchange.started and not self.closed:
            exchange.respond(500, b"Internal Server Error", "text/plain; charset=utf-8")
        self.busy = False
        if exchange.cut or self.closed:
            return
        if not request.keep_alive or self.server.stopping:
            self.close()
            return
        self._arm_keepalive()
        if self.buffer:
            self._next()


class HttpServer:
    def __init__(self, app: Application, log: Callable[[str], None], access_log: bool = True,
                 keep_alive_timeout: float = 5.0):
        self.app = app
        self.log = log
        self.access_log = access_log
        self.keep_alive_timeout = keep_alive_timeout
        self.connections: "set[HttpProtocol]" = set()
        self.servers: List[asyncio.base_events.Server] = []
        self.stopping = False

    async def listen(self, host: Optional[str], port: int, ssl_context=None, sock=None) -> None:
        """Listen on host:port, or on `sock` when the caller bound it earlier (0.8.5.post1 does)."""
        loop = asyncio.get_running_loop()
        if sock is not None:
            server = await loop.create_server(lambda: HttpProtocol(self), sock=sock, ssl=ssl_context, backlog=2048)
        else:
            server = await loop.create_server(lambda: HttpProtocol(self), host=host, port=port, reuse_address=True,
                                              ssl=ssl_context, backlog=2048)
        self.servers.append(server)

    def stop_listening(self) -> None:
        self.stopping = True
        for server in self.servers:
            server.close()
        for connection in list(self.connections):
            if not connection.busy:
                connection.close()

    async def wait_idle(self) -> None:
        """uvicorn's shutdown(): wait for the connections still answering a request."""
        while any(c.busy and not c.closed for c in self.connections):
            await asyncio.sleep(0.05)

    def abort_all(self) -> None:
        for connection in list(self.connections):
            connection.abort()


def stdout_log(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

