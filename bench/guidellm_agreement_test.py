"""Agreement: GuideLLM and `bin/revive bench` against the same twin level give the same numbers (within 5 %).

Issue 13's check that the bench measures what a tool nobody here wrote measures. GuideLLM 0.8.1 runs from
.venv-guidellm, built from the hash lock data/locks/guidellm-bench.txt by `make bench-guidellm` (or `make bench`);
it is never installed on a node. One twin on loopback serves the field notes' deployment (the 20B fixture, TP 8,
their flags, 0.5.4) in real time (time scale 1, so both tools' seconds are the same seconds). Both tools send the
same requests in the same order: the bundled prompt set trimmed to 256 tokens, in the bench's seeded order, cycled
(GuideLLM gets that sequence as a JSONL file and stops when the file ends, so it holds far more rows than a level
sends); `/v1/completions`, streaming, max_tokens 200, temperature 0 (GuideLLM's backend `extras`), so the twin
gives a prompt the same answer whichever tool asks. The bench's levels run first, then GuideLLM's, on one server.

Each level is an open loop with evenly spaced arrivals at 2 and 4 requests/s (`revive bench --rate R --arrivals
constant`, GuideLLM's `constant` profile): the same arrival schedule for both tools, so the server sees the same
load. Answers end by EOS around 120 tokens (VLLM_SIM_ANSWER_MEDIAN=120). Why not the field notes' closed loop with
every answer at 200 tokens: there the clients stay in step and each TTFT falls into one of a few clusters (which
engine step a request joins), so a percentile is whichever cluster the run's phase put at that rank (first try:
TTFT P50 0.688 s against GuideLLM's 0.471 s, E2E and throughput within 0.5 %); with spread answers, a closed loop
still couples TTFT to how fast a client sends its next request after an answer (GuideLLM ~6 ms slower than the
bench, so its requests joined the engine's next step ~6 ms later into the current one: TTFT P50 0.049 against
0.055 s). Poisson arrivals drawn by each tool from its own generator are two different loads (2.5/s: the bench's
draw gave 2.2 requests/s in its window, GuideLLM's 2.7; at 5/s GuideLLM's draw pushed the server into a queue that
the bench's did not). docs/bench.md has the numbers of all three.

Windows, set to match: the bench measures `--duration` D seconds after `--warmup` W; GuideLLM runs for
W + D + C seconds (constraint max_duration) with `warmup` W and `cooldown` C, so its measured window is the same
D seconds after the same W. What each tool then counts differs, and both are printed: the bench takes requests
sent and ended inside the window, with linear percentiles, E2E to the last token; GuideLLM takes completed requests
that overlap it (for TTFT: whose first token came after the window opened) with nearest-rank percentiles, E2E to
the stream's close, TTFT in ms. The third column recomputes GuideLLM's own per-request timings with the bench's
rules: when the tools disagree it tells whether the requests differed or the definitions.

Asserted per level: both tools' TTFT P50/P95, E2E P50/P95 and output tokens/s within 5 % of each other, no
failed request on either side, the same mean answer length on both sides within 2 % (the same answers), and the
bench's own level not INVALID (its client kept to the schedule).

    make bench-guidellm      # AGREEMENT_RATES (requests/s, default 2,4), AGREEMENT_SECONDS (default 120)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bin"))
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))

import harness  # noqa: E402
from revive_cli import use_module_utils  # noqa: E402

use_module_utils()
from ansible.module_utils.revive_bench import prompts as bench_prompts  # noqa: E402
from ansible.module_utils.revive_bench.stats import percentile  # noqa: E402
from logged_run import run_logged, tail  # noqa: E402

GUIDELLM = REPO / ".venv-guidellm" / "bin" / "guidellm"
GUIDELLM_VERSION = "0.8.1"
LOCK = REPO / "data" / "locks" / "guidellm-bench.txt"
RATES = [float(x) for x in os.environ.get("AGREEMENT_RATES", "2,4").split(",")]
CAP = 64  # the bench's in-flight cap in open loop; the levels stay far below it
MEASURED_S = float(os.environ.get("AGREEMENT_SECONDS", "120"))
WARMUP_S = 20.0
COOLDOWN_S = 15.0
ANSWER_MEDIAN = 120
MAX_TOKENS = 200
SEED = 42
MODEL = "chat-20b"
TOLERANCE = 0.05
# GuideLLM must not look for a Hugging Face hub (the data is a local file and no tokenizer is loaded).
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1"}
METRICS = ("ttft_p50", "ttft_p95", "e2e_p50", "e2e_p95", "tok_s")


def guidellm_prompts(path: Path, rows: int) -> Tuple[str, int]:
    """The bench's request sequence (bundled set, 256-token budget, seeded order, cycled) as GuideLLM data."""
    prompt_set = bench_prompts.load(str(REPO / "data" / "bench" / "prompts.jsonl"), 256)
    items = prompt_set["prompts"]
    order = bench_prompts.order(len(items), SEED)
    with path.open("w") as handle:
        for i in range(rows):
            handle.write(json.dumps({"prompt": items[order[i % len(order)]].as_text()}) + "\n")
    return prompt_set["sha256"], len(items)


