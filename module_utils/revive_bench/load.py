"""Load levels: closed loop (N workers, each send -> read to the end -> send) or open loop (Poisson arrivals, or
evenly spaced ones: LevelConfig.arrivals "constant", the same schedule on every run and with any client).

A level runs `warmup + duration` seconds from its start. Its measured window is [start + warmup, start + warmup +
duration]; a request counts in the statistics when it was sent inside the window and ended inside it. Requests
sent during the warm-up are left out, and so are those still in flight when the window closes (the drain): they
are waited for, bounded by the request timeout, and reported, but not measured (they ran under a falling load).

The i-th request of every level gets the same prompt (one seeded order, prompts.order) and, with several targets,
goes to target i mod T (round robin), so levels differ only in their load.

The client measures itself: dispatch lag = actual send - scheduled send (closed loop: scheduled when the worker's
previous answer ended, and the worker yields to the event loop before sending, so a congested loop shows; open
loop: the Poisson arrival time), and achieved concurrency = the time-weighted number of requests in flight over the
window. verdict.py turns both into the INVALID rule.

Against a simulated server (LevelConfig.time_scale = s != 1: the lab twin, docs/bench.md "Simulated servers") the
level still runs `warmup + duration` WALL seconds and the records keep wall times; summarize() reports latencies in
simulated seconds (wall / s) and throughputs per simulated second (metrics.aggregate), while the dispatch lag stays
in wall time (it measures the client, not the server) and achieved concurrency, a ratio, needs no scaling.
"""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from .client import RequestRecord, Target, build_request, clock, request_body, stream_request
from .metrics import aggregate, tokens_between
from .prompts import Prompt
from .stats import percentile

PROGRESS_EVERY_S = 1.0
TIME_FIELDS = ("scheduled", "sent", "first_byte", "ended")


@dataclass
class LevelConfig:
    concurrency: int
    duration: float
    warmup: float
    max_tokens: int
    timeout: float
    connect_timeout: float = 10.0
    rate: Optional[float] = None          # open loop: arrivals per second (concurrency is then a cap)
    arrivals: str = "poisson"             # open loop: "poisson" (seeded) or "constant" (every 1/rate seconds)
    ignore_eos: bool = False
    kind: str = "completions"
    seed: int = 0
    slo_quantile: float = 0.95
    confidence: float = 0.95
    time_scale: float = 1.0               # wall seconds per simulated second of the server (1.0: a real server)
    exclude_queue: bool = False           # latencies after the front door's queue (metrics.py)


@dataclass
class Workload:
    """What is the same for every level: targets (with the probe's traits), model, prompts and their order."""
    targets: List[Target]
    expect_done: Dict[str, bool]          # target label -> the probe saw [DONE]
    include_usage: Dict[str, bool]        # target label -> stream_options accepted
    model: str
    prompts: List[Prompt]
    order: List[int]
    api_key: str = ""


def _record(workload: Workload, config: LevelConfig, index: int) -> tuple:
    target = workload.targets[index % len(workload.targets)]
    prompt = workload.prompts[workload.order[index % len(workload.order)]]
    record = RequestRecord(index=index, level=config.concurrency, target=target.label, prompt_id=prompt.id,
                           max_tokens=config.max_tokens, ignore_eos=config.ignore_eos)
    body = request_body(config.kind, workload.model, prompt.payload(config.kind), config.max_tokens,
                        config.ignore_eos, workload.include_usage[target.label])
    return target, record, build_request(target, config.kind, body, workload.api_key)


def in_flight_average(records: Sequence[Dict[str, Any]], start: float, end: float) -> float:
    """Time-weighted requests in flight over [start, end] (every record, warm-up and drain included)."""
    if end <= start:
        return 0.0
    busy = 0.0
    for record in records:
        busy += max(0.0, min(record["ended"], end) - max(record["sent"], start))
    return busy / (end - start)


def measured(records: Sequence[Dict[str, Any]], start: float, end: float) -> List[Dict[str, Any]]:
    return [r for r in records if start <= r["sent"] and r["ended"] <= end]


def shift(records: List[Dict[str, Any]], zero: float) -> None:
    """Make records' times seconds since the run's zero, rounded to the microsecond (in place)."""
    for record in records:
        for name in TIME_FIELDS:
            if record.get(name) is not None:
                record[name] = round(record[name] - zero, 6)
        record["events"] = [[round(at - zero, 6), tokens] for at, tokens in record["events"]]


