"""Per-request metrics from a request's raw timestamps (client.RequestRecord), and their aggregation per level.

Definitions (docs/bench.md has them next to vLLM's and GuideLLM's, docs/facts/loadtest.md §3-§4):
- TTFT = first content-bearing event - send (the clock starts before the connection is opened);
- E2E  = last content-bearing event - send (not the usage chunk, not [DONE]: as `vllm bench serve`);
- TPOT = (E2E - TTFT) / (N - 1) for N >= 2 output tokens (vLLM's definition; none for N < 2);
- ITL  = every gap between consecutive content events, pooled over the level's requests;
- N (output tokens) = usage.completion_tokens when the server reported it, else the stream's token count (one per
  content event, or the running usage's increments when every chunk carries usage); the difference between usage
  and the stream is reported per level, never silently resolved.
Only complete requests (record.ok) have metrics; failures are counted, never averaged in.

Behind a front door with a per-server limit a request may wait there for a free slot before any server sees it;
the front door reports that wait (client.QUEUE_TIME_HEADER, recorded as `queued_s`). By default every latency is
what the client saw, the wait included. With `exclude_queue` (bench --exclude-queue) TTFT and E2E start when the
request left the queue: the servers' latency, what the SLO of a limited replica is about; the wait itself is
reported as its own distribution (`queue_s`) either way, never hidden.

Against a simulated server whose simulated second lasts `time_scale` = s wall seconds (the lab twin's
VLLM_SIM_TIME_SCALE: every modelled duration x s; docs/bench.md "Simulated servers"), every latency is in simulated
seconds (wall duration / s) and every throughput per simulated second (wall rate x s). The records keep their wall
times; only these numbers are scaled, here, so a saved requests.jsonl recomputes the same with the same scale.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from .stats import mean, percentile, quantile_bounds

PERCENTILES = (50, 90, 95, 99)


@dataclass
class RequestMetrics:
    ttft: float
    e2e: float
    tpot: Optional[float]
    itl: List[float]
    output_tokens: int
    stream_tokens: int
    usage_tokens: Optional[int]
    early_eos: bool
    queued: Optional[float] = None


def stream_tokens(record: Dict[str, Any]) -> int:
    return int(sum(tokens for _, tokens in record["events"]))


def request_metrics(record: Dict[str, Any], time_scale: float = 1.0, exclude_queue: bool = False
                    ) -> Optional[RequestMetrics]:
    """Metrics of one requests.jsonl record (a dict, so a saved file recomputes the same); None unless complete.
    Durations are the record's wall durations / `time_scale` (simulated seconds; 1.0: a real server); with
    `exclude_queue` they start after the record's front-door wait (`queued_s`, none reported: 0)."""
    if not record.get("ok") or not record.get("events"):
        return None
    queued = record.get("queued_s")
    start = record["sent"] + ((queued or 0.0) if exclude_queue else 0.0)
    times = [(at - start) / time_scale for at, _ in record["events"]]
    ttft = times[0]
    e2e = times[-1]
    usage = record.get("usage") or {}
    usage_tokens = usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else None
    counted = stream_tokens(record)
    output = usage_tokens if usage_tokens is not None else counted
    tpot = (e2e - ttft) / (output - 1) if output >= 2 else None
    itl = [later - earlier for earlier, later in zip(times, times[1:])]
    early = bool(record.get("ignore_eos")) and output < record["max_tokens"]
    return RequestMetrics(ttft, e2e, tpot, itl, output, counted, usage_tokens, early,
                          queued / time_scale if queued is not None else None)


def distribution(values: Sequence[float]) -> Dict[str, Optional[float]]:
    out: Dict[str, Optional[float]] = {"mean": mean(values)}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(values, q)
    out["max"] = max(values) if values else None
    return out


def tokens_between(records: Sequence[Dict[str, Any]], start: float, end: float) -> int:
    """Output tokens of complete requests whose events arrived in [start, end]: a throughput that requests cut by
    the window's edges do not bias (as GuideLLM, over the measured window only)."""
    return int(sum(tokens for record in records if record.get("ok")
                   for at, tokens in record["events"] if start <= at <= end))


def aggregate(records: Sequence[Dict[str, Any]], window_s: float, window_tokens: int, slo_quantile: float = 0.95,
              confidence: float = 0.95, time_scale: float = 1.0, exclude_queue: bool = False) -> Dict[str, Any]:
    """A level's numbers over its measured records (the caller has left out warm-up and drain); `window_tokens`
    is tokens_between() over every record of the level, `window_s` the window's wall seconds. With a `time_scale`
    s != 1 latencies are wall / s and rates per simulated second (wall rate x s); `exclude_queue`: see above."""
    measured: List[RequestMetrics] = []
    errors: Dict[str, int] = {}
    simulated_window = window_s / time_scale
    for record in records:
        metrics = request_metrics(record, time_scale, exclude_queue)
        if metrics is None:
            reason = (record.get("error") or "incomplete").split(":")[0]
            errors[reason] = errors.get(reason, 0) + 1
        else:
            measured.append(metrics)
    e2e = [m.e2e for m in measured]
    output_tokens = sum(m.output_tokens for m in measured)
    with_usage = [m for m in measured if m.usage_tokens is not None]
    mismatched = [m for m in with_usage if m.usage_tokens != m.stream_tokens]
    queued = [m.queued for m in measured if m.queued is not None]
    failed = len(records) - len(measured)
    return {
        "requests": len(records),
        "completed": len(measured),
        "failed": failed,
        "error_rate": failed / len(records) if records else 0.0,
        "errors": errors,
        "ttft_s": distribution([m.ttft for m in measured]),
        "e2e_s": distribution(e2e),
        "tpot_s": distribution([m.tpot for m in measured if m.tpot is not None]),
        "itl_s": distribution([gap for m in measured for gap in m.itl]),
        "queue_s": distribution(queued),
        "queue_reported": len(queued),
        "e2e_p95_bounds": quantile_bounds(e2e, slo_quantile, confidence),
        "output_tokens": output_tokens,
        "output_tokens_mean": output_tokens / len(measured) if measured else None,
        "output_throughput_tok_s": window_tokens / simulated_window if window_s > 0 else None,
        "requests_per_s": len(measured) / simulated_window if window_s > 0 else None,
        "usage_vs_stream": {
            "with_usage": len(with_usage),
            "mismatched": len(mismatched),
            "usage_minus_stream_tokens": sum((m.usage_tokens or 0) - m.stream_tokens for m in with_usage),
        },
        "early_eos": sum(1 for m in measured if m.early_eos),
        "early_eos_share": (sum(1 for m in measured if m.early_eos) / len(measured)) if measured else 0.0,
    }
