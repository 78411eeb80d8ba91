"""Warm-up of one vLLM replica before it takes traffic, and the hand-over report it leaves on the node.

Why (docs/field-report.md ('Failures met') 5): the first requests after a cold start took over 10 s, so the operator
sent ~20 ordinary requests and waited for latency to settle; `/health` answers long before that
(docs/facts/lb-and-rolling.md §1.4: 0.5.4's /health only asks the engine whether it is alive). Used by
library/vllm_warmup.py; runs on the node with the system python3 (3.9+, standard library only).

Steps, each failing with what was seen:
1. Wait for GET /health = 200 until a deadline, while watching the systemd unit. A unit that is failed,
   waiting to restart, restarted (NRestarts grew) or was started anew (InvocationID changed) fails the
   wait at the next poll, quoting `journalctl -u UNIT -n 20`, instead of waiting out the deadline.
   Three HTTP answers other than 200 in a row fail too (0.5.4 answers 500 once its engine is dead).
2. GET /v1/models lists the served model name; GET /version says what runs (the lab's twin says
   `"simulated": true` and its time scale).
3. Warm-up requests, streamed (module_utils/revive_sse.py), `concurrency` at a time in a closed loop, from
   the bundled prompts below or the operator's. Every one must be a good answer (HTTP 200, text, [DONE],
   finish_reason, sane usage); the first bad one stops the warm-up.
4. The settle rule (SettleRule): after at least `requests` answers, with w = window, take the answers in
   the order they completed; latency has settled when the median of `metric` over the last w answers is
   within `tolerance` (relative, either direction) of the median over the w answers before them. Until
   it holds, w more requests are sent, up to `max_requests`; then the warm-up fails with the numbers.
5. Optional limits on the settled medians (TTFT, TPOT). On the twin they are compared in its modelled
   seconds (measured / time_scale from /version), so the lab can keep production limits.
"""
from __future__ import annotations

import datetime
import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ansible.module_utils.revive_files import write_json_atomic
from ansible.module_utils.revive_sse import (
    ConnectionFactory,
    Endpoint,
    StreamRequest,
    StreamResult,
    connect,
    get,
    get_json,
    stream,
)

REPORT_SCHEMA = 1
JOURNAL_LINES = 20
UNIT_PROPERTIES = ("ActiveState", "SubState", "NRestarts", "ExecMainStatus", "InvocationID", "MainPID", "Result")
METRICS = ("tpot", "ttft", "e2e")
BAD_HEALTH_ANSWERS = 3

# (rc, stdout, stderr) for an argv; AnsibleModule.run_command has this shape.
Runner = Callable[[List[str]], Tuple[int, str, str]]

# Ordinary requests of the kind the fleet serves: questions, summaries, code, rewriting; short and long
# prompts, so that prefill and decode both warm up. Written for this project.
BUNDLED_PROMPTS: Tuple[str, ...] = (
    "What is the difference between a process and a thread? Answer in a short paragraph.",
    "Summarise the following incident note for a status page, in two sentences: At 09:12 the primary "
    "database node lost its network link after a switch firmware upgrade. Replication lag rose to 40 "
    "seconds before the standby was promoted at 09:19. Writes failed for seven minutes; reads were served "
    "from replicas throughout. The switch was rolled back at 09:40 and the old primary rejoined as a standby.",
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "Explain to a new colleague what a load balancer health check is and why it can be misleading.",
    "Translate into French: The maintenance window starts at 22:00 and should last no more than an hour.",
    "List five things to check before rebooting a production server, one line each.",
    "A customer writes: 'My invoice shows two charges for the same month.' Draft a polite first reply.",
    "What does the Linux command `ss -tlnp` show? Give an example of reading its output.",
    "Give three arguments for and three against storing configuration in environment variables.",
    "Rewrite this sentence to be clearer: 'The thing that we did not do was the update of the server that "
    "had the problem because of the time.'",
    "Describe how a hash map handles collisions, with a small example.",
    "Write a SQL query that returns the ten customers with the highest total order value in 2023, from "
    "tables customers(id, name) and orders(id, customer_id, amount, created_at).",
    "What is the capital of Australia, and why is it not Sydney?",
    "Explain exponential backoff with jitter and when a client should use it.",
    "Draft a short commit message for a change that fixes an off-by-one error in pagination.",
    "Here is a log excerpt: 'ERROR connection pool exhausted (max=20, in_use=20, waiting=57)'. What are the "
    "likely causes and what would you look at first?",
    "Summarise the plot of a classic detective story in one paragraph without naming the detective.",
    "Compare TCP and UDP for a real-time multiplayer game. Keep it under 150 words.",
    "Write a bash one-liner that prints the five largest files under /var/log.",
    "What questions should I ask before choosing between PostgreSQL and MongoDB for a new service?",
    "Explain what a GPU's memory bandwidth means for serving large language models.",
    "Give a step-by-step plan to migrate a cron job to a systemd timer.",
    "Proofread: 'Their going to deploy the the new version tomorow, if the test's pass.'",
    "Write a haiku about a data centre at night.",
)