async def run_level(workload: Workload, config: LevelConfig,
                    progress: Optional[Callable[[Dict[str, Any]], None]] = None, zero: float = 0.0
                    ) -> Dict[str, Any]:
    """Run one level; returns {"records": [dict], "window": [start, end], "stats": {...}}, times relative to
    `zero` (a clock() reading), so the statistics are exactly those a saved requests.jsonl recomputes."""
    records: List[RequestRecord] = []
    counter = {"next": 0}
    start = clock()
    window_start, window_end = start + config.warmup, start + config.warmup + config.duration
    limit = asyncio.Semaphore(config.concurrency)

    async def one(scheduled: float) -> None:
        index = counter["next"]
        counter["next"] += 1
        target, record, payload = _record(workload, config, index)
        record.scheduled = scheduled
        records.append(record)
        await stream_request(target, config.kind, payload, record, config.timeout, config.connect_timeout,
                             workload.expect_done[target.label])

    async def worker() -> None:
        scheduled = start
        while True:
            await asyncio.sleep(0)
            if clock() >= window_end:
                return
            await one(scheduled)
            scheduled = clock()

    async def open_loop() -> None:
        rng = random.Random(config.seed)
        arrival = start
        tasks = []
        while True:
            arrival += (1.0 / (config.rate or 1.0) if config.arrivals == "constant"
                        else rng.expovariate(config.rate or 1.0))
            if arrival >= window_end:
                break
            await asyncio.sleep(max(0.0, arrival - clock()))
            await limit.acquire()
            task = asyncio.ensure_future(one(arrival))
            task.add_done_callback(lambda _: limit.release())
            tasks.append(task)
        await asyncio.gather(*tasks)

    async def report() -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            now = clock()
            done = [r for r in records if r.ended is not None and r.sent >= window_start]
            ok = [(r.events[-1][0] - r.sent - ((r.queued_s or 0.0) if config.exclude_queue else 0.0))
                  / config.time_scale for r in done if r.ok and r.events]
            progress({"level": config.concurrency, "elapsed_s": now - start,
                      "phase": "warm-up" if now < window_start else ("measure" if now < window_end else "drain"),
                      "completions": len(ok), "errors": len(done) - len(ok),
                      "in_flight": sum(1 for r in records if r.ended is None), "e2e_p95_s": percentile(ok, 95),
                      "time_scale": config.time_scale})

    reporter = asyncio.ensure_future(report()) if progress else None
    try:
        if config.rate:
            await open_loop()
        else:
            await asyncio.gather(*(worker() for _ in range(config.concurrency)))
    finally:
        if reporter:
            reporter.cancel()
    dicts = [r.as_dict() for r in records]
    shift(dicts, zero)
    return summarize(dicts, config, round(window_start - zero, 6), round(window_end - zero, 6))


def summarize(dicts: List[Dict[str, Any]], config: LevelConfig, window_start: float, window_end: float
              ) -> Dict[str, Any]:
    """A level's statistics from its records (also what a saved requests.jsonl recomputes, with the summary's
    simulation.time_scale as config.time_scale). The window is in the records' wall seconds; with
    config.time_scale s != 1, latencies are simulated seconds and throughputs per simulated second, the dispatch
    lag wall seconds."""
    inside = measured(dicts, window_start, window_end)
    window = window_end - window_start
    scale = config.time_scale
    stats = aggregate(inside, window, tokens_between(dicts, window_start, window_end), config.slo_quantile,
                      config.confidence, scale, config.exclude_queue)
    stats["time_scale"] = scale
    lags = [r["sent"] - r["scheduled"] for r in dicts if window_start <= r["sent"] <= window_end]
    stats["dispatch_lag_s"] = {"p50": percentile(lags, 50), "p99": percentile(lags, 99),
                               "max": max(lags) if lags else None}
    stats["achieved_concurrency"] = in_flight_average(dicts, window_start, window_end)
    stats["sent"] = len(dicts)
    stats["warmup_excluded"] = sum(1 for r in dicts if r["sent"] < window_start)
    stats["drain_excluded"] = sum(1 for r in dicts if r["sent"] >= window_start and r["ended"] > window_end)
    per_target: Dict[str, Dict[str, Any]] = {}
    for label in sorted({r["target"] for r in dicts}):
        mine = [r for r in inside if r["target"] == label]
        part = aggregate(mine, window, tokens_between([r for r in dicts if r["target"] == label], window_start,
                                                      window_end), config.slo_quantile, config.confidence, scale,
                      config.exclude_queue)
        per_target[label] = {key: part[key] for key in ("requests", "completed", "failed", "error_rate",
                                                        "ttft_s", "e2e_s", "output_throughput_tok_s")}
    stats["per_target"] = per_target
    return {"concurrency": config.concurrency, "rate": config.rate, "window": [window_start, window_end],
            "records": dicts, "stats": stats}
