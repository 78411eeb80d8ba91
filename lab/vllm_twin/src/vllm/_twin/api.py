"""The OpenAI-compatible API of vLLM 0.5.4 over the twin's engine.

Routes, JSON and SSE shapes, ids, errors and auth follow v0.5.4 api_server.py, serving_chat.py,
serving_completion.py, serving_engine.py and protocol.py (docs/facts/vllm-volta.md §5):
* `chat-<hex>` / `cmpl-<hex>` ids; chat streams start with a role-only chunk sent with the first token
  (after prefill), chunks use exclude_unset (chat) or carry every field (completions), the last chunk
  has finish_reason and stop_reason, `stream_options.include_usage` puts a running usage on every chunk
  (0.5.4's continuous_usage_stats=True default) and a usage-only chunk before `data: [DONE]`;
* flat error objects `{"object":"error","message",...,"code"}`; 404 for an unknown model; 400 for a
  prompt over max-model-len with 0.5.4's wording; 401 `{"error": "Unauthorized"}` on /v1 without the
  key (--api-key or VLLM_API_KEY); pydantic-style 400s for bad bodies (max_completion_tokens included);
* /health (empty 200; 500 once the engine is dead), /v1/models, /version, /metrics, /tokenize,
  /detokenize.
Logprobs are not simulated: requests asking for them get `"logprobs": null`.

0.8.5.post1 (vllm/_twin/release.py) differs where the lab can see it: `chatcmpl-` ids, the fields its
protocol.py added (reasoning_content, prompt_logprobs, usage.prompt_tokens_details), a first chat delta with
`"content": ""`, its request log, /ping and /load, and a dead engine ending streams with an error event
and [DONE] instead of cutting them (each cited at the code).
"""
from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
import zlib
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Callable, Dict, List, Optional, Tuple

from vllm._twin import metrics as metrics_mod
from vllm._twin import tokens, vlog
from vllm._twin.engine import EngineDeadError, SamplingParams, SequenceGroup, TokenEvent
from vllm._twin.http import Exchange
from vllm._twin.release import current, pick
from vllm._twin.runner import Runner
from vllm._twin.settings import Settings
from vllm._twin.validation import (DETOKENIZE_FIELDS, TOKENIZE_CHAT_FIELDS, TOKENIZE_COMPLETION_FIELDS,
                                   ValidationFailed, chat_request, completion_request, parse_json_body, validate)

JSON = "application/json"
SSE = "text/event-stream; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SAMPLING_EPS = 1e-5


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400) -> Dict[str, Any]:
    """ErrorResponse.model_dump() (protocol.py:41-46)."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


class RequestError(Exception):
    def __init__(self, message: str, err_type: str = "BadRequestError", code: int = 400):
        super().__init__(message)
        self.body = error_body(message, err_type, code)
        self.code = code


@dataclass
class ApiConfig:
    served_model_names: List[str]
    max_model_len: int
    response_role: str
    api_key: Optional[str]
    root_path: str
    log_requests: bool
    max_log_len: Optional[int]
    vllm_metrics: bool
    max_logprobs: int
    allowed_origins: List[str]
    allow_credentials: bool
    allowed_methods: List[str]
    allowed_headers: List[str]
    # 0.8.5.post1's default mode: /metrics is the PROMETHEUS_MULTIPROC_DIR registry (metrics.py)
    multiprocess_metrics: bool = False


@dataclass
class Faults:
    """Request-level fault knobs (settings.py): errors and crash after N requests."""

    settings: Settings
    received: int = 0
    completed: int = 0
    rng: random.Random = field(default_factory=random.Random)
    crash: Optional[Callable[[str], None]] = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.settings.seed)

    def on_request(self) -> Optional[str]:
        """Count a completion request; the error message if a knob fails it."""
        self.received += 1
        s = self.settings
        if s.errors_after_requests is not None and self.received > s.errors_after_requests:
            return (f"[twin fault VLLM_SIM_FAULT_ERRORS_AFTER={s.errors_after_requests}] simulated engine error on "
                    f"request {self.received}")
        if s.error_rate and self.rng.random() < s.error_rate:
            return f"[twin fault VLLM_SIM_FAULT_ERROR_RATE={s.error_rate}] simulated engine error"
        return None

    def on_complete(self) -> None:
        self.completed += 1
        limit = self.settings.crash_after_requests
        if limit is not None and self.completed >= limit and self.crash is not None:
            self.crash(f"VLLM_SIM_FAULT_CRASH_AFTER_REQUESTS={limit}: {self.completed} requests completed")


class Stream:
    """An open streaming response: how the engine's tokens reach one client."""

    def __init__(self, exchange: Exchange, chat: bool = False):
        self.exchange = exchange
        self.chat = chat
        self.done = asyncio.get_running_loop().create_future()

    def send(self, text: str) -> None:
        self.exchange.send_chunk(text.encode())

    def finish(self) -> None:
        self.exchange.send_chunk(b"data: [DONE]\n\n")
        self.exchange.end_stream()
        if not self.done.done():
            self.done.set_result("finished")

    def cut(self) -> None:
        self.exchange.cut_stream()
        if not self.done.done():
            self.done.set_result("cut")

    def fail(self, message: str) -> None:
        """0.8.5.post1's stream generators catch the engine's error: an error event, then [DONE]
        (v0.8.5.post1:vllm/entrypoints/openai/serving_chat.py:883-889, serving_completion.py:388-392)."""
        if self.done.done():
            return
        self.exchange.send_chunk(f"data: {json.dumps({'error': error_body(message)})}\n\n".encode())
        self.finish()


