"""The engine core: vLLM 0.5.4's scheduler and v1 block manager, in virtual time.

This module has no clock and no I/O. The caller asks `schedule(now)` for the next step, asks the
`PerfModel` how long it takes, and calls `finish_step(step, end)` at the end time, which appends one
token per scheduled sequence and returns what each request got. The live server drives it with the
wall clock (runner.py); the calibration drives it with a virtual clock (calibrate.py): the same code.

Scheduling follows v0.5.4 vllm/core/scheduler.py `_schedule_default` (docs/facts/vllm-volta.md
§3.4-§3.5): if nothing is swapped, waiting prompts are admitted first-come-first-served within the token
budget (`max_num_batched_tokens`), the sequence budget (`max_num_seqs`, running sequences included) and
the KV blocks (admission keeps a 1 % watermark free); a step that admits prompts runs only prefills.
Otherwise every running group decodes one token, each needing one free block per running sequence
(0.5.4's heuristic); when blocks run out the last running group is preempted (recompute for single
sequences, swap for groups of several or with --preemption-mode swap; swapping without CPU blocks
aborts the engine as 0.5.4 does). Swapped groups come back when nothing was preempted. With chunked
prefill the decodes go first and prompts fill the remaining token budget in chunks.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

from vllm._twin import vlog
from vllm._twin.tokens import EOS_TOKEN_ID, TokenSource, sequence_seed, stop_string_hit

WAITING, RUNNING, SWAPPED, FINISHED = "waiting", "running", "swapped", "finished"


class EngineDeadError(RuntimeError):
    """The engine stopped (a worker died, swap space ran out); every request fails from now on."""


@dataclass
class SamplingParams:
    n: int = 1
    best_of: int = 1
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    include_stop_str_in_output: bool = False
    temperature: float = 1.0
    seed: Optional[int] = None


@dataclass
class GeneratedSequence:
    index: int
    source: TokenSource
    output_ids: List[int] = field(default_factory=list)
    text: str = ""
    finish_reason: Optional[str] = None
    stop_reason: Optional[object] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class TokenEvent:
    """What one sequence got in one step: the delta text and, at the end, why it finished."""

    index: int
    token_id: int
    delta_text: str
    num_output_tokens: int
    finish_reason: Optional[str]
    stop_reason: Optional[object]


@dataclass
class SequenceGroup:
    request_id: str
    prompt_len: int
    params: SamplingParams
    arrival_time: float
    sink: Callable[["SequenceGroup", List[TokenEvent]], None]
    seqs: List[GeneratedSequence] = field(default_factory=list)
    state: str = WAITING
    blocks: int = 0            # KV blocks held (GPU when running, CPU when swapped)
    computed_tokens: int = 0   # prompt tokens already prefilled (chunked prefill, recompute)
    prefill_target: int = 0    # tokens the current prefill must process
    last_token_time: float = 0.0
    first_token_time: Optional[float] = None
    first_scheduled_time: Optional[float] = None
    aborted: bool = False

    def live_seqs(self) -> List[GeneratedSequence]:
        return [s for s in self.seqs if not s.finished]

    def max_running_seqs(self) -> int:
        if self.state == WAITING and not any(s.output_ids for s in self.seqs):
            return self.params.best_of
        return len(self.live_seqs())

    def in_prefill(self) -> bool:
        return self.computed_tokens < self.prefill_target

    @property
    def finished(self) -> bool:
        return all(s.finished for s in self.seqs)


@dataclass
class EngineConfig:
    block_size: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    chunked_prefill: bool = False
    preemption_mode: Optional[str] = None
    delay_factor: float = 0.0
    seed: int = 0


@dataclass
class ScheduledStep:
    prefills: List[Tuple[SequenceGroup, int]]   # group, tokens this step
    decodes: List[SequenceGroup]
    ignored: List[SequenceGroup]
    preempted: int
    swapped_blocks: int

    @property
    def empty(self) -> bool:
        return not self.prefills and not self.decodes and not self.ignored

    def prefill_lengths(self) -> List[int]:
        return [tokens for _, tokens in self.prefills]


@dataclass
class StepStats:
    """What vLLM 0.5.4's _get_stats collects for one step (v0.5.4 engine/llm_engine.py:964)."""

    now: float
    num_running: int
    num_waiting: int
    num_swapped: int
    gpu_cache_usage: float
    cpu_cache_usage: float
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    time_to_first_tokens: List[float] = field(default_factory=list)
    time_per_output_tokens: List[float] = field(default_factory=list)
    e2e_latencies: List[float] = field(default_factory=list)
    request_prompt_tokens: List[int] = field(default_factory=list)
    request_generation_tokens: List[int] = field(default_factory=list)
    request_best_of: List[int] = field(default_factory=list)
    request_n: List[int] = field(default_factory=list)
    finished_reasons: List[str] = field(default_factory=list)
    # what 0.8.5.post1's _get_stats adds (v0.8.5.post1:vllm/engine/llm_engine.py:1783-1824)
    request_max_tokens: List[int] = field(default_factory=list)
    request_max_generation_tokens: List[int] = field(default_factory=list)
    queue_times: List[float] = field(default_factory=list)
    prefill_times: List[float] = field(default_factory=list)
    decode_times: List[float] = field(default_factory=list)
    inference_times: List[float] = field(default_factory=list)


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.waiting: Deque[SequenceGroup] = deque()
        self.running: Deque[SequenceGroup] = deque()
        self.swapped: Deque[SequenceGroup] = deque()
        self.groups: Dict[str, SequenceGroup] = {}
        self.free_gpu_blocks = config.num_gpu_blocks
        self.free_cpu_blocks = config.num_cpu_blocks
        self.watermark_blocks = int(0.01 * config.num_gpu_blocks)
        self.num_cumulative_preemption = 0
        self.request_counter = 0
        self.dead: Optional[str] = None
        self._prev_time = 0.0
        self._prev_prompt = False
        self._last_prompt_latency = 0.0

    # --- requests -------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_len: int, params: SamplingParams, arrival_time: float,
                    sink: Callable[[SequenceGroup, List[TokenEvent]], None], prompt_key: int = 0,
                    answer_median: Optional[float] = None) -> SequenceGroup:
        if self.dead:
            raise EngineDeadError(self.dead)
        self.request_counter += 1
        if params.seed is not None:
            base: Tuple[object, ...] = ("seed", params.seed, prompt_key)
        elif params.temperature == 0:
            base = ("greedy", prompt_key)
        else:
            base = ("engine", self.config.seed, self.request_counter)
        seqs = []
        for index in range(params.best_of):
            seed = sequence_seed(*base, index)
            source = (TokenSource.create(seed, median=answer_median) if answer_median
                      else TokenSource.create(seed))
            seqs.append(GeneratedSequence(index=index, source=source))
        group = SequenceGroup(request_id=request_id, prompt_len=prompt_len, params=params,
                              arrival_time=arrival_time, sink=sink, seqs=seqs, last_token_time=arrival_time,
                              prefill_target=prompt_len)
        self.groups[request_id] = group
        self.waiting.append(group)
        return group

    def abort(self, request_id: str) -> None:
        """Drop a request (client went away): its blocks are freed, nothing more is produced."""
        group = self.groups.pop(request_id, None)
        if group is None:
            return
        group.aborted = True
        for queue in (self.waiting, self.running, self.swapped):
            if group in queue:
                queue.remove(group)
        self._free(group)
        for seq in group.seqs:
            if not seq.finished:
                seq.finish_reason = "abort"

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # --- blocks ---------------------------------------------------------------------------------
    def _blocks_needed(self, group: SequenceGroup) -> int:
        """Blocks for the tokens whose KV exists: the prompt blocks are shared by a group's sequences."""
        bs = self.config.block_size
        live = group.live_seqs() or group.seqs[:1]
        if len(live) == 1:
            return -(-(group.prompt_len + len(live[0].output_ids)) // bs)
        shared = group.prompt_len // bs
        return shared + sum(-(-(group.prompt_len + len(s.output_ids)) // bs) - shared for s in live)

    def _free(self, group: SequenceGroup) -> None:
        if group.state == RUNNING:
            self.free_gpu_blocks += group.blocks
        elif group.state == SWAPPED:
            self.free_cpu_blocks += group.blocks
        group.blocks = 0

    # --- scheduling -----------------------------------------------------------------------------
    def _passed_delay(self, now: float) -> bool:
        """--scheduler-delay-factor, as 0.5.4's Scheduler._passed_delay."""
        if self._prev_prompt:
            self._last_prompt_latency = now - self._prev_time
        self._prev_time, self._prev_prompt = now, False
        if self.config.delay_factor > 0 and self.waiting:
            earliest = min(g.arrival_time for g in self.waiting)
            return (now - earliest) > self.config.delay_factor * self._last_prompt_latency or not self.running
        return True

    def _prompt_limit(self) -> int:
        if self.config.chunked_prefill:
            return self.config.max_model_len
        return min(self.config.max_model_len, self.config.max_num_batched_tokens)

    def schedule(self, now: float) -> ScheduledStep:
        if self.dead:
            raise EngineDeadError(self.dead)
        if self.config.chunked_prefill:
            return self._schedule_chunked(now)
        token_budget = self.config.max_num_batched_tokens
        num_seqs = sum(len(g.live_seqs()) for g in self.running)
        batched = 0
        prefills: List[Tuple[SequenceGroup, int]] = []
        ignored: List[SequenceGroup] = []
        if not self.swapped:
            passed = self._passed_delay(now)
            while passed and self.waiting:
                group = self.waiting[0]
                tokens = group.prefill_target
                if tokens > self._prompt_limit():
                    vlog.warning("scheduler.py:692", f"Input prompt ({tokens} tokens) is too long and "
                                 f"exceeds limit of {self._prompt_limit()}")
                    self.waiting.popleft()
                    ignored.append(group)
                    continue
                required = -(-tokens // self.config.block_size)
                if self.config.num_gpu_blocks - required < self.watermark_blocks:
                    vlog.warning("scheduler.py:706", f"Input prompt ({tokens} tokens) is too long and "
                                 "exceeds the capacity of block_manager")
                    self.waiting.popleft()
                    ignored.append(group)
                    continue
                if self.free_gpu_blocks - required < self.watermark_blocks:
                    break
                new_seqs = group.max_running_seqs()
                if batched + tokens > token_budget or num_seqs + new_seqs > self.config.max_num_seqs:
                    break
                self.waiting.popleft()
                group.blocks = required
                self.free_gpu_blocks -= required
                group.state = RUNNING
                if group.first_scheduled_time is None:
                    group.first_scheduled_time = now
                self.running.append(group)
                prefills.append((group, tokens))
                batched += tokens
                num_seqs += new_seqs
            if prefills:
                self._prev_prompt = True
        preempted = 0
        swapped_blocks = 0
        decodes: List[SequenceGroup] = []
        if not prefills:
            decodes, preempted, swapped_blocks = self._schedule_running()
            if preempted == 0:
                swapped_blocks += self._schedule_swapped(decodes, len(decodes))
        return ScheduledStep(prefills, decodes, ignored, preempted, swapped_blocks)

    def _schedule_running(self) -> Tuple[List[SequenceGroup], int, int]:
        decodes: List[SequenceGroup] = []
        preempted = 0
        swapped_blocks = 0
        queue = self.running
        kept: Deque[SequenceGroup] = deque()
        while queue:
            group = queue.popleft()
            needed = len(group.live_seqs())
            while self.free_gpu_blocks < needed:
                victim = queue.pop() if queue else group
                moved = self._preempt(victim)
                preempted += 1
                swapped_blocks += moved
                if victim is group:
                    break
            else:
                grow = self._blocks_needed(group) - group.blocks
                if grow > 0:
                    group.blocks += grow
                    self.free_gpu_blocks -= grow
                decodes.append(group)
                kept.append(group)
                continue
        self.running = kept
        return decodes, preempted, swapped_blocks

    def _preempt(self, group: SequenceGroup) -> int:
        mode = self.config.preemption_mode
        if mode is None:
            use_swap = group.max_running_seqs() > 1
        else:
            use_swap = mode == "swap"
        if self.num_cumulative_preemption % 50 == 0:
            vlog.warning(
                "scheduler.py:1099",
                f"Sequence group {group.request_id} is preempted by "
                f"{'PreemptionMode.SWAP' if use_swap else 'PreemptionMode.RECOMPUTE'} mode because there is "
                "not enough KV cache space. This can affect the end-to-end performance. Increase "
                "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
                f"total_num_cumulative_preemption={self.num_cumulative_preemption + 1}")
        self.num_cumulative_preemption += 1
        if use_swap:
            if group.blocks > self.free_cpu_blocks:
                self.dead = ("Aborted due to the lack of CPU swap space. Please increase the swap space to "
                             "avoid this error.")
                raise EngineDeadError(self.dead)
            self.free_gpu_blocks += group.blocks
            self.free_cpu_blocks -= group.blocks
            group.state = SWAPPED
            self.swapped.append(group)
            return group.blocks
        self.free_gpu_blocks += group.blocks
        group.blocks = 0
        group.state = WAITING
        group.computed_tokens = 0
        live = group.live_seqs()
        group.prefill_target = group.prompt_len + (len(live[0].output_ids) if live else 0)
        self.waiting.appendleft(group)
        return 0

    def _schedule_swapped(self, decodes: List[SequenceGroup], num_seqs: int) -> int:
        moved = 0
        while self.swapped:
            group = self.swapped[0]
            required = group.blocks + len(group.live_seqs())
            if self.free_gpu_blocks - required < self.watermark_blocks:
                break
            if num_seqs + len(group.live_seqs()) > self.config.max_num_seqs:
                break
            self.swapped.popleft()
            self.free_cpu_blocks += group.blocks
            self.free_gpu_blocks -= group.blocks
            group.state = RUNNING
            self.running.append(group)
            decodes.append(group)
            num_seqs += len(group.live_seqs())
            moved += group.blocks
        return moved

    def _schedule_chunked(self, now: float) -> ScheduledStep:
        """0.5.4's chunked-prefill policy: decodes first, then prompt chunks in the leftover budget."""
        budget = self.config.max_num_batched_tokens
        decodes, preempted, swapped_blocks = self._schedule_running()
        budget -= len(decodes)
        num_seqs = sum(len(g.live_seqs()) for g in self.running)
        prefills: List[Tuple[SequenceGroup, int]] = []
        for group in list(self.running):
            if group.in_prefill() and group not in decodes and budget > 0:
                tokens = min(group.prefill_target - group.computed_tokens, budget)
                prefills.append((group, tokens))
                budget -= tokens
        decodes = [g for g in decodes if not g.in_prefill()]
        ignored: List[SequenceGroup] = []
        while self.waiting and budget > 0 and not self.swapped:
            group = self.waiting[0]
            if group.prefill_target > self._prompt_limit():
                self.waiting.popleft()
                ignored.append(group)
                continue
            required = -(-group.prefill_target // self.config.block_size)
            if self.free_gpu_blocks - required < self.watermark_blocks:
                break
            if num_seqs + group.max_running_seqs() > self.config.max_num_seqs:
                break
            self.waiting.popleft()
            tokens = min(group.prefill_target, budget)
            group.blocks = required
            self.free_gpu_blocks -= required
            group.state = RUNNING
            if group.first_scheduled_time is None:
                group.first_scheduled_time = now
            self.running.append(group)
            prefills.append((group, tokens))
            budget -= tokens
            num_seqs += group.max_running_seqs()
        if preempted == 0 and not prefills:
            swapped_blocks += self._schedule_swapped(decodes, num_seqs)
        return ScheduledStep(prefills, decodes, ignored, preempted, swapped_blocks)

    # --- step completion ------------------------------------------------------------------------
    def finish_step(self, step: ScheduledStep, now: float, stats: Optional[StepStats] = None) -> None:
        """Apply the step that just ran: one new token per sequence that was prefilled or decoded."""
        cfg = self.config
        if stats is not None:
            stats.num_preemptions = step.preempted
        for group in step.ignored:
            self.groups.pop(group.request_id, None)
            for seq in group.seqs:
                seq.finish_reason = "length"
            group.state = FINISHED
            if not group.aborted:
                group.sink(group, [TokenEvent(s.index, -1, "", 0, "length", None) for s in group.seqs])
        for group, tokens in step.prefills:
            if group.aborted:
                continue
            group.computed_tokens += tokens
            if stats is not None:
                stats.num_prompt_tokens += tokens
            if group.in_prefill():
                continue
            if stats is not None:
                stats.time_to_first_tokens.append(now - group.last_token_time)
                stats.num_generation_tokens += len(group.live_seqs())
            self._emit(group, now, stats)
        for group in step.decodes:
            if group.aborted:
                continue
            if stats is not None:
                stats.time_per_output_tokens.append(now - group.last_token_time)
                stats.num_generation_tokens += len(group.live_seqs())
            self._emit(group, now, stats)
        if stats is not None:
            stats.num_running = len(self.running)
            stats.num_waiting = len(self.waiting)
            stats.num_swapped = len(self.swapped)
            stats.gpu_cache_usage = (1.0 - self.free_gpu_blocks / cfg.num_gpu_blocks) if cfg.num_gpu_blocks else 0.0
            stats.cpu_cache_usage = (1.0 - self.free_cpu_blocks / cfg.num_cpu_blocks) if cfg.num_cpu_blocks else 0.0

    def _emit(self, group: SequenceGroup, now: float, stats: Optional[StepStats]) -> None:
        params = group.params
        events: List[TokenEvent] = []
        for seq in group.live_seqs():
            position = len(seq.output_ids) + 1
            eos_allowed = not params.ignore_eos and position > params.min_tokens
            token_id, piece = seq.source.next_token(position, eos_allowed)
            seq.output_ids.append(token_id)
            before = len(seq.text)
            seq.text += piece
            finish, stop_reason = None, None
            if position > params.min_tokens:
                if token_id == EOS_TOKEN_ID and not params.ignore_eos:
                    finish = "stop"
                elif token_id in params.stop_token_ids:
                    finish, stop_reason = "stop", token_id
                else:
                    hit = stop_string_hit(seq.text, len(piece), params.stop)
                    if hit is not None:
                        stop, index = hit
                        seq.text = seq.text[:index + len(stop)] if params.include_stop_str_in_output \
                            else seq.text[:index]
                        finish, stop_reason = "stop", stop
            if finish is None and (group.prompt_len + position > self.config.max_model_len
                                   or position >= params.max_tokens):
                finish = "length"
            seq.finish_reason, seq.stop_reason = finish, stop_reason
            delta = seq.text[before:] if len(seq.text) > before else ""
            events.append(TokenEvent(seq.index, token_id, delta, position, finish, stop_reason))
        group.last_token_time = now
        if group.first_token_time is None:
            group.first_token_time = now
        if group.finished:
            self._finish(group, now, stats)
        else:
            grow = self._blocks_needed(group) - group.blocks
            if grow < 0:
                group.blocks += grow
                self.free_gpu_blocks -= grow
        group.sink(group, events)

    def _finish(self, group: SequenceGroup, now: float, stats: Optional[StepStats]) -> None:
        if group in self.running:
            self.running.remove(group)
        self._free(group)
        group.state = FINISHED
        self.groups.pop(group.request_id, None)
        if stats is not None:
            stats.e2e_latencies.append(now - group.arrival_time)
            stats.request_prompt_tokens.append(group.prompt_len)
            stats.request_generation_tokens.extend(len(s.output_ids) for s in group.seqs)
            stats.request_best_of.append(group.params.best_of)
            stats.request_n.append(group.params.n)
            stats.finished_reasons.extend(s.finish_reason or "stop" for s in group.seqs)
            stats.request_max_tokens.append(group.params.max_tokens)
            stats.request_max_generation_tokens.append(max(len(s.output_ids) for s in group.seqs))
            if group.first_scheduled_time is not None and group.first_token_time is not None:
                stats.queue_times.append(group.first_scheduled_time - group.arrival_time)
                stats.prefill_times.append(group.first_token_time - group.first_scheduled_time)
                stats.decode_times.append(now - group.first_token_time)
                stats.inference_times.append(now - group.first_scheduled_time)

    def snapshot_stats(self, now: float) -> StepStats:
        cfg = self.config
        return StepStats(
            now=now, num_running=len(self.running), num_waiting=len(self.waiting), num_swapped=len(self.swapped),
            gpu_cache_usage=(1.0 - self.free_gpu_blocks / cfg.num_gpu_blocks) if cfg.num_gpu_blocks else 0.0,
            cpu_cache_usage=(1.0 - self.free_cpu_blocks / cfg.num_cpu_blocks) if cfg.num_cpu_blocks else 0.0)

    def kill(self, reason: str) -> None:
        """The engine is dead (e.g. a worker process died): nothing runs any more."""
        self.dead = reason


def decode_contexts(step: ScheduledStep) -> List[int]:
    """Context length of every sequence decoded in `step` (for the attention cost)."""
    contexts = []
    for group in step.decodes:
        for seq in group.live_seqs():
            contexts.append(group.prompt_len + len(seq.output_ids))
    return contexts

