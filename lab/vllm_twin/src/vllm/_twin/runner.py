"""The engine loop in real time: AsyncLLMEngine's run_engine_loop for the twin.

Each iteration asks the engine core for a step, asks the performance model how long it takes,
multiplies by the time scale (and by the fault knobs), sleeps until the step's end on an absolute
schedule (so scheduling overhead does not accumulate), then applies the step: tokens go straight to the
requests' sinks, which write SSE chunks to their connections. Requests that arrive during a step join
at the next one, as in 0.5.4.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Dict, List, Optional

from vllm._twin import vlog
from vllm._twin.engine import (Engine, EngineDeadError, SamplingParams, SequenceGroup, StepStats, TokenEvent,
                               decode_contexts)
from vllm._twin.metrics import ThroughputLog, VllmMetrics
from vllm._twin.perf import PerfModel
from vllm._twin.release import current, pick
from vllm._twin.settings import Settings
from vllm._twin.utilization import UtilizationReporter

FORCE_LOG_INTERVAL_SECONDS = 10.0  # api_server.py lifespan _force_log
# The event loop wakes on a 1 ms grid (epoll), so a step may end up to ~1 ms late. The next step still
# starts at the modelled end of the previous one (the schedule stays on time on average, which matters at
# small time scales) unless the loop is this far behind: then the twin itself is the bottleneck.
LAG_TOLERANCE_SECONDS = 0.05


class Runner:
    def __init__(self, engine: Engine, perf: PerfModel, settings: Settings, block_bytes: int,
                 metrics: Optional[VllmMetrics], log_stats: bool, utilization: Optional[UtilizationReporter]):
        self.engine = engine
        self.perf = perf
        self.settings = settings
        self.scale = settings.time_scale
        self.block_bytes = block_bytes
        self.metrics = metrics
        self.log_stats = log_stats
        self.utilization = utilization
        self.wake = asyncio.Event()
        self.finished_requests = 0
        self.ready_time = time.monotonic()
        self.throughput_log = ThroughputLog(time.monotonic())
        self.on_dead: Optional[Callable[[str], None]] = None
        self.stopped = False
        self.steps = 0
        self.last_throughput = (0.0, 0.0)

    # --- requests -----------------------------------------------------------------------------------
    def add(self, request_id: str, prompt_len: int, params: SamplingParams,
            sink: Callable[[SequenceGroup, List[TokenEvent]], None], prompt_key: int) -> SequenceGroup:
        group = self.engine.add_request(request_id, prompt_len, params, time.monotonic(), sink, prompt_key,
                                        answer_median=self.settings.answer_median)
        self.wake.set()
        return group

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    @property
    def dead(self) -> Optional[str]:
        return self.engine.dead

    def kill(self, reason: str) -> None:
        if self.engine.dead:
            return
        self.engine.kill(reason)
        self.wake.set()
        if self.on_dead is not None:
            self.on_dead(reason)

    # --- slowdowns --------------------------------------------------------------------------------
    def _factor(self, decode_only: bool, now: float) -> float:
        settings = self.settings
        factor = 1.0
        cold = settings.effective_cold_start_requests()
        if cold > 0 and self.finished_requests < cold:
            factor *= 1.0 + (settings.cold_start_factor - 1.0) * (1.0 - self.finished_requests / cold)
        if settings.latency_drift_per_minute:
            minutes = (now - self.ready_time) / self.scale / 60.0
            factor *= 1.0 + settings.latency_drift_per_minute * minutes
        if decode_only:
            factor *= settings.decode_slowdown
        return factor

    # --- loop -------------------------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_start = loop.time()
        while not self.stopped and not self.engine.dead:
            if not self.engine.has_unfinished():
                self.wake.clear()
                if self.utilization is not None:
                    self.utilization.maybe_flush()
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=1.0)
                except asyncio.TimeoutError:
                    pass
                next_start = loop.time()
                continue
            now = loop.time()
            start = next_start if now - LAG_TOLERANCE_SECONDS < next_start else now
            try:
                step = self.engine.schedule(start)
            except EngineDeadError as exc:
                self.kill(str(exc))
                break
            decode_only = not step.prefills and bool(step.decodes)
            cost = self.perf.step(step.prefill_lengths(), decode_contexts(step), step.swapped_blocks, self.block_bytes)
            factor = self._factor(decode_only, start) * self.scale
            end = start + cost.seconds * factor
            delay = end - loop.time()
            await asyncio.sleep(delay if delay > 0 else 0)
            if self.engine.dead or self.stopped:
                break
            now = loop.time()
            stats = self.engine.snapshot_stats(now)
            before = len(self.engine.groups)
            self.engine.finish_step(step, now, stats)
            self.finished_requests += max(0, before - len(self.engine.groups))
            self.steps += 1
            self._log(stats)
            if self.utilization is not None:
                self.utilization.record(cost.gpu_busy_seconds * factor, cost.memory_busy_seconds * factor)
            next_start = end

    def _log(self, stats: StepStats) -> None:
        if not self.log_stats:
            return
        if self.metrics is not None:
            self.metrics.log(stats)
        self.throughput_log.add(stats)
        if self.throughput_log.due(stats.now):
            prompt_tps, generation_tps = self.throughput_log.take(stats.now)
            if self.metrics is not None:
                self.metrics.log_throughput(prompt_tps, generation_tps)
            # 0.8.5.post1 logs an idle interval at debug level only (v0.8.5.post1:vllm/engine/metrics.py:479-483)
            idle = not any((prompt_tps, generation_tps, *self.last_throughput))
            self.last_throughput = (prompt_tps, generation_tps)
            if idle and not current().legacy:
                return
            vlog.info(pick("metrics.py:406", "metrics.py:486"), (
                f"Avg prompt throughput: {prompt_tps:.1f} tokens/s, Avg generation throughput: "
                f"{generation_tps:.1f} tokens/s, Running: {stats.num_running} reqs, Swapped: {stats.num_swapped} "
                f"reqs, Pending: {stats.num_waiting} reqs, GPU KV cache usage: {stats.gpu_cache_usage * 100:.1f}%, "
                f"CPU KV cache usage: {stats.cpu_cache_usage * 100:.1f}%."))

    async def force_log(self) -> None:
        """The API server's do_log_stats every 10 s (also when idle)."""
        while not self.stopped:
            await asyncio.sleep(FORCE_LOG_INTERVAL_SECONDS)
            if not self.engine.dead and not self.stopped:
                self._log(self.engine.snapshot_stats(time.monotonic()))

    def stop(self) -> None:
        self.stopped = True
        self.wake.set()


def state(runner: Runner) -> Dict[str, object]:
    return {"running": len(runner.engine.running), "waiting": len(runner.engine.waiting),
            "swapped": len(runner.engine.swapped), "steps": runner.steps}