class WarmupError(Exception):
    """The replica did not prove itself; the message says what was seen, where, and what to look at."""


@dataclass
class SettleRule:
    metric: str = "tpot"
    window: int = 5
    tolerance: float = 0.25

    def validate(self) -> None:
        if self.metric not in METRICS:
            raise WarmupError(f"settle metric {self.metric!r} is not one of {', '.join(METRICS)}")
        if self.window < 2:
            raise WarmupError(f"settle window {self.window} is too small: at least 2 answers per window")
        if not 0 < self.tolerance < 10:
            raise WarmupError(f"settle tolerance {self.tolerance} must be a positive fraction, e.g. 0.25")


@dataclass
class Verdict:
    settled: bool
    last_median: Optional[float]
    previous_median: Optional[float]
    change: Optional[float]          # last / previous - 1
    compared: int                    # answers the rule looked at (2 x window, or fewer when too few)

    def describe(self, rule: SettleRule) -> str:
        if self.last_median is None or self.previous_median is None:
            return f"{self.compared} answers with a {rule.metric}: the rule needs {2 * rule.window}"
        return (f"median {rule.metric} of the last {rule.window} answers {self.last_median:.4f} s vs "
                f"{self.previous_median:.4f} s of the {rule.window} before ({self.change:+.0%}; tolerance "
                f"±{rule.tolerance:.0%})")


def settle_verdict(values: Sequence[Optional[float]], rule: SettleRule) -> Verdict:
    """The settle rule over per-answer values in completion order (None = the metric is undefined)."""
    known = [value for value in values if value is not None]
    if len(known) < 2 * rule.window:
        return Verdict(False, None, None, None, len(known))
    last = statistics.median(known[-rule.window:])
    previous = statistics.median(known[-2 * rule.window:-rule.window])
    if previous <= 0:
        return Verdict(last <= 0, last, previous, None, 2 * rule.window)
    change = last / previous - 1
    return Verdict(abs(change) <= rule.tolerance, last, previous, change, 2 * rule.window)


@dataclass
class UnitState:
    active_state: str = ""
    sub_state: str = ""
    n_restarts: int = 0
    exec_main_status: int = 0
    invocation_id: str = ""
    main_pid: int = 0
    result: str = ""

    def describe(self) -> str:
        return (f"{self.active_state}/{self.sub_state}, NRestarts={self.n_restarts}, "
                f"ExecMainStatus={self.exec_main_status}, Result={self.result}")


def parse_unit_show(text: str) -> UnitState:
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def number(key: str) -> int:
        try:
            return int(values.get(key) or 0)
        except ValueError:
            return 0

    return UnitState(active_state=values.get("ActiveState", ""), sub_state=values.get("SubState", ""),
                     n_restarts=number("NRestarts"), exec_main_status=number("ExecMainStatus"),
                     invocation_id=values.get("InvocationID", ""), main_pid=number("MainPID"),
                     result=values.get("Result", ""))


def read_unit(unit: str, runner: Runner) -> UnitState:
    argv = ["systemctl", "show", "--property=" + ",".join(UNIT_PROPERTIES), unit]
    rc, out, err = runner(argv)
    if rc != 0:
        raise WarmupError(f"`{' '.join(argv)}` failed (rc {rc}): {err.strip() or out.strip()}")
    state = parse_unit_show(out)
    if not state.active_state:
        raise WarmupError(f"`{' '.join(argv)}` printed no ActiveState; is {unit} a systemd unit on this node?")
    return state


