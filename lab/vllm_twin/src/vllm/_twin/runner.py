"""The engine loop in real time: AsyncLLMEngine's run_engine_loop for the twin.

Each iteration asks the engine core for a step, asks the performance model how long it takes,
multiplies by the time scale (and by the fault knobs), sleeps until the step's end on an absolute
schedule (so scheduling overhead does not accumulate), then applies the step: tokens go straight to the
requests' sinks, which write SSE chunks to their connections. Requests that arrive during a step join
at the next one, as in 0.5.4.

With pipeline parallelism 0.5.4 runs one scheduler per stage (a virtual engine, v0.5.4
vllm/engine/llm_engine.py:308-314), each with 1/PP of the KV blocks (core/scheduler.py:287-293), and its engine
loop steps them concurrently (engine/async_llm_engine.py:602-661): a new request goes to the virtual engine with
the fewest unfinished requests (llm_engine.py:554-559), and the system statistics sum over all of them against
the whole cache (llm_engine.py:977-1002). The runner keeps one Engine per virtual engine and one loop each; with
one stage that is the single engine it always was.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from vllm._twin import vlog
from vllm._twin.engine import (Engine, EngineDeadError, SamplingParams, SequenceGroup, StepStats, TokenEvent,
                               decode_contexts)
from vllm._twin.metrics import ThroughputLog, VllmMetrics
from vllm._twin.perf import StepModel
from vllm._twin.release import current, pick
from vllm._twin.settings import Settings
from vllm._twin.utilization import UtilizationReporter

FORCE_LOG_INTERVAL_SECONDS = 10.0  # api_server.py lifespan _force_log
# The event loop wakes on a 1 ms grid (epoll), so a step may end up to ~1 ms late. The next step still
# starts at the modelled end of the previous one (the schedule stays on time on average, which matters at
# small time scales) unless the loop is this far behind: then the twin itself is the bottleneck.
LAG_TOLERANCE_SECONDS = 0.05


class Runner:
    def __init__(self, engines: Union[Engine, Sequence[Engine]], perf: StepModel, settings: Settings, block_bytes: int,
                 metrics: Optional[VllmMetrics], log_stats: bool, utilization: Optional[UtilizationReporter],
                 cache_blocks: Optional[Tuple[int, int]] = None):
        """`engines`: one per virtual engine (or the one engine); `cache_blocks`: the whole cache's (GPU, CPU)
        blocks, what 0.5.4 logs and measures usage against (default: the engines' blocks together)."""
        self.engines = [engines] if isinstance(engines, Engine) else list(engines)
        self.perf = perf
        self.settings = settings
        self.scale = settings.time_scale
        self.block_bytes = block_bytes
        self.metrics = metrics
        self.log_stats = log_stats
        self.utilization = utilization
        self.cache_blocks = cache_blocks or (sum(e.config.num_gpu_blocks for e in self.engines),
                                             sum(e.config.num_cpu_blocks for e in self.engines))
        self.wakes = [asyncio.Event() for _ in self.engines]
        self.finished_requests = 0
        self.ready_time = time.monotonic()
        self.throughput_log = ThroughputLog(time.monotonic())
        self.on_dead: Optional[Callable[[str], None]] = None
        self.stopped = False
        self.steps = 0
        self.last_throughput = (0.0, 0.0)
        self.lost_worker: Optional[str] = None  # a Ray worker died while the engine was idle

    # --- requests -----------------------------------------------------------------------------------
    def add(self, request_id: str, prompt_len: int, params: SamplingParams,
            sink: Callable[[SequenceGroup, List[TokenEvent]], None], prompt_key: int) -> SequenceGroup:
        costs = [len(e.waiting) + len(e.running) + len(e.swapped) for e in self.engines]
        index = costs.index(min(costs))
        group = self.engines[index].add_request(request_id, prompt_len, params, time.monotonic(), sink, prompt_key,
                                                answer_median=self.settings.answer_median)
        self.wakes[index].set()
        return group

    def abort(self, request_id: str) -> None:
        for engine in self.engines:
            engine.abort(request_id)

    @property
    def dead(self) -> Optional[str]:
        return self.engines[0].dead

    def kill(self, reason: str) -> None:
        if self.dead:
            return
        for engine in self.engines:
            engine.kill(reason)
        for wake in self.wakes:
            wake.set()
        if self.on_dead is not None:
            self.on_dead(reason)

    def worker_lost(self, reason: str) -> bool:
        """A Ray worker died. 0.5.4 learns it from the next model execution that reaches the worker (its Ray
        executor has no health check: GPUExecutor.check_health, v0.5.4 vllm/executor/gpu_executor.py:147-150):
        at once while requests run, at the next request's step when idle. True when the engine died now."""
        if any(engine.has_unfinished() for engine in self.engines):
            self.kill(reason)
            return True
        self.lost_worker = reason
        return False

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
        await asyncio.gather(*(self._run(index) for index in range(len(self.engines))))

    async def _run(self, index: int) -> None:
        """The steps of one virtual engine."""
        engine, wake = self.engines[index], self.wakes[index]
        loop = asyncio.get_running_loop()
        next_start = loop.time()
        while not self.stopped and not engine.dead:
            if not engine.has_unfinished():
                wake.clear()
                if self.utilization is not None:
                    self.utilization.maybe_flush()
                try:
                    await asyncio.wait_for(wake.wait(), timeout=1.0)
                except asyncio.TimeoutError:
                    pass
                next_start = loop.time()
                continue
            if self.lost_worker is not None:
                self.kill(self.lost_worker)
                break
            now = loop.time()
            start = next_start if now - LAG_TOLERANCE_SECONDS < next_start else now
            try:
                step = engine.schedule(start)
            except EngineDeadError as exc:
                self.kill(str(exc))
                break
            decode_only = not step.prefills and bool(step.decodes)
            cost = self.perf.step(step.prefill_lengths(), decode_contexts(step), step.swapped_blocks, self.block_bytes)
            factor = self._factor(decode_only, start) * self.scale
            end = start + cost.seconds * factor
            delay = end - loop.time()
            await asyncio.sleep(delay if delay > 0 else 0)
            if engine.dead or self.stopped:
                break
            now = loop.time()
            stats = engine.snapshot_stats(now)
            before = len(engine.groups)
            engine.finish_step(step, now, stats)
            self._system_stats(stats)
            self.finished_requests += max(0, before - len(engine.groups))
            self.steps += 1
            self._log(stats)
            if self.utilization is not None:
                self.utilization.record(cost.gpu_busy_seconds * factor, cost.memory_busy_seconds * factor)
            next_start = end

    def _system_stats(self, stats: StepStats) -> StepStats:
        """The system state over every virtual engine, the cache usage against the whole cache (0.5.4's
        _get_stats, v0.5.4 vllm/engine/llm_engine.py:977-1002)."""
        gpu_blocks, cpu_blocks = self.cache_blocks
        stats.num_running = sum(len(e.running) for e in self.engines)
        stats.num_waiting = sum(len(e.waiting) for e in self.engines)
        stats.num_swapped = sum(len(e.swapped) for e in self.engines)
        free_gpu = sum(e.free_gpu_blocks for e in self.engines)
        free_cpu = sum(e.free_cpu_blocks for e in self.engines)
        stats.gpu_cache_usage = (1.0 - free_gpu / gpu_blocks) if gpu_blocks else 0.0
        stats.cpu_cache_usage = (1.0 - free_cpu / cpu_blocks) if cpu_blocks else 0.0
        return stats

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
            if not self.dead and not self.stopped:
                self._log(self._system_stats(self.engines[0].snapshot_stats(time.monotonic())))

    def stop(self) -> None:
        self.stopped = True
        for wake in self.wakes:
            wake.set()


def state(runner: Runner) -> Dict[str, object]:
    return {"running": sum(len(e.running) for e in runner.engines),
            "waiting": sum(len(e.waiting) for e in runner.engines),
            "swapped": sum(len(e.swapped) for e in runner.engines), "steps": runner.steps}
