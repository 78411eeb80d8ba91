"""A streaming client for vLLM's OpenAI-compatible API (0.5.4): completions and chat over SSE, stdlib only.

Used by the warm-up (module_utils/revive_warmup.py, on the node with the system python3) and by the lab's
load client on the bench host (lab/loadgen/, which imports this file as plain `revive_sse`), so it imports
nothing outside the standard library and runs on Python 3.9+.

What counts as a good answer (every rule is one a client would notice, docs/facts/lb-and-rolling.md §4.1):
- HTTP 200 with `text/event-stream`; anything else fails with vLLM's error message when it sent one.
- The chunked body ends cleanly. A cut connection is a *truncated* stream: http.client's `readline` would
  hide it (its peek swallows IncompleteRead), so the body is read with `read1` (lab/vllm_twin/harness.py).
- `data: [DONE]` arrives, every choice has a `finish_reason`, no chunk is an error object (0.5.4 sends
  `data: {"object":"error",...}` when generation fails after the headers).
- The answer text is not empty, and with `stream_options.include_usage` the usage-only chunk arrives with
  prompt_tokens > 0, 0 < completion_tokens <= max_tokens and total = prompt + completion.

Timing (docs/facts/loadtest.md §3-§4): the clock starts before the connection is opened (as vLLM
0.5.4's own benchmark does, so connection set-up counts); TTFT is the first *content-bearing* event - the
chat role-only first chunk (`delta: {"role": ...}`) and usage-only chunks do not count; E2E ends at
`[DONE]`; TPOT = (last content event - first content event) / (completion_tokens - 1).

TLS (a front door that terminates it with the operator's certificate, docs/tls.md §5): the certificate and the host
name are always verified, against the operator's CA file when one is given, else the system's trust store; the
name checked is the endpoint's host, so an IP address is matched against the certificate's IP SANs.
"""
from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

KINDS = ("completions", "chat")
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
DONE = "[DONE]"
ERROR_EXCERPT = 300


@dataclass
class Endpoint:
    """Where the server listens. `timeout` is the socket inactivity limit, not a limit on the whole answer.
    `ca_file` (PEM, one or more CA certificates) verifies a `tls` endpoint; empty: the system's trust store."""
    host: str
    port: int
    api_key: str = ""
    timeout: float = 120.0
    tls: bool = False
    ca_file: str = ""

    def label(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"


@dataclass
class StreamRequest:
    kind: str                      # completions | chat
    model: str                     # the served model name
    prompt: str = ""               # completions
    messages: List[Dict[str, str]] = field(default_factory=list)   # chat
    max_tokens: int = 128
    temperature: float = 0.7
    include_usage: bool = True
    extra: Dict[str, Any] = field(default_factory=dict)           # further body fields (seed, top_p, ...)

    def body(self) -> Dict[str, Any]:
        if self.kind not in KINDS:
            raise ValueError(f"request kind {self.kind!r} is not one of {', '.join(KINDS)}")
        body: Dict[str, Any] = {"model": self.model, "stream": True, "max_tokens": self.max_tokens,
                                "temperature": self.temperature}
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        if self.kind == "chat":
            body["messages"] = self.messages
        else:
            body["prompt"] = self.prompt
        body.update(self.extra)
        return body


@dataclass
class StreamResult:
    """One streamed request as the client saw it. `ok` is True only when `problems` is empty."""
    ok: bool = False
    status: int = 0
    problems: List[str] = field(default_factory=list)
    text: str = ""
    finish_reasons: List[Optional[str]] = field(default_factory=list)
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    total_tokens: Optional[int] = None
    done: bool = False             # saw data: [DONE]
    truncated: bool = False        # the connection was cut inside the body (or before any answer)
    content_events: int = 0
    headers_s: Optional[float] = None
    ttft_s: Optional[float] = None
    tpot_s: Optional[float] = None
    e2e_s: Optional[float] = None
    response_id: str = ""
    headers: Dict[str, str] = field(default_factory=dict)

    def error(self) -> str:
        return "; ".join(self.problems)

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


class SSEDecoder:
    """Incremental text/event-stream decoder (WHATWG HTML "Server-sent events", the parts vLLM uses).

    Bytes in, complete events' `data` out: lines end with LF, CRLF or CR; several `data:` lines of one event
    join with LF; comment lines (`:`) and other fields are ignored; an event ends at a blank line.
    """

    def __init__(self) -> None:
        self._pending = b""
        self._data: List[str] = []
        self._cr_last = False

    def feed(self, chunk: bytes) -> List[str]:
        if self._cr_last and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF split across two reads
        self._cr_last = chunk.endswith(b"\r")
        buffer = (self._pending + chunk).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, self._pending = buffer.split(b"\n")
        events: List[str] = []
        for raw in lines:
            line = raw.decode("utf-8", errors="replace")
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "data":
                self._data.append(value)
        return events

    def close(self) -> List[str]:
        """Events left when the body ended; an event without its blank line is still delivered."""
        events = self.feed(b"\n\n") if (self._pending or self._data) else []
        return events


def content_of(kind: str, chunk: Dict[str, Any]) -> str:
    """The text a chunk adds: `choices[].text` (completions) or `choices[].delta.content` (chat).

    A chat role-only chunk (`delta: {"role": "assistant"}`) and a usage-only chunk (`choices: []`) add ''.
    """
    parts = []
    for choice in chunk.get("choices") or []:
        if kind == "chat":
            delta = choice.get("delta") or {}
            parts.append(delta.get("content") or "")
        else:
            parts.append(choice.get("text") or "")
    return "".join(parts)


def _error_message(body: bytes) -> str:
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:ERROR_EXCERPT] or "(empty body)"
    if isinstance(data, dict):
        if isinstance(data.get("error"), dict):
            data = data["error"]
        if data.get("message"):
            return str(data["message"])[:ERROR_EXCERPT]
    return text[:ERROR_EXCERPT]


