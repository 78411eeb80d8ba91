"""Probe a server before loading it: GET /version and /v1/models, then one streamed request, and derive the
traits the load client adapts to.

Traits (docs/bench.md "Probe"): where usage comes (`every_chunk`: a running usage on the content chunks, as the twin
of 0.5.4 sends with stream_options.include_usage; `last_only`: a usage-only chunk at the end; `none`), whether
the first chat chunk is role-only, whether `data: [DONE]` is sent (then a stream without it is a failure), and
whether `stream_options` is accepted at all: a server that answers 400 to it is probed again without it, and the
load then asks for no usage (N comes from the stream).

A server that refuses the connection, does not serve the model, or does not answer like an OpenAI server is a
ProbeError (the command exits 2 with its message).

A simulated server says so in its /version: the lab twin reports `"twin": {"time_scale": s}` (its
VLLM_SIM_TIME_SCALE, every modelled duration x s). `Traits.time_scale` keeps it; `resolve_time_scale` turns the
targets' values and --time-scale into the one scale the statistics use (docs/bench.md "Simulated servers").
"""
from __future__ import annotations

import asyncio
import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

from .client import RequestRecord, Target, build_request, error_message, fetch, request_body, stream_request

PROBE_PROMPT = "Say hello to the operator in one short sentence."
PROBE_MAX_TOKENS = 16


class ProbeError(Exception):
    """The server cannot be benchmarked; the message says which and why."""


class TimeScaleError(ProbeError):
    """--time-scale auto, but the targets do not agree on their simulated time scale (a usage error: exit 2)."""


SCALE_FROM_SERVER = "server /version twin.time_scale"
SCALE_FROM_OPTION = "--time-scale"


@dataclass
class Traits:
    target: str
    version: Optional[Dict[str, Any]]
    models: List[str]
    include_usage_accepted: bool
    usage: str                 # every_chunk | last_only | none
    role_only_first: bool
    sends_done: bool
    probe_ttft_s: Optional[float]           # wall seconds, whatever the time scale
    probe_output_tokens: Optional[int]
    time_scale: Optional[float] = None      # /version's twin.time_scale: a simulated server; None: a real one

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def reported_time_scale(version: Any) -> Optional[float]:
    """The simulated time scale a /version answer reports (the lab twin's `twin.time_scale`); None when it reports
    none, or nothing usable (not a positive finite number)."""
    twin = version.get("twin") if isinstance(version, dict) else None
    value = twin.get("time_scale") if isinstance(twin, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def resolve_time_scale(traits: Dict[str, Traits], explicit: Optional[float] = None
                       ) -> Tuple[float, Optional[str]]:
    """(scale, source): `explicit` (--time-scale X) wins; else (auto) the targets' twin.time_scale when they all
    report the same one, else 1.0 with no source when none reports one. Targets that disagree (one simulated and
    one not, or two scales) raise TimeScaleError naming each target and its value."""
    if explicit is not None:
        return float(explicit), SCALE_FROM_OPTION
    reported = {label: t.time_scale for label, t in traits.items()}
    values = set(reported.values())
    if len(values) > 1:
        listed = ", ".join(f"{label}: {'none (not simulated)' if value is None else f'{value:g}'}"
                           for label, value in reported.items())
        raise TimeScaleError(f"--time-scale auto: the targets do not agree on their simulated time scale "
                             f"(/version twin.time_scale): {listed}; bench targets of one kind, or give --time-scale")
    value = values.pop() if values else None
    return (1.0, None) if value is None else (value, SCALE_FROM_SERVER)


async def _get_json(target: Target, path: str, api_key: str, timeout: float) -> tuple:
    try:
        status, _, body = await fetch(target, "GET", path, api_key, timeout=timeout)
    except (OSError, asyncio.TimeoutError) as exc:
        raise ProbeError(f"{target.label}{path}: cannot connect ({type(exc).__name__}: {exc})") from exc
    except ValueError as exc:
        raise ProbeError(f"{target.label}{path}: not an HTTP server ({exc})") from exc
    if status != 200:
        return status, None, body
    try:
        return status, json.loads(body.decode("utf-8")), body
    except ValueError as exc:
        raise ProbeError(f"{target.label}{path}: HTTP 200 but not JSON ({body[:80]!r}): not an OpenAI-compatible "
                         "server") from exc


async def _one(target: Target, kind: str, model: str, prompt: Any, api_key: str, include_usage: bool,
               timeout: float) -> RequestRecord:
    record = RequestRecord(index=-1, level=0, target=target.label, prompt_id="probe", max_tokens=PROBE_MAX_TOKENS,
                           ignore_eos=False)
    payload = build_request(target, kind, request_body(kind, model, prompt, PROBE_MAX_TOKENS, False, include_usage),
                            api_key)
    return await stream_request(target, kind, payload, record, timeout, min(timeout, 10.0), expect_done=False)


async def probe(target: Target, model: str, kind: str = "completions", api_key: str = "",
                timeout: float = 60.0) -> Traits:
    """The traits of `target` serving `model`; raises ProbeError."""
    status, version, _ = await _get_json(target, "/version", api_key, timeout)
    if status != 200:
        version = None  # not every OpenAI-compatible server has /version; recorded as unknown
    status, listing, body = await _get_json(target, "/v1/models", api_key, timeout)
    if status == 401:
        raise ProbeError(f"{target.label}/v1/models: HTTP 401 ({error_message(body)}): give --api-key or "
                         "REVIVE_API_KEY")
    if status != 200 or not isinstance(listing, dict) or not isinstance(listing.get("data"), list):
        raise ProbeError(f"{target.label}/v1/models: HTTP {status}, not an OpenAI model list: "
                         f"{error_message(body)}")
    models = [str(card.get("id")) for card in listing["data"] if isinstance(card, dict)]
    if model not in models:
        raise ProbeError(f"{target.label} does not serve model {model!r}; it serves: {', '.join(models) or 'none'}")
    prompt: Any = [{"role": "user", "content": PROBE_PROMPT}] if kind == "chat" else PROBE_PROMPT
    record = await _one(target, kind, model, prompt, api_key, True, timeout)
    accepted = True
    if record.status == 400:
        accepted = False
        record = await _one(target, kind, model, prompt, api_key, False, timeout)
    if not record.ok:
        raise ProbeError(f"{target.label}: the probe request to model {model!r} failed: {record.error}")
    usage = "none"
    if record.usage is not None:
        usage = "every_chunk" if record.usage_per_chunk else "last_only"
    output = (record.usage or {}).get("completion_tokens")
    return Traits(target=target.label, version=version, models=models, include_usage_accepted=accepted,
                  usage=usage, role_only_first=record.role_only_first, sends_done=record.done,
                  probe_ttft_s=(record.events[0][0] - record.sent) if record.events else None,
                  probe_output_tokens=output if isinstance(output, int) else sum(t for _, t in record.events),
                  time_scale=reported_time_scale(version))