class OpenAIApp:
    def __init__(self, config: ApiConfig, runner: Runner, settings: Settings, version_info: Dict[str, Any],
                 start_time: float, frontend_multiprocessing: bool):
        self.config = config
        self.runner = runner
        self.settings = settings
        self.version_info = version_info
        self.start_time = start_time
        self.frontend_multiprocessing = frontend_multiprocessing
        self.faults = Faults(settings)
        self.streams: Dict[str, Stream] = {}
        self.waiters: Dict[str, asyncio.Future] = {}
        self.model_created = int(time.time())
        self.legacy = current().legacy
        self.chat_id_prefix = current().behaviour.chat_id_prefix
        self.stalled = False             # 0.8.5.post1 after SIGTERM: nothing is delivered any more
        self.engine_error_exit = False   # 0.8.5.post1: a dead engine stopped the server
        self.on_engine_error: Optional[Callable[[], None]] = None
        runner.on_dead = self._engine_died

    # --- engine death: 0.5.4 cuts every open stream; 0.8.5.post1 ends them with an error event ------------
    def _engine_died(self, reason: str) -> None:
        if self.legacy:
            vlog.error("async_llm_engine.py:56", f"Engine background task failed: {reason}")
            for stream in list(self.streams.values()):
                stream.cut()
        else:
            message = self.dead_message(reason)
            for stream in {id(s): s for s in self.streams.values()}.values():
                if stream.chat:  # serving_chat.py:884 logs it (with the traceback); completions do not
                    vlog.error("serving_chat.py:884", "Error in chat completion stream generator.")
                stream.fail(message)
        self.streams.clear()
        for waiter in list(self.waiters.values()):
            if not waiter.done():
                waiter.set_exception(EngineDeadError(reason))
        self.waiters.clear()

    def dead_message(self, reason: str) -> str:
        """What a request of a dead engine fails with: MQEngineDeadError in the default mode
        (v0.8.5.post1:vllm/engine/multiprocessing/__init__.py:174-183), the engine's own error in-process."""
        if self.frontend_multiprocessing:
            return ("Engine loop is not running. Inspect the stacktrace to find the original error: "
                    f"RuntimeError({reason!r}).")
        return reason

    def _server_error(self, exchange: Exchange, extra) -> None:
        """500 for a request of a dead engine: FastAPI's text in 0.5.4; 0.8.5.post1's exception handler
        answers an empty 500 and stops the server (v0.8.5.post1:vllm/entrypoints/launcher.py:111-146)."""
        if self.legacy:
            exchange.respond(500, b"Internal Server Error", TEXT, extra)
            return
        exchange.respond(500, b"", None, extra)
        if self.on_engine_error is not None:
            asyncio.get_running_loop().call_soon(self.on_engine_error)

    def stall_all(self) -> None:
        self.stalled = True

    def cut_all(self) -> None:
        for stream in list(self.streams.values()):
            stream.cut()
        self.streams.clear()

    # --- dispatch -----------------------------------------------------------------------------
    async def __call__(self, exchange: Exchange) -> None:
        request = exchange.request
        root = self.config.root_path or ""
        path = request.path
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        cors = self._cors_headers(request)
        if request.method == "OPTIONS" and "access-control-request-method" in request.headers and cors is not None:
            exchange.respond(200, b"OK", TEXT, cors + [
                ("access-control-allow-methods", ", ".join(self._methods())),
                ("access-control-max-age", "600"),
                ("access-control-allow-headers", request.headers.get("access-control-request-headers", "*")
                 if "*" in self.config.allowed_headers else ", ".join(self.config.allowed_headers))])
            return
        extra = cors or []
        if self.config.api_key and request.method != "OPTIONS" and request.path.startswith(f"{root}/v1"):
            if request.headers.get("authorization") != "Bearer " + self.config.api_key:
                exchange.respond(401, dumps({"error": "Unauthorized"}).encode(), JSON, extra)
                return
        routes = {
            "/health": ("GET", self.health), "/v1/models": ("GET", self.models), "/version": ("GET", self.version),
            "/v1/chat/completions": ("POST", self.chat), "/v1/completions": ("POST", self.completions),
            "/tokenize": ("POST", self.tokenize), "/detokenize": ("POST", self.detokenize),
            "/v1/embeddings": ("POST", self.embeddings),
        }
        service = {"/ping": ("GET", self.health), "/load": ("GET", self.load)}
        routes.update({path: service[path] for path in current().behaviour.service_routes})
        if path == "/metrics" or path.startswith("/metrics/"):
            exchange.respond(200, metrics_mod.render(self.start_time, self.runner.metrics if self.config.vllm_metrics
                                                     else None, self.config.multiprocess_metrics),
                             METRICS_TYPE, extra)
            return
        route = routes.get(path)
        if route is None:
            exchange.respond(404, dumps({"detail": "Not Found"}).encode(), JSON, extra)
            return
        method, handler = route
        if request.method != method and not (method == "GET" and request.method == "HEAD"):
            exchange.respond(405, dumps({"detail": "Method Not Allowed"}).encode(), JSON,
                             [("allow", method)] + extra)
            return
        await handler(exchange, extra)

    def _methods(self) -> List[str]:
        if "*" in self.config.allowed_methods:
            return ["DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"]
        return self.config.allowed_methods

    def _cors_headers(self, request) -> Optional[List[Tuple[str, str]]]:
        origin = request.headers.get("origin")
        if origin is None:
            return None
        if "*" in self.config.allowed_origins and not self.config.allow_credentials:
            return [("access-control-allow-origin", "*")]
        if "*" in self.config.allowed_origins or origin in self.config.allowed_origins:
            headers = [("access-control-allow-origin", origin), ("vary", "Origin")]
            if self.config.allow_credentials:
                headers.append(("access-control-allow-credentials", "true"))
            return headers
        return []

    def _json(self, exchange: Exchange, status: int, body: Any, extra) -> None:
        exchange.respond(status, dumps(body).encode(), JSON, extra)

    # --- simple routes ----------------------------------------------------------------------------
    async def health(self, exchange: Exchange, extra) -> None:
        if self.runner.dead:
            self._server_error(exchange, extra)
            return
        exchange.respond(200, b"", None, extra)

    async def load(self, exchange: Exchange, extra) -> None:
        """0.8.5.post1's /load: the request count it tracks only with --enable-server-load-tracking."""
        self._json(exchange, 200, {"server_load": 0}, extra)

    async def version(self, exchange: Exchange, extra) -> None:
        self._json(exchange, 200, self.version_info, extra)

    async def models(self, exchange: Exchange, extra) -> None:
        now = int(time.time())
        cards = []
        for name in self.config.served_model_names:
            cards.append({"id": name, "object": "model", "created": now, "owned_by": "vllm",
                          "root": self.config.served_model_names[0], "parent": None,
                          "max_model_len": self.config.max_model_len,
                          "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                          "created": now, "allow_create_engine": False, "allow_sampling": True,
                                          "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                          "allow_fine_tuning": False, "organization": "*", "group": None,
                                          "is_blocking": False}]})
        self._json(exchange, 200, {"object": "list", "data": cards}, extra)

    async def embeddings(self, exchange: Exchange, extra) -> None:
        # 0.5.4: a generation model in the RPC front end raises NotImplementedError -> FastAPI's 500.
        exchange.respond(500, b"Internal Server Error", TEXT, extra)

    def _body(self, exchange: Exchange) -> Any:
        return parse_json_body(exchange.request.body, exchange.request.headers.get("content-type", ""))

    def _check_model(self, model: str) -> None:
        if model not in self.config.served_model_names:
            raise RequestError(f"The model `{model}` does not exist.", "NotFoundError", HTTPStatus.NOT_FOUND.value)

    async def tokenize(self, exchange: Exchange, extra) -> None:
        try:
            body = self._body(exchange)
            if isinstance(body, dict) and "messages" in body:
                req = validate(body, TOKENIZE_CHAT_FIELDS, ["model", "messages"], [])
                self._check_model(req["model"])
                conversation = self._conversation(req["messages"])
                text = tokens.render_chat(conversation, req["add_generation_prompt"])
                count = tokens.chat_prompt_token_count(conversation, req["add_generation_prompt"])
                ids = [tokens.BOS_TOKEN_ID] + tokens.text_token_ids(text)
                ids = (ids + [tokens.FIRST_WORD_ID] * count)[:count]
            else:
                req = validate(body, TOKENIZE_COMPLETION_FIELDS, ["model", "prompt"], [])
                self._check_model(req["model"])
                ids = ([tokens.BOS_TOKEN_ID] if req["add_special_tokens"] else []) + tokens.text_token_ids(req["prompt"])
        except ValidationFailed as exc:
            self._json(exchange, 400, error_body(str(exc.errors)), extra)
            return
        except RequestError as exc:
            self._json(exchange, exc.code, exc.body, extra)
            return
        self._json(exchange, 200, {"count": len(ids), "max_model_len": self.config.max_model_len, "tokens": ids}, extra)

    async def detokenize(self, exchange: Exchange, extra) -> None:
        try:
            req = validate(self._body(exchange), DETOKENIZE_FIELDS, ["model", "tokens"], [])
            self._check_model(req["model"])
        except ValidationFailed as exc:
            self._json(exchange, 400, error_body(str(exc.errors)), extra)
            return
        except RequestError as exc:
            self._json(exchange, exc.code, exc.body, extra)
            return
        self._json(exchange, 200, {"prompt": tokens.decode_ids(req["tokens"]).lstrip()}, extra)

    # --- shared pieces of the two generation endpoints ---------------------------------------------
    @staticmethod
    def _conversation(messages: List[Dict[str, Any]]) -> List[Tuple[str, str]]:
        conversation = []
        for message in messages:
            content = message.get("content")
            if content is None:
                text = ""
            elif isinstance(content, str):
                text = content
            elif isinstance(content, list):
                parts = []
                for part in content:
                    kind = part.get("type") if isinstance(part, dict) else None
                    if kind != "text":
                        raise RequestError(f"Unknown part type: {kind}")
                    parts.append(str(part.get("text", "")))
                text = "\n".join(parts)
            else:
                raise RequestError(f"Invalid message content: {content!r}")
            conversation.append((str(message["role"]), text))
        return conversation

    def _validate_length(self, prompt_len: int, max_tokens: Optional[int]) -> None:
        """OpenAIServing._validate_input (serving_engine.py:256-276)."""
        limit = self.config.max_model_len
        if max_tokens is None:
            if prompt_len >= limit:
                raise RequestError(f"This model's maximum context length is {limit} tokens. However, you requested "
                                   f"{prompt_len} tokens in the messages, Please reduce the length of the messages.")
        elif prompt_len + max_tokens > limit:
            raise RequestError(f"This model's maximum context length is {limit} tokens. However, you requested "
                               f"{max_tokens + prompt_len} tokens ({prompt_len} in the messages, {max_tokens} in the "
                               "completion). Please reduce the length of the messages or completion.")

    def _sampling(self, req: Dict[str, Any], max_tokens: int, logprobs: Optional[int]) -> SamplingParams:
        """SamplingParams and its _verify_args (sampling_params.py:204-285)."""
        n = req.get("n") if req.get("n") is not None else 1
        best_of = req.get("best_of") if req.get("best_of") is not None else n
        temperature = req.get("temperature") if req.get("temperature") is not None else 1.0
        top_p = req.get("top_p") if req.get("top_p") is not None else 1.0
        presence = req.get("presence_penalty") or 0.0
        frequency = req.get("frequency_penalty") or 0.0
        stop = req.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        checks = [
            (n < 1, f"n must be at least 1, got {n}."),
            (best_of < n, f"best_of must be greater than or equal to n, got n={n} and best_of={best_of}."),
            (not -2.0 <= presence <= 2.0, f"presence_penalty must be in [-2, 2], got {presence}."),
            (not -2.0 <= frequency <= 2.0, f"frequency_penalty must be in [-2, 2], got {frequency}."),
            (not 0.0 < req["repetition_penalty"] <= 2.0,
             f"repetition_penalty must be in (0, 2], got {req['repetition_penalty']}."),
            (temperature < 0.0, f"temperature must be non-negative, got {temperature}."),
            (not 0.0 < top_p <= 1.0, f"top_p must be in (0, 1], got {top_p}."),
            (req["top_k"] < -1 or req["top_k"] == 0, f"top_k must be -1 (disable), or at least 1, got {req['top_k']}."),
            (not 0.0 <= req["min_p"] <= 1.0, f"min_p must be in [0, 1], got {req['min_p']}."),
            (max_tokens < 1, f"max_tokens must be at least 1, got {max_tokens}."),
            (req["min_tokens"] < 0, f"min_tokens must be greater than or equal to 0, got {req['min_tokens']}."),
            (req["min_tokens"] > max_tokens,
             f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {req['min_tokens']}."),
            (logprobs is not None and logprobs < 0, f"logprobs must be non-negative, got {logprobs}."),
            (any(not s for s in stop), "stop cannot contain an empty string."),
        ]
        for failed, message in checks:
            if failed:
                raise RequestError(message)
        if req["use_beam_search"]:
            raise RequestError("Beam search is not simulated by the vLLM twin.")
        if req["early_stopping"] is not False:
            raise RequestError("early_stopping is not effective and must be False when not using beam search.")
        if abs(req["length_penalty"] - 1.0) > SAMPLING_EPS:
            raise RequestError("length_penalty is not effective and must be the default value of 1.0 when not "
                               "using beam search.")
        if temperature < SAMPLING_EPS and best_of > 1:
            raise RequestError(f"best_of must be 1 when using greedy sampling.Got {best_of}.")
        if logprobs is not None and logprobs > self.config.max_logprobs:
            raise RequestError(f"Requested sample logprobs of {logprobs}, which is greater than max allowed: "
                               f"{self.config.max_logprobs}")
        return SamplingParams(n=n, best_of=best_of, max_tokens=max_tokens, min_tokens=req["min_tokens"],
                              ignore_eos=req["ignore_eos"], stop=tuple(stop),
                              stop_token_ids=tuple(req.get("stop_token_ids") or ()),
                              include_stop_str_in_output=req["include_stop_str_in_output"], temperature=temperature,
                              seed=req.get("seed"))

    def _usage(self, prompt: int, completion: int) -> Dict[str, Any]:
        """UsageInfo.model_dump() (0.8.5.post1 adds prompt_tokens_details, protocol.py:122-126)."""
        usage: Dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                                 "completion_tokens": completion}
        if not self.legacy:
            usage["prompt_tokens_details"] = None
        return usage

    def _log_request(self, request_id: str, prompt: str, prompt_len: int, params: SamplingParams) -> None:
        if not self.config.log_requests:
            return
        ids = tokens.text_token_ids(prompt)[:prompt_len]
        text = prompt
        if self.config.max_log_len is not None:
            text = text[:self.config.max_log_len]
            ids = ids[:self.config.max_log_len]
        if not self.legacy:
            # v0.8.5.post1:vllm/entrypoints/logger.py:39-44 with SamplingParams.__repr__ (sampling_params.py:559-584)
            vlog.info(current().source("received_request", "logger.py:39"), (
                f"Received request {request_id}: prompt: {text!r}, params: SamplingParams(n={params.n}, "
                f"presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
                f"temperature={params.temperature}, top_p=1.0, top_k=-1, min_p=0.0, seed={params.seed}, "
                f"stop={list(params.stop)}, stop_token_ids={list(params.stop_token_ids)}, bad_words=[], "
                f"include_stop_str_in_output={params.include_stop_str_in_output}, ignore_eos={params.ignore_eos}, "
                f"max_tokens={params.max_tokens}, min_tokens={params.min_tokens}, logprobs=None, "
                "prompt_logprobs=None, skip_special_tokens=True, spaces_between_special_tokens=True, "
                "truncate_prompt_tokens=None, guided_decoding=None, extra_args=None), "
                f"prompt_token_ids: {ids}, lora_request: None, prompt_adapter_request: None."))
            vlog.info(current().source("added_request", "engine.py:310") if self.frontend_multiprocessing
                      else "async_llm_engine.py:211",
                      f"Added request {request_id}.")
            return
        vlog.info("logger.py:36", (
            f"Received request {request_id}: prompt: {text!r}, params: SamplingParams(n={params.n}, "
            f"best_of={params.best_of}, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
            f"temperature={params.temperature}, top_p=1.0, top_k=-1, min_p=0.0, seed={params.seed}, "
            f"use_beam_search=False, length_penalty=1.0, early_stopping=False, stop={list(params.stop)}, "
            f"stop_token_ids={list(params.stop_token_ids)}, include_stop_str_in_output="
            f"{params.include_stop_str_in_output}, ignore_eos={params.ignore_eos}, max_tokens={params.max_tokens}, "
            f"min_tokens={params.min_tokens}, logprobs=None, prompt_logprobs=None, skip_special_tokens=True, "
            f"spaces_between_special_tokens=True, truncate_prompt_tokens=None), prompt_token_ids: {ids}, "
            "lora_request: None, prompt_adapter_request: None."))
        vlog.info("async_llm_engine.py:174", f"Added request {request_id}.")

    def _log_finished(self, request_id: str) -> None:
        # 0.8.5.post1 logs it only from the in-process AsyncLLMEngine (async_llm_engine.py:179)
        if self.config.log_requests and (self.legacy or not self.frontend_multiprocessing):
            vlog.info(pick("async_llm_engine.py:141", "async_llm_engine.py:179"), f"Finished request {request_id}.")

    def _fault(self) -> Optional[RequestError]:
        message = self.faults.on_request()
        if message is None:
            return None
        vlog.error("twin", message)
        return RequestError(message, "InternalServerError", 500)

    def _add(self, request_id: str, prompt_len: int, params: SamplingParams, sink, prompt_key: int) -> SequenceGroup:
        return self.runner.add(request_id, prompt_len, params, sink, prompt_key)

    async def _await_disconnect_or(self, exchange: Exchange, future: asyncio.Future) -> bool:
        """Wait for `future`; True if the client went away first."""
        waiter = asyncio.ensure_future(exchange.disconnected.wait())
        try:
            done, _ = await asyncio.wait({future, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        return future not in done

    # --- /v1/chat/completions ------------------------------------------------------------------
    async def chat(self, exchange: Exchange, extra) -> None:
        try:
            req = chat_request(self._body(exchange))
            self._check_model(req["model"])
            conversation = self._conversation(req["messages"])
            prompt_len = tokens.chat_prompt_token_count(conversation, req["add_generation_prompt"])
            prompt_text = tokens.render_chat(conversation, req["add_generation_prompt"])
            self._validate_length(prompt_len, req["max_tokens"])
            max_tokens = req["max_tokens"] if req["max_tokens"] is not None else self.config.max_model_len - prompt_len
            params = self._sampling(req, max_tokens, req["top_logprobs"] if req["logprobs"] else None)
            fault = self._fault()
            if fault is not None:
                raise fault
        except ValidationFailed as exc:
            self._json(exchange, 400, error_body(str(exc.errors)), extra)
            return
        except RequestError as exc:
            self._json(exchange, exc.code, exc.body, extra)
            return
        request_id = f"{self.chat_id_prefix}{uuid.uuid4().hex}"
        role = self.config.response_role if req["add_generation_prompt"] else conversation[-1][0]
        prompt_key = zlib.crc32(prompt_text.encode())
        self._log_request(request_id, prompt_text, prompt_len, params)
        if req["stream"]:
            await self._chat_stream(exchange, extra, req, request_id, role, prompt_len, params, prompt_key,
                                    conversation)
        else:
            await self._chat_full(exchange, extra, req, request_id, role, prompt_len, params, prompt_key,
                                  conversation)

    async def _chat_stream(self, exchange, extra, req, request_id, role, prompt_len, params, prompt_key,
                           conversation) -> None:
        model = self.config.served_model_names[0]
        created = int(time.time())
        options = req["stream_options"]
        include_usage = bool(options and options.get("include_usage"))
        continuous = bool(options and options.get("continuous_usage_stats"))
        head = f'{{"id":"{request_id}","object":"chat.completion.chunk","created":{created},"model":{dumps(model)},'
        exchange.start_stream(200, SSE, extra)
        stream = Stream(exchange, chat=True)
        state = {"first": True, "tokens": [0] * params.best_of, "sent": [False] * params.best_of}

        def usage(completion: int) -> str:
            if not include_usage:
                return ""
            if not continuous:
                return ',"usage":null'
            return (f',"usage":{{"prompt_tokens":{prompt_len},"total_tokens":{prompt_len + completion},'
                    f'"completion_tokens":{completion}}}')

        # 0.8.5.post1's first delta also carries content "" (serving_chat.py:504-511)
        first_content = "" if self.legacy else ',"content":""'

        def sink(group: SequenceGroup, events: List[TokenEvent]) -> None:
            out = []
            if state["first"]:
                state["first"] = False
                for i in range(params.n):
                    out.append(f'data: {head}"choices":[{{"index":{i},"delta":{{"role":{dumps(role)}'
                               f'{first_content}}},'
                               f'"logprobs":null,"finish_reason":null}}]{usage(0)}}}\n\n')
                if req["echo"] and conversation and conversation[-1][0] == role and conversation[-1][1]:
                    for i in range(params.n):
                        out.append(f'data: {head}"choices":[{{"index":{i},"delta":{{"content":'
                                   f'{dumps(conversation[-1][1])}}},"logprobs":null,"finish_reason":null}}]'
                                   f'{usage(0)}}}\n\n')
            for event in events:
                if event.index >= params.n or state["sent"][event.index]:
                    continue
                state["tokens"][event.index] = event.num_output_tokens
                if event.finish_reason is None:
                    out.append(f'data: {head}"choices":[{{"index":{event.index},"delta":{{"content":'
                               f'{dumps(event.delta_text)}}},"logprobs":null,"finish_reason":null}}]'
                               f'{usage(event.num_output_tokens)}}}\n\n')
                else:
                    state["sent"][event.index] = True
                    out.append(f'data: {head}"choices":[{{"index":{event.index},"delta":{{"content":'
                               f'{dumps(event.delta_text)}}},"logprobs":null,"finish_reason":'
                               f'{dumps(event.finish_reason)},"stop_reason":{dumps(event.stop_reason)}}}]'
                               f'{usage(event.num_output_tokens)}}}\n\n')
            if group.finished:
                if include_usage:
                    # 0.5.4 reports the last choice's completion tokens here (serving_chat.py:396-413)
                    last = state["tokens"][params.n - 1]
                    out.append(f'data: {head}"choices":[],"usage":{{"prompt_tokens":{prompt_len},"total_tokens":'
                               f'{prompt_len + last},"completion_tokens":{last}}}}}\n\n')
                stream.send("".join(out))
                self._request_done(request_id)
                stream.finish()
            elif out:
                stream.send("".join(out))

        await self._run_stream(exchange, request_id, prompt_len, params, prompt_key, sink, stream)

    async def _run_stream(self, exchange, request_id, prompt_len, params, prompt_key, sink, stream) -> None:
        try:
            self._add(request_id, prompt_len, params, sink, prompt_key)
        except EngineDeadError as exc:
            if self.legacy:
                stream.cut()  # 0.5.4: headers are out when the generator fails; the connection is cut
            else:
                stream.fail(self.dead_message(str(exc)))
            return
        self.streams[request_id] = stream
        gone = await self._await_disconnect_or(exchange, stream.done)
        self.streams.pop(request_id, None)
        if gone and not self.stalled:
            self.runner.abort(request_id)
            if self.config.log_requests:
                vlog.info(pick("async_llm_engine.py:181", current().source("aborted_request", "engine.py:330")
                               if self.frontend_multiprocessing else "async_llm_engine.py:223"),
                          f"Aborted request {request_id}.")

    def _request_done(self, request_id: str) -> None:
        self.streams.pop(request_id, None)
        self._log_finished(request_id)
        asyncio.get_running_loop().call_soon(self.faults.on_complete)

    async def _collect(self, exchange: Exchange, request_id: str, prompt_len: int, params: SamplingParams,
                       prompt_key: int) -> Optional[SequenceGroup]:
        """Run one request to the end; None if the client disconnected (0.5.4 then answers 400)."""
        future = asyncio.get_running_loop().create_future()

        def sink(group: SequenceGroup, events: List[TokenEvent]) -> None:
            if group.finished and not future.done():
                future.set_result(group)

        self._add(request_id, prompt_len, params, sink, prompt_key)
        self.waiters[request_id] = future
        gone = await self._await_disconnect_or(exchange, future)
        self.waiters.pop(request_id, None)
        if gone:
            self.runner.abort(request_id)
            return None
        return future.result()

    async def _chat_full(self, exchange, extra, req, request_id, role, prompt_len, params, prompt_key,
                         conversation) -> None:
        created = int(time.time())
        try:
            group = await self._collect(exchange, request_id, prompt_len, params, prompt_key)
        except EngineDeadError:
            self._server_error(exchange, extra)
            return
        if group is None:
            self._json(exchange, 400, error_body("Client disconnected"), extra)
            return
        self._log_finished(request_id)
        prefix = ""
        if req["echo"] and conversation and conversation[-1][0] == role and conversation[-1][1]:
            prefix = conversation[-1][1]
        choices = []
        for seq in group.seqs[:params.n]:
            message: Dict[str, Any] = {"role": role, "content": prefix + seq.text, "tool_calls": []}
            # ChatMessage (v0.8.5.post1:vllm/entrypoints/openai/protocol.py:1323-1327)
            if current().behaviour.reasoning_content:
                message = {"role": role, "reasoning_content": None, "content": prefix + seq.text, "tool_calls": []}
            choices.append({"index": seq.index, "message": message,
                            "logprobs": None, "finish_reason": seq.finish_reason, "stop_reason": seq.stop_reason})
        completion = sum(len(s.output_ids) for s in group.seqs[:params.n])
        body = {"id": request_id, "object": "chat.completion", "created": created,
                "model": self.config.served_model_names[0], "choices": choices,
                "usage": self._usage(prompt_len, completion)}
        if not self.legacy:
            body["prompt_logprobs"] = None  # protocol.py:1364
        if current().behaviour.kv_transfer_params:
            body["kv_transfer_params"] = None
        self._json(exchange, 200, body, extra)
        self.faults.on_complete()

    # --- /v1/completions -------------------------------------------------------------------------
    async def completions(self, exchange: Exchange, extra) -> None:
        try:
            req = completion_request(self._body(exchange))
            self._check_model(req["model"])
            if req["suffix"] is not None:
                raise RequestError("suffix is not currently supported")
            prompts = self._prompts(req)
            lengths = []
            for text, count in prompts:
                self._validate_length(count, req["max_tokens"])
                lengths.append(count)
            params_list = []
            for count in lengths:
                max_tokens = req["max_tokens"] if req["max_tokens"] is not None else self.config.max_model_len - count
                if req["echo"] and req["max_tokens"] == 0:
                    max_tokens = 1
                params_list.append(self._sampling(req, max_tokens, req["logprobs"]))
            fault = self._fault()
            if fault is not None:
                raise fault
        except ValidationFailed as exc:
            self._json(exchange, 400, error_body(str(exc.errors)), extra)
            return
        except RequestError as exc:
            self._json(exchange, exc.code, exc.body, extra)
            return
        request_id = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        stream = req["stream"] and (req["best_of"] is None or req["n"] == req["best_of"])
        for i, ((text, count), params) in enumerate(zip(prompts, params_list)):
            self._log_request(f"{request_id}-{i}", text, count, params)
        if stream:
            await self._completion_stream(exchange, extra, req, request_id, created, prompts, params_list)
        else:
            await self._completion_full(exchange, extra, req, request_id, created, prompts, params_list)

    def _prompts(self, req: Dict[str, Any]) -> List[Tuple[str, int]]:
        prompt = req["prompt"]
        special = 1 if req["add_special_tokens"] else 0
        if isinstance(prompt, str):
            return [(prompt, special + tokens.count_text_tokens(prompt))]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [(tokens.decode_ids(prompt), len(prompt))]
        out = []
        for item in prompt:
            if isinstance(item, str):
                out.append((item, special + tokens.count_text_tokens(item)))
            else:
                out.append((tokens.decode_ids(item), len(item)))
        return out

    async def _completion_stream(self, exchange, extra, req, request_id, created, prompts, params_list) -> None:
        model = self.config.served_model_names[0]
        head = f'{{"id":"{request_id}","object":"text_completion","created":{created},"model":{dumps(model)},'
        options = req["stream_options"]
        include_usage = bool(options and options.get("include_usage"))
        continuous = bool(options and options.get("continuous_usage_stats"))
        n = params_list[0].n
        exchange.start_stream(200, SSE, extra)
        stream = Stream(exchange)
        remaining = {"count": len(prompts), "usage": None}
        echo_pending = [bool(req["echo"])] * (len(prompts) * n)
        request_ids = [f"{request_id}-{i}" for i in range(len(prompts))]

        def make_sink(prompt_index: int, prompt_text: str, prompt_len: int):
            def sink(group: SequenceGroup, events: List[TokenEvent]) -> None:
                out = []
                for event in events:
                    if event.index >= n:
                        continue
                    index = event.index + prompt_index * n
                    text = event.delta_text
                    if echo_pending[index]:
                        echo_pending[index] = False
                        text = prompt_text + text
                    usage_text = ',"usage":null'
                    if include_usage:
                        if continuous or event.finish_reason is not None:
                            remaining["usage"] = (prompt_len, event.num_output_tokens)
                        if continuous:
                            p, c = remaining["usage"]
                            usage_text = (f',"usage":{{"prompt_tokens":{p},"total_tokens":{p + c},'
                                          f'"completion_tokens":{c}'
                                          + ("}" if self.legacy else ',"prompt_tokens_details":null}'))
                    out.append(f'data: {head}"choices":[{{"index":{index},"text":{dumps(text)},"logprobs":null,'
                               f'"finish_reason":{dumps(event.finish_reason)},"stop_reason":'
                               f'{dumps(event.stop_reason)}}}]{usage_text}}}\n\n')
                if group.finished:
                    remaining["count"] -= 1
                    self._log_finished(group.request_id)
                    if remaining["count"] == 0:
                        if include_usage and remaining["usage"] is not None:
                            p, c = remaining["usage"]
                            out.append(f'data: {head}"choices":[],"usage":{{"prompt_tokens":{p},"total_tokens":'
                                       f'{p + c},"completion_tokens":{c}}}}}\n\n')
                        stream.send("".join(out))
                        for rid in request_ids:
                            self.streams.pop(rid, None)
                        asyncio.get_running_loop().call_soon(self.faults.on_complete)
                        stream.finish()
                        return
                if out:
                    stream.send("".join(out))
            return sink

        try:
            for i, ((text, count), params) in enumerate(zip(prompts, params_list)):
                self._add(request_ids[i], count, params, make_sink(i, text, count), zlib.crc32(text.encode()))
                self.streams[request_ids[i]] = stream
        except EngineDeadError as exc:
            if self.legacy:
                stream.cut()
            else:
                stream.fail(self.dead_message(str(exc)))
            return
        gone = await self._await_disconnect_or(exchange, stream.done)
        for rid in request_ids:
            self.streams.pop(rid, None)
            if gone:
                self.runner.abort(rid)

    async def _completion_full(self, exchange, extra, req, request_id, created, prompts, params_list) -> None:
        groups = []
        try:
            for i, ((text, count), params) in enumerate(zip(prompts, params_list)):
                group = await self._collect(exchange, f"{request_id}-{i}", count, params, zlib.crc32(text.encode()))
                if group is None:
                    self._json(exchange, 400, error_body("Client disconnected"), extra)
                    return
                self._log_finished(f"{request_id}-{i}")
                groups.append((text, count, group))
        except EngineDeadError:
            self._server_error(exchange, extra)
            return
        choices = []
        prompt_tokens = completion_tokens = 0
        n = params_list[0].n
        for text, count, group in groups:
            for seq in group.seqs[:n]:
                output = seq.text
                if req["echo"]:
                    output = text if req["max_tokens"] == 0 else text + output
                choice: Dict[str, Any] = {"index": len(choices), "text": output, "logprobs": None,
                                          "finish_reason": seq.finish_reason, "stop_reason": seq.stop_reason}
                if not self.legacy:
                    choice["prompt_logprobs"] = None  # protocol.py:1207
                choices.append(choice)
                completion_tokens += len(seq.output_ids)
            prompt_tokens += count
        body = {"id": request_id, "object": "text_completion", "created": created,
                "model": self.config.served_model_names[0], "choices": choices,
                "usage": self._usage(prompt_tokens, completion_tokens)}
        if current().behaviour.kv_transfer_params:
            body["kv_transfer_params"] = None
        if req["stream"]:
            # n != best_of: 0.5.4 does not stream but answers with one event and [DONE]
            exchange.start_stream(200, SSE, extra)
            exchange.send_chunk(f"data: {dumps(body)}\n\ndata: [DONE]\n\n".encode())
            exchange.end_stream()
        else:
            self._json(exchange, 200, body, extra)
        self.faults.on_complete()

