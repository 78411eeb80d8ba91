"""The hand-over SLO gate: before a GPU node goes READY, a short bench on the node itself at the concurrency the
front door will send it, judged as playbooks/benchmark.yml judges a level; a node that does not PASS is rolled back
like a failed warm-up (roles/handover).

Issue 13's "SLO gate at hand-over": the warm-up proves that every replica answers and that its latency settled;
it does not prove that the node holds the SLO under its planned load (docs/field-report.md: P95 end-to-end <= 12 s
at the production limit). The gate runs one closed-loop level of `revive bench` (module_utils/revive_bench) against
the node's own replicas on the addresses they listen on (module_utils/revive_serve_address.py), never through the
front door (its servers are still in maintenance), with:

- concurrency: per replica what the front door's server will allow (module_utils/revive_frontdoor.py: a limit the
  bench applied, else frontdoor_server_maxconn, else the plan's streams, never above --max-num-seqs), or the
  operator's number; the level runs their sum, requests handed to the replicas in turn;
- the node watched while it runs (module_utils/revive_bench/sampler.py in a thread: units' NRestarts and MainPID,
  /health, /metrics counters, GPU utilisation through NVML when the interpreter has pynvml, OOM lines in the
  journal), so a replica that restarts, an OOM or an unbalanced GPU set fails the gate even when the latencies of
  what was served look fine (module_utils/revive_bench/review.py);
- the verdict: only PASS passes. FAIL (P95 E2E over the SLO, errors, a restart, GPU balance), INVALID (the client on
  the node was the bottleneck: its dispatch lag or achieved concurrency outside the bounds) and INCONCLUSIVE (too few
  completions for the P95 bound: a longer gate is needed) all keep the node out, each with its reason.

The report (summary.json, levels.csv, report.md, requests.jsonl, samples.jsonl) goes to a directory on the node.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ansible.module_utils.revive_bench import sampler
from ansible.module_utils.revive_bench.client import Target
from ansible.module_utils.revive_bench.observe import ObserveError, load_samples
from ansible.module_utils.revive_bench.probe import ProbeError
from ansible.module_utils.revive_bench.prompts import PromptError, parse
from ansible.module_utils.revive_bench.report import write
from ansible.module_utils.revive_bench.review import review
from ansible.module_utils.revive_bench.run import Options, run_sync
from ansible.module_utils.revive_bench.stats import min_completions
from ansible.module_utils.revive_bench.verdict import INCONCLUSIVE, INVALID, PASS, Bounds

KINDS = ("completions", "chat")
SAMPLER_GRACE_S = 30.0     # the sampler's own deadline beyond the level: it normally stops at the stop file


class GateError(ValueError):
    """The gate cannot run (bad input, no release on the node, a replica that cannot be benchmarked): names what."""


def gate_concurrency(servers: Sequence[Mapping[str, Any]], node: str, replicas: Sequence[str], override: Any = 0
                     ) -> Dict[str, int]:
    """{replica: requests in flight} for the `replicas` of `node`'s current release: `override` for each when it is
    a positive integer, else its front-door server's maxconn (the frontdoor_servers filter's list, server name
    <node>-<replica>). A replica without a server of its own (the release a rollback restored may have other
    replicas than the plan the front door was configured for) gets the smallest limit of the node's servers."""
    try:
        fixed = int(override or 0)
    except (TypeError, ValueError):
        raise GateError(f"handover_slo_gate_concurrency {override!r} is not an integer: give the requests in flight "
                        "per replica, or 0 for the front door's limit") from None
    if fixed < 0:
        raise GateError(f"handover_slo_gate_concurrency {fixed} is negative: give the requests in flight per "
                        "replica, or 0 for the front door's limit")
    if fixed:
        return {name: fixed for name in replicas}
    prefix = f"{node}-"
    limits = {str(s["name"])[len(prefix):]: int(s["maxconn"]) for s in servers
              if s.get("node") == node and str(s.get("name", "")).startswith(prefix)}
    if not limits:
        raise GateError(f"{node}: the front door has no server of this node to take a limit from (no planned "
                        "release, host fact revive_release): set handover_slo_gate_concurrency")
    return {name: limits.get(name, min(limits.values())) for name in replicas}