def check(result: StreamResult, request: StreamRequest) -> List[str]:
    """The module docstring's rules, applied to a finished stream; [] when the answer is good."""
    problems: List[str] = []
    if not result.done:
        problems.append("the stream ended without data: [DONE]")
    if not result.finish_reasons or any(reason is None for reason in result.finish_reasons):
        problems.append("no finish_reason for every choice")
    if not result.text.strip():
        problems.append("the answer text is empty")
    if request.include_usage:
        if result.completion_tokens is None or result.prompt_tokens is None:
            problems.append("no usage chunk (stream_options.include_usage was asked for)")
        else:
            if result.prompt_tokens <= 0:
                problems.append(f"usage.prompt_tokens is {result.prompt_tokens}")
            if not 0 < result.completion_tokens <= request.max_tokens:
                problems.append(f"usage.completion_tokens is {result.completion_tokens}, outside 1..{request.max_tokens}")
            if result.total_tokens != result.prompt_tokens + result.completion_tokens:
                problems.append(f"usage.total_tokens {result.total_tokens} != prompt {result.prompt_tokens} + "
                                f"completion {result.completion_tokens}")
    return problems


class CAFileError(ValueError):
    """A CA file that cannot be read or holds no PEM certificate: the message names the file."""


def tls_context(ca_file: str = "") -> ssl.SSLContext:
    """The client side of every https connection: certificate and host name verified (never switched off), against
    `ca_file` when given, else the system's trust store. Callers check a CA file with it before the first request."""
    try:
        return ssl.create_default_context(cafile=ca_file or None)
    except ssl.SSLError as exc:  # before OSError, which it is: the file was read but holds no certificate
        raise CAFileError(f"CA file {ca_file}: no PEM certificate could be loaded from it "
                          f"({exc.reason or exc})") from None
    except OSError as exc:
        raise CAFileError(f"CA file {ca_file}: {exc.strerror or exc}") from None


def certificate_problem(label: str, ca_file: str, error: ssl.SSLCertVerificationError) -> str:
    """A failed answer's words for a certificate the client refused, naming what it was checked against."""
    return (f"TLS: the certificate of {label} is not trusted by "
            f"{f'CA file {ca_file}' if ca_file else 'the system trust store'}: {error.verify_message or error}")


ConnectionFactory = Callable[[Endpoint], http.client.HTTPConnection]


def connect(endpoint: Endpoint) -> http.client.HTTPConnection:
    """A connection, not yet opened; raises CAFileError for a bad `ca_file` (a set-up error, not a failed answer)."""
    if endpoint.tls:
        return http.client.HTTPSConnection(endpoint.host, endpoint.port, timeout=endpoint.timeout,
                                           context=tls_context(endpoint.ca_file))
    return http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=endpoint.timeout)


def headers_for(endpoint: Endpoint, content_type: bool) -> Dict[str, str]:
    headers = {"Accept": "text/event-stream" if content_type else "application/json",
               # One request per connection: the server's 5 s keep-alive can never race a reuse here.
               "Connection": "close"}
    if content_type:
        headers["Content-Type"] = "application/json"
    if endpoint.api_key:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    return headers