def journal_tail(unit: str, runner: Runner, lines: int = JOURNAL_LINES) -> List[str]:
    argv = ["journalctl", "--unit", unit, "--lines", str(lines), "--no-pager", "--output", "short-iso"]
    rc, out, err = runner(argv)
    if rc != 0:
        return [f"(journalctl failed, rc {rc}: {err.strip()})"]
    return [line for line in out.splitlines() if line.strip()][-lines:]


def unit_trouble(baseline: UnitState, now: UnitState) -> Optional[str]:
    """Why the unit cannot be becoming healthy, or None while it still can."""
    if now.active_state == "failed":
        return f"the unit has failed ({now.describe()})"
    if now.active_state in ("inactive", "deactivating"):
        return f"the unit is not running ({now.describe()})"
    if now.sub_state == "auto-restart":
        return f"the unit's process exited and systemd is about to restart it ({now.describe()})"
    if now.n_restarts > baseline.n_restarts:
        return (f"the unit restarted {now.n_restarts - baseline.n_restarts} time(s) during the wait "
                f"({now.describe()}): a crash loop")
    if baseline.invocation_id and now.invocation_id and now.invocation_id != baseline.invocation_id:
        return f"the unit was started anew during the wait ({now.describe()})"
    return None


@dataclass
class Deps:
    """What the warm-up touches outside itself, injectable for tests."""
    runner: Runner
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    connection_factory: ConnectionFactory = connect
    perf_clock: Callable[[], float] = time.perf_counter
    now_iso: Callable[[], str] = lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclass
class HealthWait:
    waited_s: float
    polls: int
    unit_before: Optional[Dict[str, Any]] = None
    unit_after: Optional[Dict[str, Any]] = None


def _unit_failure(unit: str, what: str, deps: Deps) -> WarmupError:
    lines = journal_tail(unit, deps.runner)
    return WarmupError(f"{what}. Last {len(lines)} journal lines of {unit}:\n" + "\n".join(lines))


def wait_for_health(endpoint: Endpoint, unit: Optional[str], deadline_s: float, interval_s: float,
                    deps: Deps) -> HealthWait:
    """Poll /health until 200, watching the unit at every poll (see the module docstring, step 1)."""
    probe = Endpoint(endpoint.host, endpoint.port, endpoint.api_key, timeout=min(5.0, max(interval_s, 1.0)),
                     tls=endpoint.tls, ca_file=endpoint.ca_file)
    start = deps.clock()
    baseline = read_unit(unit, deps.runner) if unit else None
    if unit and baseline is not None:
        # Already failed, stopped or waiting to restart before the wait began (restart counters are compared later).
        trouble = unit_trouble(UnitState(n_restarts=baseline.n_restarts, invocation_id=baseline.invocation_id),
                               baseline)
        if trouble:
            raise _unit_failure(unit, f"{unit} on {endpoint.label()}: {trouble}", deps)
    polls = 0
    bad_answers: List[str] = []
    last = "no answer yet"
    while True:
        polls += 1
        if unit and baseline is not None:
            current = read_unit(unit, deps.runner)
            trouble = unit_trouble(baseline, current)
            if trouble:
                waited = deps.clock() - start
                raise _unit_failure(unit, f"{unit} did not become healthy: {trouble}, {waited:.1f} s into the "
                                          f"wait for {endpoint.label()}/health", deps)
        try:
            status, body = get(probe, "/health", deps.connection_factory)
            last = f"HTTP {status}"
            if status == 200:
                after = read_unit(unit, deps.runner) if unit else None
                return HealthWait(deps.clock() - start, polls, asdict(baseline) if baseline else None,
                                  asdict(after) if after else None)
            bad_answers.append(f"HTTP {status} {body[:120].decode('utf-8', errors='replace')!r}")
            if len(bad_answers) >= BAD_HEALTH_ANSWERS:
                what = (f"{endpoint.label()}/health answered {len(bad_answers)} times in a row without 200 "
                        f"({'; '.join(bad_answers[-BAD_HEALTH_ANSWERS:])}): vLLM answers 500 once its engine died")
                raise _unit_failure(unit, what, deps) if unit else WarmupError(what)
        except (OSError, ValueError) as error:
            bad_answers = []
            last = f"{type(error).__name__}: {error}"
        waited = deps.clock() - start
        if waited >= deadline_s:
            what = (f"{endpoint.label()}/health did not answer 200 within {deadline_s:g} s (last: {last}); the "
                    "unit is still running, so the server is loading slowly or hangs (0.5.4 in its default "
                    "frontend mode hangs with the port closed after an engine error, vLLM #7213)")
            raise _unit_failure(unit, what, deps) if unit else WarmupError(what)
        deps.sleep(min(interval_s, max(0.0, deadline_s - waited)))


