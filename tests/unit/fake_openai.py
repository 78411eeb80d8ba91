"""A scripted stand-in for vLLM 0.5.4's OpenAI server, for the SSE client and warm-up tests.

Raw sockets, so that a test controls every byte: chunked framing, a connection cut mid-body, a missing
`[DONE]`, a role-only first chunk sent late. Each streamed answer is built by `Answer` (what to send and
how slowly); `FakeServer.answer_for(number, body)` decides per request (default: a good answer). With `tls` (a
server-side SSLContext) it speaks https, as a front door that terminates TLS does.
"""
from __future__ import annotations

import json
import socket
import socketserver
import ssl
import threading
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional


def chunk_frame(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@dataclass
class Answer:
    """One streamed chat answer: `tokens` words, `token_delay` seconds apart, after `first_delay` (an error answer
    `status` comes after `first_delay` too)."""
    tokens: int = 8
    token_delay: float = 0.0
    first_delay: float = 0.0
    role_delay: float = 0.0        # the role-only chunk arrives this long before the first content
    finish_reason: Optional[str] = "length"
    send_done: bool = True
    send_usage: bool = True
    cut_after_tokens: Optional[int] = None   # close the socket mid-body (no terminating chunk)
    status: int = 200
    error_body: Optional[Dict[str, Any]] = None
    error_event_after: Optional[int] = None  # send a 0.5.4-style error event after this many tokens
    prompt_tokens: int = 12
    usage_completion: Optional[int] = None   # report this instead of the true count
    text: str = "word"
    content_type: str = "text/event-stream"
    served_by: Optional[str] = None          # an X-Revive-Server header, as the front door adds


def sse(obj: Any) -> bytes:
    payload = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data: {payload}\n\n".encode()


class _Handler(socketserver.BaseRequestHandler):
    server: "_TCPServer"

    def handle(self) -> None:
        fake = self.server.fake
        sock: socket.socket = self.request
        data = b""
        while b"\r\n\r\n" not in data:
            more = sock.recv(65536)
            if not more:
                return
            data += more
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            rest += sock.recv(65536)
        body = json.loads(rest.decode()) if length else None
        with fake.lock:
            fake.requests.append({"method": method, "path": path, "headers": headers, "body": body})
        if path == "/health":
            fake.health_polls += 1
            status = fake.health(fake.health_polls)
            if status is None:
                return  # close without answering: the port is not serving yet
            self._respond(sock, status, b"")
        elif path == "/v1/models":
            self._json(sock, 200, {"object": "list", "data": [{"id": m, "object": "model"} for m in fake.models]})
        elif path == "/version":
            self._json(sock, 200, fake.version)
        elif path in ("/v1/chat/completions", "/v1/completions"):
            with fake.lock:
                fake.completions += 1
                number = fake.completions
            self._stream(sock, fake.answer_for(number, body), path.endswith("chat/completions"), body)
        else:
            self._json(sock, 404, {"object": "error", "message": "Not Found", "code": 404})

    @staticmethod
    def _respond(sock: socket.socket, status: int, payload: bytes, content_type: str = "application/json") -> None:
        sock.sendall(f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + payload)

    def _json(self, sock: socket.socket, status: int, obj: Any) -> None:
        self._respond(sock, status, json.dumps(obj).encode())

    def _stream(self, sock: socket.socket, answer: Answer, chat: bool, body: Dict[str, Any]) -> None:
        if answer.status != 200:
            time.sleep(answer.first_delay)
            self._json(sock, answer.status, answer.error_body or {"object": "error", "message": "boom",
                                                                  "type": "InternalServerError", "code": answer.status})
            return
        served = f"X-Revive-Server: {answer.served_by}\r\n" if answer.served_by else ""
        sock.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: {answer.content_type}\r\nTransfer-Encoding: chunked\r\n"
                     f"{served}Connection: close\r\n\r\n".encode())
        head = {"id": "chat-1" if chat else "cmpl-1", "object": "chat.completion.chunk" if chat else "text_completion"}
        time.sleep(answer.first_delay)
        if chat:
            sock.sendall(chunk_frame(sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant"},
                                                                "finish_reason": None}]})))
            time.sleep(answer.role_delay)
        for i in range(answer.tokens):
            if answer.cut_after_tokens is not None and i == answer.cut_after_tokens:
                sock.shutdown(socket.SHUT_RDWR)
                return
            if answer.error_event_after is not None and i == answer.error_event_after:
                sock.sendall(chunk_frame(sse({"object": "error", "message": "engine died", "type": "InternalServerError",
                                              "code": 500})))
                sock.sendall(chunk_frame(sse("[DONE]")) + b"0\r\n\r\n")
                return
            last = i == answer.tokens - 1
            reason = answer.finish_reason if last else None
            piece = "" if not answer.text else (f" {answer.text}{i}" if i else f"{answer.text}{i}")
            choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": reason} if chat
                      else {"index": 0, "text": piece, "finish_reason": reason})
            sock.sendall(chunk_frame(sse({**head, "choices": [choice]})))
            if not last:
                time.sleep(answer.token_delay)
        if answer.send_usage and (body.get("stream_options") or {}).get("include_usage"):
            completion = answer.tokens if answer.usage_completion is None else answer.usage_completion
            sock.sendall(chunk_frame(sse({**head, "choices": [], "usage": {
                "prompt_tokens": answer.prompt_tokens, "completion_tokens": completion,
                "total_tokens": answer.prompt_tokens + completion}})))
        if answer.send_done:
            sock.sendall(chunk_frame(sse("[DONE]")))
        sock.sendall(b"0\r\n\r\n")


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    fake: "FakeServer"

    def finish_request(self, request: Any, client_address: Any) -> None:
        """With `tls`, the handshake first, in the request's own thread; a client that refuses the certificate (what
        the TLS tests do on purpose) ends the request quietly."""
        if self.fake.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(10.0)
        try:
            secure = self.fake.tls.wrap_socket(request, server_side=True)
        except OSError:
            return
        try:
            super().finish_request(secure, client_address)
        finally:
            self.shutdown_request(secure)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-answer is what several tests do on purpose: not an error. Anything else is
        kept for `FakeServer.__exit__` to raise, never printed: a handler thread can outlive its test, and
        socketserver's default print lands in whichever test's captured stderr runs next."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)):
            return
        with self.fake.lock:
            self.fake.errors.append(traceback.format_exc())


@dataclass
class FakeServer:
    models: List[str] = field(default_factory=lambda: ["tiny"])
    version: Dict[str, Any] = field(default_factory=lambda: {"version": "0.5.4"})
    health: Callable[[int], Optional[int]] = lambda poll: 200
    answer_for: Callable[[int, Dict[str, Any]], Answer] = lambda number, body: Answer()
    requests: List[Dict[str, Any]] = field(default_factory=list)
    completions: int = 0
    health_polls: int = 0
    errors: List[str] = field(default_factory=list)   # handler failures other than a client hanging up
    lock: threading.Lock = field(default_factory=threading.Lock)
    tls: Optional[ssl.SSLContext] = None
    port: int = 0
    _server: Optional[_TCPServer] = None

    def __enter__(self) -> "FakeServer":
        self._server = _TCPServer(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()
        if self.errors and exc[0] is None:
            raise AssertionError("the scripted server's handler failed:\n" + "\n".join(self.errors))
