"""Closed-loop load on the engine core in virtual time: the calibration against the field report.

The same Engine and PerfModel the server runs, driven by a virtual clock, with `concurrency` clients
that each send a request, wait for it to finish and send the next one at once (the field report's load
test, docs/field-report.md ('Load test method'): asyncio client with a semaphore, prompts of at most 256
tokens, max_tokens=200, streaming). Ten simulated minutes per level take a few seconds. The constants of the
step time live in module_utils/revive_perf.py (the planner's performance model, which perf.py re-exports);
the field table is data/field-calibration.yml. tests/unit/test_perf_calibration.py runs `run_level` against
that table and asserts it; bench/twin_calibration_test.py prints the same levels, and the live HTTP server's,
beside the table. This file holds no copy of the table and does not read it: the wheel carries this file
to the lab nodes, and the twin's wheel does not depend on PyYAML.
"""
from __future__ import annotations

import heapq
import random
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from vllm._twin.engine import Engine, EngineConfig, SamplingParams, SequenceGroup, TokenEvent, decode_contexts
from vllm._twin.perf import PerfModel
from vllm._twin.tokens import CHAT_BOS_TOKENS, CHAT_GENERATION_PROMPT_TOKENS, CHAT_TOKENS_PER_MESSAGE

CLIENT_TURNAROUND_SECONDS = 0.003  # client parses the last chunk and sends the next request


def field_prompt_tokens(rng: random.Random) -> int:
    """Token count of one prompt of the field notes' set: 200 user questions (some with history),
    trimmed to at most 256 tokens, in the Llama-3-like chat template (system + user message).

    APPROXIMATION of that set: 70 % single questions of 15-110 tokens, 30 % with history of 110-240.
    """
    if rng.random() < 0.7:
        content = rng.randint(15, 110)
    else:
        content = rng.randint(110, 240)
    overhead = CHAT_BOS_TOKENS + CHAT_GENERATION_PROMPT_TOKENS + 2 * (CHAT_TOKENS_PER_MESSAGE + 1) + 8
    return min(256, content + overhead)


@dataclass
class RequestRecord:
    sent: float
    prompt_tokens: int
    first_token: Optional[float] = None
    done: Optional[float] = None
    tokens: int = 0
    finish_reason: Optional[str] = None


@dataclass
class LevelResult:
    concurrency: int
    duration: float
    requests: int
    ttft_p50: float
    ttft_p95: float
    e2e_p50: float
    e2e_p95: float
    throughput: float           # tokens generated inside the measured window / its length
    per_stream_decode: float    # mean over requests of (N - 1) / (E2E - TTFT)
    per_stream_total: float     # throughput / concurrency
    mean_output_tokens: float
    length_share: float         # share of requests ending at max_tokens
    mean_running: float
    mean_waiting: float
    preemptions: int
    extra: Dict[str, float] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), as vLLM's benchmark scripts use."""
    if not values:
        return float("nan")
    data = sorted(values)
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def run_level(engine_config: EngineConfig, perf: PerfModel, concurrency: int, duration: float = 600.0,
              warmup: float = 60.0, max_tokens: int = 200, seed: int = 1) -> LevelResult:
    """Closed loop at `concurrency` for `warmup + duration` virtual seconds; stats over `duration`."""
    engine = Engine(engine_config)
    rng = random.Random(seed)
    records: List[RequestRecord] = []
    arrivals: List[tuple] = []  # (time, client id)
    now = 0.0
    counter = 0
    block_bytes = 0
    running_samples: List[int] = []
    waiting_samples: List[int] = []
    preemptions = 0

    window_tokens = [0]

    def make_sink(record: RequestRecord, client: int):
        def sink(group: SequenceGroup, events: List[TokenEvent]) -> None:
            for event in events:
                if event.token_id >= 0:
                    record.tokens = event.num_output_tokens
                    if warmup <= clock[0] <= end:
                        window_tokens[0] += 1
                    if record.first_token is None and event.delta_text:
                        record.first_token = clock[0]
                if event.finish_reason is not None:
                    record.finish_reason = event.finish_reason
                    record.done = clock[0]
                    heapq.heappush(arrivals, (clock[0] + CLIENT_TURNAROUND_SECONDS, client))
        return sink

    clock = [0.0]
    for client in range(concurrency):
        heapq.heappush(arrivals, (0.0, client))
    end = warmup + duration
    while now < end:
        while arrivals and arrivals[0][0] <= now:
            at, client = heapq.heappop(arrivals)
            prompt = field_prompt_tokens(rng)
            record = RequestRecord(sent=at, prompt_tokens=prompt)
            records.append(record)
            counter += 1
            engine.add_request(f"r{counter}", prompt, SamplingParams(max_tokens=max_tokens, temperature=0.7),
                               at, make_sink(record, client))
        if not engine.has_unfinished():
            now = arrivals[0][0] if arrivals else end
            continue
        step = engine.schedule(now)
        cost = perf.step(step.prefill_lengths(), decode_contexts(step), step.swapped_blocks, block_bytes)
        now += max(cost.seconds, 1e-6)
        clock[0] = now
        engine.finish_step(step, now)
        preemptions += step.preempted
        if now >= warmup:
            running_samples.append(len(engine.running))
            waiting_samples.append(len(engine.waiting))

    window = [r for r in records if r.sent >= warmup and r.done is not None and r.done <= end]
    ttft = [r.first_token - r.sent for r in window if r.first_token is not None]
    e2e = [r.done - r.sent for r in window]
    decode_speeds = [(r.tokens - 1) / (r.done - r.first_token) for r in window
                     if r.first_token is not None and r.tokens > 1 and r.done > r.first_token]
    throughput = window_tokens[0] / duration
    return LevelResult(
        concurrency=concurrency, duration=duration, requests=len(window),
        ttft_p50=percentile(ttft, 50), ttft_p95=percentile(ttft, 95),
        e2e_p50=percentile(e2e, 50), e2e_p95=percentile(e2e, 95),
        throughput=throughput, per_stream_decode=statistics.fmean(decode_speeds) if decode_speeds else 0.0,
        per_stream_total=throughput / concurrency,
        mean_output_tokens=statistics.fmean([r.tokens for r in window]) if window else 0.0,
        length_share=(sum(1 for r in window if r.finish_reason == "length") / len(window)) if window else 0.0,
        mean_running=statistics.fmean(running_samples) if running_samples else 0.0,
        mean_waiting=statistics.fmean(waiting_samples) if waiting_samples else 0.0,
        preemptions=preemptions)