def stream(endpoint: Endpoint, request: StreamRequest, clock: Callable[[], float] = time.perf_counter,
           connection_factory: ConnectionFactory = connect) -> StreamResult:
    """Send one streaming request and read it to the end; never raises for what the server or network does."""
    result = StreamResult()
    payload = json.dumps(request.body()).encode()
    started = clock()
    first_content: Optional[float] = None
    last_content: Optional[float] = None
    connection = connection_factory(endpoint)
    try:
        connection.request("POST", PATHS[request.kind], body=payload, headers=headers_for(endpoint, True))
        response = connection.getresponse()
        result.status = response.status
        result.headers_s = clock() - started
        result.headers = {name.lower(): value for name, value in response.getheaders()}
        if response.status != 200:
            result.problems.append(f"HTTP {response.status} from {endpoint.label()}{PATHS[request.kind]}: "
                                   f"{_error_message(response.read())}")
            return result
        content_type = result.headers.get("content-type", "")
        if not content_type.startswith("text/event-stream"):
            result.problems.append(f"HTTP 200 but Content-Type {content_type!r}, not text/event-stream: "
                                   f"{_error_message(response.read())}")
            return result
        decoder = SSEDecoder()
        reasons: Dict[int, Optional[str]] = {}
        texts: List[str] = []
        while True:
            data = response.read1(65536)
            events = decoder.feed(data) if data else decoder.close()
            now = clock()
            for event in events:
                if event == DONE:
                    result.done = True
                    result.e2e_s = now - started
                    continue
                if result.done:
                    result.problems.append("data after data: [DONE]")
                    continue
                try:
                    chunk = json.loads(event)
                except ValueError:
                    result.problems.append(f"an event is not JSON: {event[:ERROR_EXCERPT]!r}")
                    continue
                if not isinstance(chunk, dict):
                    result.problems.append(f"an event is not a JSON object: {event[:ERROR_EXCERPT]!r}")
                    continue
                if chunk.get("object") == "error" or "error" in chunk:
                    result.problems.append(f"error event in the stream: {_error_message(event.encode())}")
                    continue
                result.response_id = result.response_id or str(chunk.get("id") or "")
                for choice in chunk.get("choices") or []:
                    index = int(choice.get("index") or 0)
                    reasons.setdefault(index, None)
                    if choice.get("finish_reason") is not None:
                        reasons[index] = choice["finish_reason"]
                text = content_of(request.kind, chunk)
                if text:
                    texts.append(text)
                    result.content_events += 1
                    if first_content is None:
                        first_content = now
                    last_content = now
                usage = chunk.get("usage")
                if isinstance(usage, dict) and not chunk.get("choices"):
                    result.prompt_tokens = usage.get("prompt_tokens")
                    result.completion_tokens = usage.get("completion_tokens")
                    result.total_tokens = usage.get("total_tokens")
            if not data:
                break
        result.text = "".join(texts)
        result.finish_reasons = [reasons[index] for index in sorted(reasons)]
    except (http.client.IncompleteRead, http.client.RemoteDisconnected, ConnectionError) as error:
        result.truncated = True
        where = "before the response" if not result.status else f"after {result.content_events} content events"
        result.problems.append(f"connection cut {where}: {type(error).__name__}: {error}")
    except socket.timeout as error:
        result.truncated = True
        result.problems.append(f"no data for {endpoint.timeout:g} s from {endpoint.label()}: {error}")
    except ssl.SSLCertVerificationError as error:
        result.problems.append(certificate_problem(endpoint.label(), endpoint.ca_file, error))
    except (OSError, http.client.HTTPException) as error:
        result.truncated = bool(result.status)
        result.problems.append(f"{type(error).__name__} talking to {endpoint.label()}: {error}")
    finally:
        connection.close()
    if first_content is not None:
        result.ttft_s = first_content - started
        if last_content is not None and (result.completion_tokens or 0) > 1:
            result.tpot_s = (last_content - first_content) / (result.completion_tokens - 1)
    if not result.problems:
        result.problems = check(result, request)
    result.ok = not result.problems
    return result


def get(endpoint: Endpoint, path: str,
        connection_factory: ConnectionFactory = connect) -> Tuple[int, bytes]:
    """GET path; (status, body). Raises OSError/HTTPException when there is no answer."""
    connection = connection_factory(endpoint)
    try:
        connection.request("GET", path, headers=headers_for(endpoint, False))
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def get_json(endpoint: Endpoint, path: str, connection_factory: ConnectionFactory = connect) -> Any:
    """GET path and decode its JSON; raises ValueError with vLLM's message on a non-200 answer."""
    status, body = get(endpoint, path, connection_factory)
    if status != 200:
        raise ValueError(f"HTTP {status} from {endpoint.label()}{path}: {_error_message(body)}")
    return json.loads(body.decode("utf-8"))


def parse_prometheus(text: str) -> Dict[str, float]:
    """Prometheus text exposition -> {'name{label="v",...}': value}; also the sum over labels under 'name'."""
    samples: Dict[str, float] = {}
    sums: Dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if "}" in value or not series:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        samples[series] = number
        name = series.split("{", 1)[0]
        if "{" in series:
            sums[name] = sums.get(name, 0.0) + number
    for name, total in sums.items():
        samples.setdefault(name, total)
    return samples