def bench_numbers(level: dict) -> Dict[str, float]:
    stats = level["stats"]
    return {"ttft_p50": stats["ttft_s"]["p50"], "ttft_p95": stats["ttft_s"]["p95"],
            "e2e_p50": stats["e2e_s"]["p50"], "e2e_p95": stats["e2e_s"]["p95"],
            "tok_s": stats["output_throughput_tok_s"], "n": stats["completed"], "failed": stats["failed"],
            "tokens_mean": stats["output_tokens_mean"]}


def guidellm_numbers(benchmark: dict) -> Dict[str, float]:
    metrics = benchmark["metrics"]
    ttft = metrics["time_to_first_token_ms"]["successful"]
    e2e = metrics["request_latency"]["successful"]
    return {"ttft_p50": ttft["percentiles"]["p50"] / 1000, "ttft_p95": ttft["percentiles"]["p95"] / 1000,
            "e2e_p50": e2e["percentiles"]["p50"], "e2e_p95": e2e["percentiles"]["p95"],
            "tok_s": metrics["output_tokens_per_second"]["successful"]["mean"], "n": e2e["count"],
            "failed": metrics["request_totals"]["errored"] + metrics["request_totals"]["incomplete"],
            "tokens_mean": metrics["output_token_count"]["successful"]["mean"]}


def guidellm_raw_with_bench_rules(benchmark: dict) -> Dict[str, float]:
    """GuideLLM's per-request timings, counted as the bench counts: sent and ended inside the measured window,
    TTFT to the first token, E2E to the last token, linear percentiles, tokens that arrived inside the window
    (spread evenly between a request's first and last token: GuideLLM keeps no per-token times)."""
    start = benchmark["scheduler_metrics"]["measure_start_time"]
    end = benchmark["scheduler_metrics"]["measure_end_time"]
    ttft, e2e, tokens = [], [], 0.0
    for request in benchmark["requests"]["successful"]:
        t = request["info"]["timings"]
        sent, first, last = t["request_start"], t["first_token_iteration"], t["last_token_iteration"]
        count = request["output_tokens"] or 0
        if count > 1 and last > first:
            step = (last - first) / (count - 1)
            tokens += sum(1 for k in range(count) if start <= first + k * step <= end)
        elif count and start <= last <= end:
            tokens += count
        if sent >= start and t["request_end"] <= end:
            ttft.append(first - sent)
            e2e.append(last - sent)
    return {"ttft_p50": percentile(ttft, 50), "ttft_p95": percentile(ttft, 95), "e2e_p50": percentile(e2e, 50),
            "e2e_p95": percentile(e2e, 95), "tok_s": tokens / (end - start), "n": len(e2e), "failed": 0}


def deviation(a: float, b: float) -> float:
    return abs(a - b) / ((a + b) / 2)