def served_models(endpoint: Endpoint, deps: Deps) -> List[str]:
    data = get_json(endpoint, "/v1/models", deps.connection_factory)
    return [str(card.get("id")) for card in (data.get("data") or []) if isinstance(card, dict)]


@dataclass
class Simulation:
    vllm_version: str
    vllm_simulated: bool
    time_scale: float
    gpus_simulated: Optional[bool]

    @property
    def any(self) -> bool:
        return self.vllm_simulated or bool(self.gpus_simulated)


def simulation(version: Dict[str, Any], gpus_simulated: Optional[bool]) -> Simulation:
    """Real vLLM 0.5.4's /version is {"version": "0.5.4"}; the lab's twin adds simulated and its time scale."""
    twin = version.get("twin") if isinstance(version.get("twin"), dict) else {}
    simulated = bool(version.get("simulated"))
    scale = float(twin.get("time_scale") or 1.0) if simulated else 1.0
    return Simulation(str(version.get("version") or "unknown"), simulated, scale, gpus_simulated)


@dataclass
class Answer:
    index: int
    prompt: int                      # index into the prompt list
    ok: bool
    error: str
    ttft_s: Optional[float]
    tpot_s: Optional[float]
    e2e_s: Optional[float]
    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    finish_reason: Optional[str]

    def metric(self, name: str) -> Optional[float]:
        return {"tpot": self.tpot_s, "ttft": self.ttft_s, "e2e": self.e2e_s}[name]


def _answer(index: int, prompt: int, result: StreamResult) -> Answer:
    rounded = {key: (round(value, 4) if value is not None else None)
               for key, value in (("ttft", result.ttft_s), ("tpot", result.tpot_s), ("e2e", result.e2e_s))}
    return Answer(index, prompt, result.ok, result.error(), rounded["ttft"], rounded["tpot"], rounded["e2e"],
                  result.prompt_tokens, result.completion_tokens,
                  result.finish_reasons[0] if result.finish_reasons else None)


@dataclass
class RequestPlan:
    kind: str
    model: str
    prompts: Sequence[str]
    max_tokens: int
    temperature: float
    concurrency: int

    def request(self, number: int) -> Tuple[int, StreamRequest]:
        index = number % len(self.prompts)
        text = self.prompts[index]
        if self.kind == "chat":
            return index, StreamRequest("chat", self.model, messages=[{"role": "user", "content": text}],
                                        max_tokens=self.max_tokens, temperature=self.temperature)
        return index, StreamRequest("completions", self.model, prompt=text, max_tokens=self.max_tokens,
                                    temperature=self.temperature)


