"""One bench run: probe every target, run the levels in order, judge each, and build the summary.

The time scale of a simulated server (docs/bench.md "Simulated servers"): Options.time_scale None is --time-scale
auto (the targets' /version twin.time_scale, probe.resolve_time_scale); the levels' statistics are computed with it
(load.summarize), and summary["simulation"] says which scale, from where, and what it changes.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional

from . import BENCH_VERSION
from .client import Target, clock
from .load import LevelConfig, Workload, run_level
from .probe import SCALE_FROM_SERVER, Traits, probe, resolve_time_scale
from .prompts import order
from .report import level_summary
from .stats import min_completions
from .verdict import Bounds, exit_code, judge, knees, recommend


@dataclass
class Options:
    targets: List[Target]
    model: str
    concurrency: List[int]
    duration: float
    warmup: float
    max_tokens: int
    bounds: Bounds
    prompt_set: Dict[str, Any]           # prompts.load()
    command: str
    kind: str = "completions"
    api_key: str = ""
    ignore_eos: bool = False
    rate: Optional[float] = None
    arrivals: str = "poisson"            # with rate: "poisson" or "constant" (load.LevelConfig)
    seed: int = 0
    timeout: float = 120.0
    connect_timeout: float = 10.0
    confidence: float = 0.95
    node_observations: Dict[int, Dict[str, Any]] = field(default_factory=dict)
    time_scale: Optional[float] = None   # wall seconds per simulated second; None: auto (the servers' /version)
    exclude_queue: bool = False          # judge latencies after the front door's queue (metrics.py)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


async def probe_all(options: Options) -> Dict[str, Any]:
    """{label: Traits} for every target; raises ProbeError on the first that cannot be benchmarked."""
    traits = {}
    for target in options.targets:
        traits[target.label] = await probe(target, options.model, options.kind, options.api_key,
                                           min(options.timeout, 60.0))
    return traits


def simulation(scale: float, source: Optional[str], traits: Dict[str, Traits], options: Options
               ) -> Optional[Dict[str, Any]]:
    """summary["simulation"]: None for a real server at real time (scale 1, nothing reported or given)."""
    if scale == 1.0 and source is None:
        return None
    reported = {label: t.time_scale for label, t in traits.items()}
    note = (f"a simulated server: one simulated second lasts {scale:g} wall seconds. TTFT, E2E, TPOT, ITL and the "
            f"SLO are in simulated seconds (wall duration / {scale:g}), throughputs per simulated second (wall rate "
            f"x {scale:g}); --duration, --warmup, --timeout, the dispatch lag and the times in requests.jsonl are "
            f"wall seconds")
    if options.rate:
        note += f"; --rate {options.rate:g} is arrivals per wall second ({options.rate * scale:g} per simulated second)"
    if source != SCALE_FROM_SERVER and any(value is not None and value != scale for value in reported.values()):
        note += "; the servers report a different scale (server_time_scales), --time-scale overrides it"
    return {"time_scale": scale, "source": source, "note": note, "server_time_scales": reported,
            "duration_simulated_s": options.duration / scale, "warmup_simulated_s": options.warmup / scale}


def latency_basis(exclude_queue: bool, levels: List[Dict[str, Any]]) -> str:
    """What the latencies and the SLO verdict measure, in words for the report."""
    reported = sum(level["stats"]["queue_reported"] for level in levels)
    if not exclude_queue:
        return ("as the client saw them: from sending to the last token, any wait at the front door included"
                + (f" (queue time reported by the front door for {reported} requests, shown apart)" if reported
                   else ""))
    if not reported:
        return ("--exclude-queue, but no target reported a queue time (header X-Revive-Queue-Ms, the front door's "
                "frontdoor_queue_time_header): the latencies are the client's, wait included")
    return (f"the servers': from leaving the front door's queue to the last token (--exclude-queue; {reported} "
            f"requests reported their wait, shown apart as queue time); a client saw wait + latency")


async def run(options: Options, progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
    """{"summary": ..., "levels": [level with records], "exit_code": int}; raises ProbeError before any load."""
    started, wall_zero, zero = _now(), time.time(), clock()
    traits = await probe_all(options)
    scale, source = resolve_time_scale(traits, options.time_scale)
    workload = Workload(
        targets=options.targets, model=options.model, prompts=options.prompt_set["prompts"],
        order=order(len(options.prompt_set["prompts"]), options.seed), api_key=options.api_key,
        expect_done={label: t.sends_done for label, t in traits.items()},
        include_usage={label: t.include_usage_accepted for label, t in traits.items()})
    levels, summaries = [], []
    for concurrency in options.concurrency:
        config = LevelConfig(concurrency=concurrency, duration=options.duration, warmup=options.warmup,
                             max_tokens=options.max_tokens, timeout=options.timeout,
                             connect_timeout=options.connect_timeout, rate=options.rate,
                             arrivals=options.arrivals,
                             ignore_eos=options.ignore_eos, kind=options.kind, seed=options.seed,
                             confidence=options.confidence, time_scale=scale,
                             exclude_queue=options.exclude_queue)
        level = await run_level(workload, config, progress, zero)
        node = options.node_observations.get(concurrency)
        verdict = judge(level["stats"], concurrency, options.bounds, closed_loop=not options.rate,
                        ignore_eos=options.ignore_eos, node=node)
        level["verdict"] = verdict.as_dict()
        levels.append(level)
        summaries.append(level_summary(level, verdict.as_dict(), node))
        if progress:
            progress({"level": concurrency, "verdict": verdict.verdict, "reasons": verdict.reasons,
                      "time_scale": scale})
    code = exit_code([s["verdict"]["verdict"] for s in summaries])
    prompt_set = {k: v for k, v in options.prompt_set.items() if k != "prompts"}
    summary = {
        "model": options.model,
        "targets": [t.label for t in options.targets],
        "endpoint": options.kind,
        "mode": (f"open loop, {'evenly spaced' if options.arrivals == 'constant' else 'Poisson'} {options.rate:g}/s "
                 "(concurrency = cap)") if options.rate else "closed loop",
        "max_tokens": options.max_tokens, "ignore_eos": options.ignore_eos,
        "duration_s": options.duration, "warmup_s": options.warmup, "seed": options.seed,
        "simulation": simulation(scale, source, traits, options),
        "exclude_queue": options.exclude_queue,
        "latency_basis": latency_basis(options.exclude_queue, levels),
        "slo": {"e2e_p95_s": options.bounds.slo_e2e_p95_s, "quantile": 0.95, "confidence": options.confidence,
                "min_completions": min_completions(0.95, options.confidence)},
        "bounds": asdict(options.bounds),
        "levels": summaries,
        "verdicts": {str(s["concurrency"]): s["verdict"]["verdict"] for s in summaries},
        "recommended_concurrency": recommend(levels),
        "knees": knees(levels, "ttft_s", "p50", options.bounds.knee_elasticity)
        + knees(levels, "e2e_s", "p95", options.bounds.knee_elasticity),
        "exit_code": code,
        "clock_zero": {"wall_time": wall_zero, "iso": datetime.fromtimestamp(wall_zero, timezone.utc).isoformat()},
        "provenance": {
            "bench_version": BENCH_VERSION, "command": options.command, "started": started, "ended": _now(),
            "prompts": prompt_set,
            "servers": {label: t.as_dict() for label, t in traits.items()},
        },
    }
    return {"summary": summary, "levels": levels, "exit_code": code}


def run_sync(options: Options, progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> Dict[str, Any]:
    return asyncio.run(run(options, progress))