def test_guidellm_and_revive_bench_agree(tmp_path):
    assert GUIDELLM.exists(), (f"{GUIDELLM.relative_to(REPO)} is missing: `make bench-guidellm` builds it from "
                               f"{LOCK.relative_to(REPO)} (~5.6 GB of wheels from PyPI, torch among them)")
    version = subprocess.run([str(GUIDELLM), "--version"], capture_output=True, text=True, env=dict(
        os.environ, **OFFLINE)).stdout
    assert GUIDELLM_VERSION in version, f"{GUIDELLM} is not GuideLLM {GUIDELLM_VERSION}: {version!r}"
    digest, prompt_count = guidellm_prompts(tmp_path / "prompts.jsonl", rows=20000)
    model = harness.write_model("internlm2-chat-20b", tmp_path / "chat-20b-fp16")
    env = harness.twin_env(tmp_path, time_scale=1.0, extra={**harness.FIELD_NOTES_ENV,
                                                             "VLLM_SIM_COLD_START_REQUESTS": "0",
                                                             "VLLM_SIM_ANSWER_MEDIAN": str(ANSWER_MEDIAN)})
    twin = harness.start(model, harness.FIELD_NOTES_FLAGS + ["--disable-frontend-multiprocessing"], env,
                         tmp_path / "twin.log", served_name=MODEL, timeout=600)
    url = f"http://127.0.0.1:{twin.port}"
    backend = {"kind": "openai_http", "target": url, "model": MODEL, "request_format": "/v1/completions",
               "max_tokens": MAX_TOKENS, "extras": {"body": {"temperature": 0.0}}}
    profile = {"kind": "constant", "rate": RATES, "warmup": WARMUP_S, "cooldown": COOLDOWN_S}
    guidellm_argv = [str(GUIDELLM), "run", "--backend", json.dumps(backend), "--profile", json.dumps(profile),
                     "--constraint", f"kind=max_duration,seconds={WARMUP_S + MEASURED_S + COOLDOWN_S}",
                     "--data", f"kind=json_file,path={tmp_path / 'prompts.jsonl'}",
                     "--seed", f"kind=static,value={SEED}",
                     "--output", f"kind=json,path={tmp_path / 'guidellm.json'}", "--disable-console"]
    summaries, seconds = [], {"revive bench": 0.0}
    try:
        for i, rate in enumerate(RATES):
            out = tmp_path / f"bench-{i}"
            argv = [sys.executable, "bin/revive", "bench", "--url", url, "--model", MODEL, "--rate", str(rate),
                    "--arrivals", "constant",
                    "--concurrency", str(CAP), "--duration", str(MEASURED_S), "--warmup", str(WARMUP_S),
                    "--max-tokens", str(MAX_TOKENS), "--seed", str(SEED), "--slo-e2e-p95", "12", "--out", str(out)]
            rc, took = run_logged(argv, tmp_path / f"bench-{i}.log", dict(os.environ))
            seconds["revive bench"] += took
            assert rc == 0, f"revive bench exited {rc}:\n{tail(tmp_path / f'bench-{i}.log')}"
            summaries.append(json.loads((out / "summary.json").read_text()))
        rc, seconds["GuideLLM"] = run_logged(guidellm_argv, tmp_path / "guidellm.log", dict(os.environ, **OFFLINE))
        assert rc == 0, f"guidellm exited {rc}:\n{tail(tmp_path / 'guidellm.log')}"
    finally:
        twin.stop()
    report = json.loads((tmp_path / "guidellm.json").read_text())
    assert all(summary["simulation"]["time_scale"] == 1.0 for summary in summaries)
    gll_levels = {benchmark["config"]["strategy"]["rate"]: benchmark for benchmark in report["benchmarks"]}
    assert sorted(gll_levels) == sorted(RATES), sorted(gll_levels)

    print(f"\nGuideLLM {GUIDELLM_VERSION} ({seconds['GuideLLM']:.0f} s) and revive bench "
          f"({seconds['revive bench']:.0f} s) against one twin on loopback (SIMULATED: the vLLM twin, time scale 1, "
          f"the field notes' 20B TP 8 deployment on 0.5.4); open loop, evenly spaced arrivals; prompts: {prompt_count} "
          f"bundled (sha256 {digest[:12]}) in one order, seed {SEED}, max_tokens {MAX_TOKENS}, temperature 0, answers "
          f"around {ANSWER_MEDIAN} tokens (VLLM_SIM_ANSWER_MEDIAN); warm-up {WARMUP_S:.0f} s, measured "
          f"{MEASURED_S:.0f} s per level")
    problems = []
    for rate, summary in zip(RATES, summaries):
        (level,) = summary["levels"]
        ours = bench_numbers(level)
        theirs = guidellm_numbers(gll_levels[rate])
        recomputed = guidellm_raw_with_bench_rules(gll_levels[rate])
        print(f"\n{rate:g} requests/s: requests counted: revive bench {ours['n']}, GuideLLM {theirs['n']}, "
              f"GuideLLM's by the bench's rules {recomputed['n']}")
        for warning in gll_levels[rate].get("warnings") or []:
            print(f"  GuideLLM warns: {warning.get('code')}: {warning.get('message')}")
        print(f"  {'metric':<16}{'revive bench':>14}{'GuideLLM':>12}{'deviation':>11}{'GuideLLM, bench rules':>24}")
        for name in METRICS:
            dev = deviation(ours[name], theirs[name])
            unit = "tok/s" if name == "tok_s" else "s"
            print(f"  {name + ' (' + unit + ')':<16}{ours[name]:>14.3f}{theirs[name]:>12.3f}{dev:>10.1%}"
                  f"{recomputed[name]:>24.3f}")
            if dev > TOLERANCE:
                problems.append(f"{rate:g}/s: {name} revive bench {ours[name]:.3f} vs GuideLLM "
                                f"{theirs[name]:.3f} ({dev:.1%} > {TOLERANCE:.0%})")
        print(f"  mean answer: revive bench {ours['tokens_mean']:.1f} tokens, GuideLLM {theirs['tokens_mean']:.1f}; "
              f"revive bench's verdict {level['verdict']['verdict']} (dispatch lag p99 "
              f"{level['stats']['dispatch_lag_s']['p99'] * 1000:.1f} ms)")
        if ours["failed"] or theirs["failed"]:
            problems.append(f"{rate:g}/s: failed requests: revive bench {ours['failed']}, GuideLLM {theirs['failed']}")
        if deviation(ours["tokens_mean"], theirs["tokens_mean"]) > 0.02:
            problems.append(f"{rate:g}/s: mean answer length revive bench {ours['tokens_mean']:.1f} vs GuideLLM "
                            f"{theirs['tokens_mean']:.1f}: the tools did not get the same answers")
        if level["verdict"]["verdict"] == "INVALID":
            problems.append(f"{rate:g}/s: revive bench says its own level is INVALID: {level['verdict']['reasons']}")
    assert not problems, "\n".join(problems)
