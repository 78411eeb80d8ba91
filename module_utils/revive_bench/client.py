"""An asyncio HTTP/1.1 streaming client for OpenAI-compatible servers, on raw sockets (`asyncio.open_connection`).

Standard library only: it runs on the bench host with the system python3. One request per connection
(`Connection: close`), so a server's keep-alive timeout can never race a reuse, and connection set-up is part of
every request's time, as in vLLM 0.5.4's own benchmark (docs/facts/loadtest.md §4).

Every request keeps its raw timestamps (seconds on one `time.perf_counter` clock; the run's summary has the wall
clock at its zero): `scheduled` (when the load generator meant to send it), `sent` (just before the connection is
opened), `first_byte`, `events` (time and token count of every content-bearing SSE event; the events of one
socket read share its time), `ended`. Whether it counts as complete is decided here, once (`classify`): HTTP 200
with an event stream, a clean end of the body, a `finish_reason` for every choice, `[DONE]` when the server was seen
sending it, no error event, at least one content event. A cut stream, a non-200 answer, a timeout is a failure with
its reason, never a short success; there are no retries.
"""
from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

try:
    from ansible.module_utils.revive_sse import DONE, SSEDecoder, certificate_problem, content_of, tls_context
    from ansible.module_utils.revive_sse import _error_message as error_message
except ImportError:  # copied to a host as plain top-level files, next to revive_sse.py
    from revive_sse import DONE, SSEDecoder, certificate_problem, content_of, tls_context  # type: ignore[no-redef]
    from revive_sse import _error_message as error_message  # type: ignore[no-redef]

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
MAX_ERROR_BODY = 65536
LINE_LIMIT = 1 << 20            # as the StreamReader limit of _open: a longer line is not HTTP we read
clock = time.perf_counter


class URLError(ValueError):
    """A --url that is not http(s)://host[:port][/prefix]."""


@dataclass(frozen=True)
class Target:
    """One server: scheme, host, port and an optional path prefix (a front door may serve under one). An https
    server's certificate is verified against `ca_file` (PEM), or the system's trust store when it is empty."""
    scheme: str
    host: str
    port: int
    prefix: str = ""
    ca_file: str = ""

    @property
    def label(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.prefix}"


def parse_url(url: str) -> Target:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise URLError(f"{url!r}: the scheme must be http or https")
    if not parts.hostname:
        raise URLError(f"{url!r}: no host")
    try:
        port = parts.port
    except ValueError as exc:
        raise URLError(f"{url!r}: bad port ({exc})") from exc
    if parts.query or parts.fragment or parts.username:
        raise URLError(f"{url!r}: no query, fragment or user part expected")
    return Target(parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80),
                  parts.path.rstrip("/"))


# The header the front door names the answering server in (roles/frontdoor `frontdoor_served_by_header`'s default):
# review.py attributes each request to its replica by it.
SERVED_BY_HEADER = "x-revive-server"
# The header the front door reports the request's wait for a free server slot in, in milliseconds (HAProxy's %Tw;
# roles/frontdoor `frontdoor_queue_time_header`): metrics.py can judge the servers' latency without that wait.
QUEUE_TIME_HEADER = "x-revive-queue-ms"


@dataclass
class RequestRecord:
    """One request as the client saw it; `asdict` of it is a line of requests.jsonl."""
    index: int
    level: int
    target: str
    prompt_id: str
    max_tokens: int
    ignore_eos: bool
    scheduled: float = 0.0
    sent: float = 0.0
    first_byte: Optional[float] = None
    events: List[Tuple[float, int]] = field(default_factory=list)   # (time, tokens) per content event: a tuple,
    # not a list, so the garbage collector stops tracking it (a level holds ~10^5 of them; full collections that
    # walk every list stalled the event loop for tens of ms); requests.jsonl has it as [time, tokens] all the same
    ended: Optional[float] = None
    status: int = 0
    finish_reasons: List[Optional[str]] = field(default_factory=list)
    done: bool = False
    usage: Optional[Dict[str, Any]] = None
    usage_per_chunk: bool = False
    role_only_first: bool = False
    text_chars: int = 0
    error: Optional[str] = None
    ok: bool = False
    served_by: Optional[str] = None   # the front door's X-Revive-Server: which replica answered (fleet mode)
    queued_s: Optional[float] = None  # the front door's X-Revive-Queue-Ms / 1000: wall seconds it waited there

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def queue_seconds(value: Optional[str]) -> Optional[float]:
    """The front door's queue time header in seconds; None when absent or not a count of milliseconds (HAProxy
    logs -1 for a request that never reached a server, which then has no response from one either)."""
    try:
        millis = int(value) if value is not None else -1
    except ValueError:
        return None
    return millis / 1000.0 if millis >= 0 else None