@dataclass
class GateSpec:
    node: str
    model: str
    concurrency: Dict[str, int]            # replica name -> requests in flight
    prompts: bytes                         # a prompt file's bytes (module_utils/revive_bench/prompts.py)
    prompts_source: str = "bundled"
    record_path: str = "/var/lib/revive/releases.json"
    host: str = ""                          # "": each replica's own address (the --host its argv binds)
    duration_s: float = 60.0
    warmup_s: float = 5.0
    max_tokens: int = 200
    prompt_tokens: int = 256
    slo_e2e_p95_s: float = 12.0
    kind: str = "completions"
    api_key: str = ""
    timeout_s: float = 120.0
    sample_interval_s: float = 1.0
    max_gpu_imbalance: float = 0.20
    max_dispatch_lag_p99_s: float = 0.050
    report_dir: str = ""
    time_scale: Optional[float] = None      # None: the servers' /version (the lab's twin reports its scale)

    def validate(self) -> None:
        problems = []
        for name in ("duration_s", "slo_e2e_p95_s", "timeout_s", "sample_interval_s", "max_dispatch_lag_p99_s"):
            if not getattr(self, name) > 0:
                problems.append(f"{name.rsplit('_', 1)[0]} must be above 0 (got {getattr(self, name)})")
        if self.warmup_s < 0:
            problems.append(f"warmup must be 0 or more (got {self.warmup_s})")
        if self.max_tokens < 1 or self.prompt_tokens < 1:
            problems.append(f"max_tokens and prompt_tokens must be 1 or more (got {self.max_tokens}, "
                            f"{self.prompt_tokens})")
        if not 0 < self.max_gpu_imbalance <= 1:
            problems.append(f"max_gpu_imbalance is a share in (0, 1] (got {self.max_gpu_imbalance})")
        if self.kind not in KINDS:
            problems.append(f"kind must be one of {', '.join(KINDS)} (got {self.kind!r})")
        if not self.model:
            problems.append("model (the served model name) is empty")
        if not self.concurrency:
            problems.append("no replica to bench: concurrency names none of the node's replicas")
        bad = {name: n for name, n in self.concurrency.items() if not isinstance(n, int) or n < 1}
        if bad:
            problems.append(f"concurrency per replica must be 1 or more (got {bad})")
        if self.time_scale is not None and not self.time_scale > 0:
            problems.append(f"time_scale must be above 0 (got {self.time_scale})")
        if problems:
            raise GateError("the SLO gate's settings: " + "; ".join(problems))


@dataclass
class GateOutcome:
    passed: bool
    verdict: str
    message: str
    concurrency: int
    replicas: Dict[str, int]
    summary: Dict[str, Any] = field(default_factory=dict)
    report_dir: str = ""


def _watched(spec: GateSpec) -> Dict[str, Any]:
    """The node's current release (the sampler's view of the record), checked against the replicas to bench."""
    try:
        watch = sampler.load_replicas(spec.record_path)
    except sampler.SampleError as exc:
        raise GateError(str(exc)) from None
    names = [replica["name"] for replica in watch["replicas"]]
    unknown = sorted(set(spec.concurrency) - set(names))
    if unknown:
        raise GateError(f"{spec.node}: concurrency names {unknown}, which the current release "
                        f"{watch['release_id']} in {spec.record_path} does not run (its replicas: {names})")
    missing = [name for name in names if name not in spec.concurrency]
    if missing:
        raise GateError(f"{spec.node}: no concurrency for {missing} of release {watch['release_id']}: every replica "
                        "takes part in the gate")
    return watch


def options(spec: GateSpec, watch: Dict[str, Any]) -> Options:
    """The bench's options: one closed-loop level, the node's replicas on the addresses they listen on."""
    try:
        prompt_set = parse(spec.prompts, spec.prompts_source, spec.prompt_tokens)
    except PromptError as exc:
        raise GateError(f"the SLO gate's prompts: {exc}") from None
    targets = [Target("http", spec.host or replica["host"], replica["port"]) for replica in watch["replicas"]]
    total = sum(spec.concurrency[replica["name"]] for replica in watch["replicas"])
    per = ", ".join(f"{r['name']} {spec.concurrency[r['name']]}" for r in watch["replicas"])
    return Options(
        targets=targets, model=spec.model, concurrency=[total], duration=spec.duration_s, warmup=spec.warmup_s,
        max_tokens=spec.max_tokens, prompt_set=prompt_set, kind=spec.kind, api_key=spec.api_key,
        timeout=spec.timeout_s, time_scale=spec.time_scale,
        bounds=Bounds(slo_e2e_p95_s=spec.slo_e2e_p95_s, max_dispatch_lag_p99_s=spec.max_dispatch_lag_p99_s,
                      max_gpu_imbalance=spec.max_gpu_imbalance),
        command=f"vllm_slo_gate on {spec.node}: release {watch['release_id']}, {total} in flight ({per}) for "
                f"{spec.duration_s:g} s after {spec.warmup_s:g} s")