def send_batch(endpoint: Endpoint, plan: RequestPlan, first: int, count: int, deps: Deps) -> List[Answer]:
    """Requests first..first+count-1, `concurrency` in flight, in completion order; stops at the first bad one."""
    answers: List[Answer] = []
    lock = threading.Lock()
    stop = threading.Event()
    numbers = iter(range(first, first + count))

    def worker() -> None:
        while not stop.is_set():
            with lock:
                number = next(numbers, None)
            if number is None:
                return
            prompt, request = plan.request(number)
            answer = _answer(number, prompt, stream(endpoint, request, deps.perf_clock, deps.connection_factory))
            with lock:
                answers.append(answer)
            if not answer.ok:
                stop.set()

    threads = [threading.Thread(target=worker, name=f"warmup-{i}", daemon=True)
               for i in range(max(1, min(plan.concurrency, count)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


@dataclass
class WarmupSpec:
    endpoint: Endpoint
    served_model_name: str
    unit: Optional[str] = None
    health_timeout_s: float = 900.0
    poll_interval_s: float = 1.0
    requests: int = 20
    max_requests: int = 60
    concurrency: int = 4
    kind: str = "chat"
    max_tokens: int = 128
    temperature: float = 0.7
    prompts: Sequence[str] = BUNDLED_PROMPTS
    settle: SettleRule = field(default_factory=SettleRule)
    max_ttft_s: float = 0.0          # 0 = no limit; in modelled seconds on the twin
    max_tpot_s: float = 0.0
    gpus_simulated: Optional[bool] = None

    def validate(self) -> None:
        self.settle.validate()
        if self.requests < 2 * self.settle.window:
            raise WarmupError(f"{self.requests} warm-up requests cannot satisfy the settle rule, which compares two "
                              f"windows of {self.settle.window}: send at least {2 * self.settle.window}")
        if self.max_requests < self.requests:
            raise WarmupError(f"max_requests {self.max_requests} is below requests {self.requests}")
        if self.concurrency < 1:
            raise WarmupError(f"concurrency {self.concurrency} must be at least 1")
        if not self.prompts or not all(isinstance(p, str) and p.strip() for p in self.prompts):
            raise WarmupError("the warm-up prompts must be a non-empty list of non-empty strings")


@dataclass
class WarmupOutcome:
    passed: bool
    message: str
    report: Dict[str, Any]


def _medians(answers: Sequence[Answer], window: int) -> Dict[str, Optional[float]]:
    tail = list(answers)[-window:]
    result: Dict[str, Optional[float]] = {}
    for name in METRICS:
        values = [a.metric(name) for a in tail if a.metric(name) is not None]
        result[name] = round(statistics.median(values), 4) if values else None
    return result


def _limit_problems(medians: Dict[str, Optional[float]], spec: WarmupSpec, sim: Simulation) -> List[str]:
    problems = []
    for name, limit in (("ttft", spec.max_ttft_s), ("tpot", spec.max_tpot_s)):
        value = medians.get(name)
        if limit and value is not None:
            modelled = value / sim.time_scale
            if modelled > limit:
                scale = f" (measured {value:.4f} s / twin time scale {sim.time_scale:g})" if sim.time_scale != 1 else ""
                problems.append(f"settled median {name.upper()} {modelled:.3f} s{scale} exceeds the limit {limit:g} s")
    return problems


def warm_up(spec: WarmupSpec, deps: Deps, release: Optional[Dict[str, Any]] = None,
            plan: Optional[Dict[str, Any]] = None, replica: str = "") -> WarmupOutcome:
    """Steps 1-5 of the module docstring; raises WarmupError before any request, returns an outcome after."""
    spec.validate()
    endpoint = spec.endpoint
    health = wait_for_health(endpoint, spec.unit, spec.health_timeout_s, spec.poll_interval_s, deps)
    try:
        models = served_models(endpoint, deps)
        version = get_json(endpoint, "/version", deps.connection_factory)
    except (OSError, ValueError) as error:
        raise WarmupError(f"{endpoint.label()} is healthy but /v1/models or /version failed: {error}") from error
    if spec.served_model_name not in models:
        raise WarmupError(f"{endpoint.label()}/v1/models lists {models}, not the served model name "
                          f"{spec.served_model_name!r}: the unit serves another model or --served-model-name differs")
    sim = simulation(version if isinstance(version, dict) else {}, spec.gpus_simulated)
    request_plan = RequestPlan(spec.kind, spec.served_model_name, list(spec.prompts), spec.max_tokens,
                               spec.temperature, spec.concurrency)
    answers: List[Answer] = []
    target = spec.requests
    started = deps.clock()
    failure = ""
    verdict = settle_verdict([], spec.settle)
    while True:
        batch = send_batch(endpoint, request_plan, len(answers), target - len(answers), deps)
        answers.extend(batch)
        bad = sorted((a for a in batch if not a.ok), key=lambda a: a.index)
        if bad:
            # The lowest-numbered failure, not the first to come back: with requests in flight together the
            # completion order is a race, and the report must not change from one run to the next.
            others = f" ({len(bad) - 1} more of the {len(batch)} answers failed)" if len(bad) > 1 else ""
            failure = f"warm-up request {bad[0].index + 1} failed: {bad[0].error}{others}"
            if spec.unit:
                state = read_unit(spec.unit, deps.runner)
                failure += f" (unit {spec.unit}: {state.describe()})"
            break
        verdict = settle_verdict([a.metric(spec.settle.metric) for a in answers], spec.settle)
        if verdict.settled or target >= spec.max_requests:
            break
        target = min(spec.max_requests, target + spec.settle.window)
    duration = deps.clock() - started
    medians = _medians(answers, spec.settle.window)
    if not failure and not verdict.settled:
        failure = (f"latency did not settle within {len(answers)} requests: {verdict.describe(spec.settle)}; "
                   f"{spec.settle.metric} per answer: {[a.metric(spec.settle.metric) for a in answers]}")
    if not failure:
        problems = _limit_problems(medians, spec, sim)
        if problems:
            failure = "; ".join(problems) + f" after {len(answers)} requests (settled: {verdict.describe(spec.settle)})"
    passed = not failure
    message = (f"{replica or spec.unit or endpoint.label()}: warmed up with {len(answers)} requests in {duration:.1f} s; "
               f"{verdict.describe(spec.settle)}" if passed else
               f"{replica or spec.unit or endpoint.label()}: warm-up failed: {failure}")
    report = {
        "replica": replica,
        "unit": spec.unit,
        "endpoint": endpoint.label(),
        "served_model_name": spec.served_model_name,
        "passed": passed,
        "message": message,
        "at": deps.now_iso(),
        "release": release or {},
        "plan": plan or {},
        "vllm_version": sim.vllm_version,
        "simulated": sim.any,
        "simulation": {"vllm": sim.vllm_simulated, "gpus": sim.gpus_simulated, "time_scale": sim.time_scale},
        "health": {"waited_s": round(health.waited_s, 2), "polls": health.polls, "unit": health.unit_after},
        "warmup": {
            "kind": spec.kind, "concurrency": spec.concurrency, "max_tokens": spec.max_tokens,
            "requests_sent": len(answers), "min_requests": spec.requests, "max_requests": spec.max_requests,
            "duration_s": round(duration, 2),
            "settle_rule": asdict(spec.settle),
            "settled": verdict.settled,
            "verdict": verdict.describe(spec.settle),
            "medians_last_window": medians,
            "limits": {"max_ttft_s": spec.max_ttft_s, "max_tpot_s": spec.max_tpot_s,
                       "compared_in": "twin modelled seconds" if sim.vllm_simulated else "seconds"},
            "answers": [asdict(a) for a in answers],
        },
    }
    return WarmupOutcome(passed, message, report)


def failure_report(spec: WarmupSpec, replica: str, message: str, now: str, release: Optional[Dict[str, Any]] = None,
                   plan: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The report entry of a replica that failed before any warm-up request (health wait, models, version)."""
    return {"replica": replica, "unit": spec.unit, "endpoint": spec.endpoint.label(),
            "served_model_name": spec.served_model_name, "passed": False, "message": message, "at": now,
            "release": release or {}, "plan": plan or {}, "simulated": bool(spec.gpus_simulated),
            "simulation": {"vllm": None, "gpus": spec.gpus_simulated, "time_scale": None},
            "health": None, "warmup": None}


def merge_report(existing_text: Optional[str], host: str, replica: str, report: Dict[str, Any],
                 now: str) -> Dict[str, Any]:
    """The node's hand-over file: one entry per replica, the newest warm-up of each."""
    data: Dict[str, Any] = {}
    if existing_text:
        try:
            data = json.loads(existing_text)
        except ValueError:
            data = {}
    if not isinstance(data, dict) or data.get("schema") != REPORT_SCHEMA:
        data = {}
    replicas = data.get("replicas") if isinstance(data.get("replicas"), dict) else {}
    replicas[replica] = report
    return {"schema": REPORT_SCHEMA, "host": host, "updated": now,
            "simulated": any(bool(entry.get("simulated")) for entry in replicas.values()),
            "replicas": replicas}


def write_report(path: str, data: Dict[str, Any]) -> None:
    """Atomically: a reader sees the old file or the new one, never half of one."""
    write_json_atomic(path, data, sort_keys=True, make_parents=True)