def build_request(target: Target, kind: str, body: Dict[str, Any], api_key: str = "") -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    host = target.host if ":" not in target.host else f"[{target.host}]"
    lines = [f"POST {target.prefix}{PATHS[kind]} HTTP/1.1", f"Host: {host}:{target.port}",
             "Content-Type: application/json", "Accept: text/event-stream", f"Content-Length: {len(payload)}",
             "Connection: close", "User-Agent: revive-bench"]
    if api_key:
        lines.append(f"Authorization: Bearer {api_key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


def request_body(kind: str, model: str, prompt: Any, max_tokens: int, ignore_eos: bool, include_usage: bool,
                 seed: Optional[int] = None) -> Dict[str, Any]:
    """The JSON body: `prompt` is text (completions) or a message list (chat)."""
    body: Dict[str, Any] = {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0.0}
    body["messages" if kind == "chat" else "prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if seed is not None:
        body["seed"] = seed
    return body


async def _open(target: Target, connect_timeout: float) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    context = tls_context(target.ca_file) if target.scheme == "https" else None
    return await asyncio.wait_for(asyncio.open_connection(target.host, target.port, ssl=context,
                                                          limit=1 << 20), connect_timeout)


async def _read_head(reader: asyncio.StreamReader) -> Tuple[int, Dict[str, str]]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the server closed the connection before answering")
    parts = status_line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {status_line[:80]!r}")
    headers: Dict[str, str] = {}
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("the connection was cut inside the response headers")
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


def _chunk_size(line: bytes) -> int:
    return int(line.split(b";")[0].strip() or b"0", 16)


async def _chunked_pieces(reader: asyncio.StreamReader):
    """A chunked body's data, decoded from whatever the socket has delivered: the payloads of every complete chunk
    in one read come out as one piece (one reader call per read, not two per chunk: at thousands of tokens a
    second, one SSE event per chunk, the per-chunk readline/readexactly were a large part of the client's cost).
    The errors are those of the StreamReader calls it replaces, raised after the data before them."""
    buffer, pos, trailers = bytearray(), 0, False
    while True:
        data = await reader.read(65536)
        if data:
            if pos:
                del buffer[:pos]
                pos = 0
            buffer += data
        pieces: List[bytes] = []
        error: Optional[Exception] = None
        while True:
            eol = buffer.find(b"\n", pos)
            if eol < 0:
                if len(buffer) - pos > LINE_LIMIT:
                    error = ValueError(f"a chunked-body line of more than {LINE_LIMIT} bytes")
                elif not data and not trailers:
                    error = ConnectionError("the connection was cut inside the chunked body")
                break
            if trailers:
                if eol - pos <= 1 and buffer[pos:eol] in (b"", b"\r"):
                    break
                pos = eol + 1
                continue
            try:
                size = _chunk_size(buffer[pos:eol + 1])
            except ValueError as exc:
                error = exc
                break
            if size == 0:
                trailers, pos = True, eol + 1
                continue
            end = eol + 1 + size + 2
            if len(buffer) < end:
                if not data:   # the body ends inside a chunk: asyncio's own error, as readexactly raises it
                    error = asyncio.IncompleteReadError(bytes(buffer[eol + 1:]), size + 2)
                break
            pieces.append(buffer[eol + 1:end - 2])
            pos = end
        if pieces:
            yield b"".join(pieces)
        if error is not None:
            raise error
        if trailers and (eol >= 0 or not data):
            return         # the blank line after the trailers, or the body's end among them: the answer is whole


def body_pieces(reader: asyncio.StreamReader, headers: Dict[str, str]):
    """The body's bytes as they arrive (an async iterator): chunked, Content-Length or close-delimited; a cut body
    raises ConnectionError (asyncio's IncompleteReadError is one)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _chunked_pieces(reader)
    if "content-length" in headers:
        return _length_pieces(reader, int(headers["content-length"]))
    return _close_pieces(reader)


async def _length_pieces(reader: asyncio.StreamReader, left: int):
    while left > 0:
        data = await reader.read(min(left, 65536))
        if not data:
            raise ConnectionError(f"the connection was cut with {left} body bytes missing")
        left -= len(data)
        yield data


async def _close_pieces(reader: asyncio.StreamReader):
    while True:
        data = await reader.read(65536)
        if not data:
            return
        yield data


async def fetch(target: Target, method: str, path: str, api_key: str = "", body: Optional[bytes] = None,
                timeout: float = 10.0) -> Tuple[int, Dict[str, str], bytes]:
    """A plain request (the probe's GETs); raises OSError/asyncio.TimeoutError/ValueError when there is no answer."""
    async def run() -> Tuple[int, Dict[str, str], bytes]:
        reader, writer = await _open(target, timeout)
        try:
            lines = [f"{method} {target.prefix}{path} HTTP/1.1", f"Host: {target.host}:{target.port}",
                     "Accept: application/json", "Connection: close", "User-Agent: revive-bench"]
            if api_key:
                lines.append(f"Authorization: Bearer {api_key}")
            if body is not None:
                lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
            await writer.drain()
            status, headers = await _read_head(reader)
            data = b""
            async for piece in body_pieces(reader, headers):
                data += piece
                if len(data) > MAX_ERROR_BODY * 16:
                    break
            return status, headers, data
        finally:
            writer.close()
    return await asyncio.wait_for(run(), timeout)


def _take_event(record: RequestRecord, kind: str, event: str, now: float, state: Dict[str, Any]) -> None:
    """Fold one SSE event into the record (state: reasons per choice, last running usage, first event seen)."""
    if event == DONE:
        record.done = True
        return
    if record.done:
        state["problems"].append("data after data: [DONE]")
        return
    try:
        chunk = json.loads(event)
    except ValueError:
        state["problems"].append(f"an event is not JSON: {event[:120]!r}")
        return
    if not isinstance(chunk, dict):
        state["problems"].append(f"an event is not a JSON object: {event[:120]!r}")
        return
    if chunk.get("object") == "error" or "error" in chunk:
        state["problems"].append(f"error event in the stream: {error_message(event.encode())}")
        return
    choices = chunk.get("choices") or []
    if not state["seen"]:
        state["seen"] = True
        delta = (choices[0].get("delta") or {}) if choices else {}
        record.role_only_first = bool(delta.get("role")) and not delta.get("content")
    for choice in choices:
        index = int(choice.get("index") or 0)
        state["reasons"].setdefault(index, None)
        if choice.get("finish_reason") is not None:
            state["reasons"][index] = choice["finish_reason"]
    usage = chunk.get("usage")
    completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(usage, dict):
        record.usage = usage
        if choices:
            record.usage_per_chunk = True
    text = content_of(kind, chunk)
    if text:
        tokens = 1
        if choices and isinstance(completion, int):
            tokens = max(completion - state["running"], 0)
            state["running"] = completion
        record.events.append((now, tokens))
        record.text_chars += len(text)


def classify(record: RequestRecord, expect_done: bool) -> Optional[str]:
    """Why the request is not a complete answer; None when it is one."""
    if record.error:
        return record.error
    if record.status != 200:
        return f"HTTP {record.status}"
    if not record.finish_reasons or any(reason is None for reason in record.finish_reasons):
        return "no finish_reason for every choice"
    if expect_done and not record.done:
        return "the stream ended without data: [DONE] (the probe saw this server send it)"
    if not record.events:
        return "no content event (TTFT undefined)"
    return None


async def stream_request(target: Target, kind: str, payload: bytes, record: RequestRecord, timeout: float,
                         connect_timeout: float, expect_done: bool) -> RequestRecord:
    """Send one streaming request and read it to its end, within `timeout` seconds in all; never raises for what
    the server or the network does."""
    state: Dict[str, Any] = {"reasons": {}, "running": 0, "seen": False, "problems": []}

    async def run() -> None:
        reader, writer = await _open(target, connect_timeout)
        try:
            writer.write(payload)
            await writer.drain()
            record.status, headers = await _read_head(reader)
            record.first_byte = clock()
            record.served_by = headers.get(SERVED_BY_HEADER)
            record.queued_s = queue_seconds(headers.get(QUEUE_TIME_HEADER))
            if record.status != 200:
                data = b""
                async for piece in body_pieces(reader, headers):
                    data += piece
                    if len(data) > MAX_ERROR_BODY:
                        break
                state["problems"].append(f"HTTP {record.status}: {error_message(data)}")
                return
            content_type = headers.get("content-type", "")
            if not content_type.startswith("text/event-stream"):
                state["problems"].append(f"HTTP 200 but Content-Type {content_type!r}, not text/event-stream")
                return
            decoder = SSEDecoder()
            async for piece in body_pieces(reader, headers):
                now = clock()
                for event in decoder.feed(piece):
                    _take_event(record, kind, event, now, state)
            for event in decoder.close():
                _take_event(record, kind, event, clock(), state)
        finally:
            writer.close()

    record.sent = clock()
    try:
        await asyncio.wait_for(run(), timeout)
    except asyncio.TimeoutError:
        state["problems"].append(f"timeout: no complete answer within {timeout:g} s")
    except ConnectionRefusedError as exc:
        state["problems"].append(f"connection refused by {target.label}: {exc}")
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        where = "before the response" if not record.status else f"after {len(record.events)} content events"
        state["problems"].append(f"connection cut {where}: {type(exc).__name__}: {exc}")
    except ssl.SSLCertVerificationError as exc:
        state["problems"].append(certificate_problem(target.label, target.ca_file, exc))
    except (OSError, ValueError) as exc:
        state["problems"].append(f"{type(exc).__name__} talking to {target.label}: {exc}")
    record.ended = clock()
    record.finish_reasons = [state["reasons"][index] for index in sorted(state["reasons"])]
    record.error = "; ".join(state["problems"]) or None
    record.error = classify(record, expect_done)
    record.ok = record.error is None
    return record