def _hint(verdict: str, spec: GateSpec) -> str:
    if verdict == INCONCLUSIVE:
        return (f"; the gate needs {min_completions()} completions inside its {spec.duration_s:g} s: raise "
                "handover_slo_gate_duration_s")
    if verdict == INVALID:
        return "; the client on the node could not keep the load up: the node's CPU is busy, or lower the concurrency"
    return ""


def describe(level: Dict[str, Any], spec: GateSpec, watch: Dict[str, Any], report_dir: str) -> str:
    """One line for the play: verdict, load, the numbers the SLO is judged on, the reasons, where the report is."""
    stats, verdict = level["stats"], level["verdict"]
    e2e, bounds = stats.get("e2e_s") or {}, stats.get("e2e_p95_bounds") or {}
    shown = [f"{name} bound {bounds[name]:.2f} s" for name in ("lower", "upper") if bounds.get(name) is not None]
    numbers = (f"P95 E2E {e2e['p95']:.2f} s{' (' + ', '.join(shown) + ')' if shown else ''} against "
               f"{spec.slo_e2e_p95_s:g} s" if e2e.get("p95") is not None else "no completed request")
    reasons = "; ".join(verdict.get("reasons") or []) or "every rule held"
    where = f"; report {report_dir}" if report_dir else ""
    return (f"{spec.node}: SLO gate {verdict['verdict']} for release {watch['release_id']} at {level['concurrency']} "
            f"in flight over {len(watch['replicas'])} replica(s): {numbers}, {stats.get('completed', 0)} completed, "
            f"{stats.get('failed', 0)} failed: {reasons}{_hint(verdict['verdict'], spec)}{where}")


SamplerRun = Callable[..., int]
BenchRun = Callable[[Options], Dict[str, Any]]


def run_gate(spec: GateSpec, bench: BenchRun = run_sync, sample: SamplerRun = sampler.run,
             sleep: Callable[[float], None] = time.sleep) -> GateOutcome:
    """Run the gate; raises GateError before any request when it cannot run."""
    spec.validate()
    watch = _watched(spec)
    opts = options(spec, watch)
    if spec.report_dir:
        os.makedirs(spec.report_dir, mode=0o755, exist_ok=True)
    work = spec.report_dir or tempfile.mkdtemp(prefix="revive-slo-gate-")
    samples_path, stop_file = os.path.join(work, "samples.jsonl"), os.path.join(work, "stop")
    for stale in (samples_path, stop_file):
        if os.path.exists(stale):
            os.remove(stale)
    failure: List[BaseException] = []

    def watch_node() -> None:
        try:
            sample(spec.record_path, samples_path, spec.sample_interval_s,
                   spec.warmup_s + spec.duration_s + spec.timeout_s + SAMPLER_GRACE_S, stop_file, spec.node)
        except Exception as exc:  # noqa: BLE001 - reported below; the gate then fails rather than judge blind
            failure.append(exc)

    thread = threading.Thread(target=watch_node, name="slo-gate-sampler", daemon=True)
    thread.start()
    try:
        sleep(min(spec.sample_interval_s, 1.0))   # a first sample before the load
        result = bench(opts)
    except ProbeError as exc:
        raise GateError(f"{spec.node}: a replica cannot be benchmarked: {exc}") from None
    finally:
        with open(stop_file, "w", encoding="utf-8"):
            pass
        thread.join(spec.sample_interval_s * 3 + SAMPLER_GRACE_S)
    if failure or thread.is_alive():
        why = failure[0] if failure else "it did not stop"
        raise GateError(f"{spec.node}: the node's sampler failed ({why}); the gate does not judge a node it could not "
                        "watch")
    try:
        nodes = [load_samples(samples_path)]
    except ObserveError as exc:
        raise GateError(f"{spec.node}: the node's samples cannot be read: {exc}") from None
    records = [record for level in result["levels"] for record in level["records"]]
    judged = review(result["summary"], records, nodes)
    if spec.report_dir:
        write(spec.report_dir, judged, result["levels"])
    else:
        shutil.rmtree(work, ignore_errors=True)
    level = judged["levels"][0]
    verdict = level["verdict"]["verdict"]
    return GateOutcome(passed=verdict == PASS, verdict=verdict, message=describe(level, spec, watch, spec.report_dir),
                       concurrency=level["concurrency"], replicas=dict(spec.concurrency), summary=judged,
                       report_dir=spec.report_dir)
