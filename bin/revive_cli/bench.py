"""revive bench: the SLO acceptance load test against OpenAI-compatible URLs, without Ansible.

    revive bench --url URL[,URL...] --model NAME [--concurrency 8,16,32,64] [--duration S] [--warmup S]
                 [--max-tokens 200] [--slo-e2e-p95 12] --out DIR [--json] [--api-key KEY] [--chat] [--ignore-eos]
                 [--rate R [--arrivals poisson|constant]] [--prompts FILE] [--prompt-tokens N] [--tokenizer FILE]
                 [--seed N] [--timeout S] [--time-scale auto|X] [--exclude-queue]

Each level is a closed loop of N requests in flight (or, with --rate, Poisson or evenly spaced arrivals with N as
the cap),
`--warmup` seconds not measured, then `--duration` seconds measured; requests still in flight at the end are
waited for but not measured. Every level gets a verdict (PASS / FAIL / INCONCLUSIVE / INVALID, docs/bench.md);
--out gets requests.jsonl, summary.json, levels.csv and report.md. Progress goes to stderr: a live table (rich) on a
terminal, plain lines elsewhere.
Against a simulated server (the lab twin: /version reports twin.time_scale, or --time-scale X), latencies, the SLO
and throughputs are in simulated seconds (wall / X); --duration, --warmup and --timeout stay wall seconds.
Through a front door that limits each server and reports the wait (X-Revive-Queue-Ms), the queue time is shown
apart; --exclude-queue judges the servers' latency (after the queue) instead of the client's.
Exit status: 0 every level PASS, 1 some level FAIL, 2 usage or connection error, 3 inconclusive or invalid
(and nothing failed).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import sys
from typing import Any, Callable, Dict, List, Optional

from ansible.module_utils.revive_bench.client import URLError, parse_url
from ansible.module_utils.revive_bench.probe import ProbeError, TimeScaleError
from ansible.module_utils.revive_bench.prompts import PromptError, load, tokenizer_counter
from ansible.module_utils.revive_bench.report import write
from ansible.module_utils.revive_bench.run import Options, run_sync
from ansible.module_utils.revive_bench.verdict import Bounds
from ansible.module_utils.revive_sse import CAFileError, tls_context

from revive_cli import REPO

DEFAULT_PROMPTS = REPO / "data" / "bench" / "prompts.jsonl"


def _number(kind: Callable[[str], Any], minimum: float, strict: bool) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"{text!r} must be {'>' if strict else '>='} {minimum:g}")
        return value
    return parse


def _levels(text: str) -> List[int]:
    parse = _number(int, 0, True)
    return [parse(part.strip()) for part in text.split(",")]


def _urls(text: str) -> list:
    try:
        return [parse_url(part) for part in text.split(",")]
    except URLError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ca_file(text: str) -> str:
    """A CA file the front door's certificate can be verified with: read once here, so a bad one is exit 2."""
    try:
        tls_context(text)
    except CAFileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _time_scale(text: str) -> Optional[float]:
    """'auto' (None: the targets' /version twin.time_scale, else 1) or a positive number."""
    if text.strip().lower() == "auto":
        return None
    return _number(float, 0, True)(text)


def _share(text: str) -> float:
    value = _number(float, 0, False)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a share between 0 and 1")
    return value


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="revive bench", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 2)[2])
    positive, non_negative = _number(float, 0, True), _number(float, 0, False)
    parser.add_argument("--url", required=True, type=_urls, help="base URL(s), comma-separated: round robin")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--concurrency", type=_levels, default=[8, 16, 32, 64], help="levels (default 8,16,32,64)")
    parser.add_argument("--duration", type=positive, default=600.0,
                        help="measured wall seconds per level (default 600)")
    parser.add_argument("--warmup", type=non_negative, default=30.0,
                        help="unmeasured wall seconds first (default 30)")
    parser.add_argument("--max-tokens", type=_number(int, 0, True), default=200)
    parser.add_argument("--slo-e2e-p95", type=positive, default=12.0,
                        help="P95 E2E target in (simulated) seconds (default 12)")
    parser.add_argument("--confidence", type=_number(float, 0.5, False), default=0.95,
                        help="of the P95 bounds (default 0.95)")
    parser.add_argument("--out", required=True, help="report directory")
    parser.add_argument("--json", action="store_true", help="print summary.json on stdout")
    parser.add_argument("--api-key", default=os.environ.get("REVIVE_API_KEY", ""),
                        help="bearer token (default: $REVIVE_API_KEY; prefer it: a value here shows in ps)")
    parser.add_argument("--ca-file", type=_ca_file, default="", metavar="PATH",
                        help="CA certificate(s) to verify an https front door with; default: the system's trust "
                             "store")
    parser.add_argument("--chat", action="store_true", help="/v1/chat/completions instead of /v1/completions")
    parser.add_argument("--ignore-eos", action="store_true", help="answers run to max_tokens (early EOS is gated)")
    parser.add_argument("--rate", type=positive, help="open loop: arrivals per (wall) second")
    parser.add_argument("--arrivals", choices=("poisson", "constant"),
                        help="with --rate: Poisson arrivals (seeded; the default) or one every 1/rate seconds")
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="JSONL of prompts (default: bundled)")
    parser.add_argument("--prompt-tokens", type=_number(int, 0, True), default=256,
                        help="trim prompts to this many tokens (default 256; approximate without --tokenizer)")
    parser.add_argument("--tokenizer", help="the model's tokenizer.json: count and trim with it (needs the "
                        "tokenizers package); default: 4 characters per token")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=positive, default=120.0, help="per request, wall seconds (default 120)")
    parser.add_argument("--connect-timeout", type=positive, default=10.0, help="wall seconds (default 10)")
    parser.add_argument("--time-scale", type=_time_scale, default=None, metavar="auto|X",
                        help="the server's simulated clock: one simulated second lasts X wall seconds (the lab "
                             "twin's VLLM_SIM_TIME_SCALE); latencies, the SLO and throughputs are then in simulated "
                             "seconds (wall / X), --duration/--warmup/--timeout and the dispatch lag stay wall "
                             "seconds. auto (default): the targets' /version twin.time_scale (all must agree), "
                             "else 1")
    parser.add_argument("--max-lag-p99-ms", type=non_negative, default=50.0,
                        help="INVALID above this dispatch lag p99 (default 50)")
    parser.add_argument("--min-achieved", type=_share, default=0.95,
                        help="INVALID below this share of the target concurrency (default 0.95)")
    parser.add_argument("--max-error-rate", type=_share, default=0.01, help="FAIL above it (default 0.01)")
    parser.add_argument("--max-early-eos", type=_share, default=0.05,
                        help="with --ignore-eos, INVALID above this share of short answers (default 0.05)")
    parser.add_argument("--exclude-queue", action="store_true",
                        help="latencies and the SLO from leaving the front door's queue (its X-Revive-Queue-Ms "
                             "header); the wait is reported apart either way")
    parser.add_argument("--node-observations", help="JSON file {concurrency: {restarts, oom_lines, gpu_imbalance}}")
    args = parser.parse_args(argv)
    if len(set(args.concurrency)) != len(args.concurrency):
        parser.error(f"argument --concurrency: a level appears twice in {','.join(map(str, args.concurrency))}")
    if args.confidence >= 1:
        parser.error(f"argument --confidence: {args.confidence:g} must be < 1")
    if args.arrivals and not args.rate:
        parser.error(f"argument --arrivals: {args.arrivals} arrivals need --rate (arrivals per second); a level "
                     "without --rate is a closed loop")
    if args.ca_file:   # the https targets verify with it; an http one (a replica benched directly) ignores it
        args.url = [dataclasses.replace(target, ca_file=args.ca_file) for target in args.url]
    return args


def progress_line(event: Dict[str, Any]) -> None:
    simulated = event.get("time_scale", 1.0) != 1.0
    if "verdict" in event:
        print(f"bench: level {event['level']}: {event['verdict']}: {'; '.join(event['reasons'])}"
              f"{' (simulated s)' if simulated else ''}", file=sys.stderr)
        return
    p95 = event["e2e_p95_s"]
    unit = " s (simulated s)" if simulated else " s"
    print(f"bench: level {event['level']} {event['phase']} {event['elapsed_s']:6.1f} s  completions "
          f"{event['completions']}  in flight {event['in_flight']}  P95 E2E "
          f"{'-' if p95 is None else f'{p95:.3f}{unit}'}  errors {event['errors']}", file=sys.stderr)


class LiveProgress:
    """Live progress on a terminal with rich (the controller's venv has it, requirements.txt): one table row per
    level - phase, elapsed, completions, in flight, current P95 E2E, errors, then its verdict - redrawn in place.
    `revive bench` uses it only when stderr is a terminal and rich imports; elsewhere (the bench host, CI logs)
    progress_line prints plain lines."""

    def __init__(self, console: Any):
        from rich.live import Live
        self.rows: Dict[int, Dict[str, Any]] = {}
        self.console = console
        self.live = Live(self.table(), console=console, refresh_per_second=4, transient=False)

    def table(self) -> Any:
        from rich.table import Table
        table = Table(title="revive bench", expand=False)
        for column in ("level", "phase", "elapsed s", "completions", "in flight", "P95 E2E s", "errors", "verdict"):
            table.add_column(column, justify="right" if column not in ("phase", "verdict") else "left")
        for level, row in self.rows.items():
            p95 = row.get("e2e_p95_s")
            table.add_row(str(level), row.get("phase", ""), f"{row.get('elapsed_s', 0.0):.1f}",
                          str(row.get("completions", "")), str(row.get("in_flight", "")),
                          "-" if p95 is None else f"{p95:.3f}{' (sim.)' if row.get('simulated') else ''}",
                          str(row.get("errors", "")), row.get("verdict", ""))
        return table

    def __call__(self, event: Dict[str, Any]) -> None:
        row = self.rows.setdefault(event["level"], {})
        row["simulated"] = event.get("time_scale", 1.0) != 1.0
        if "verdict" in event:
            row.update(phase="done", verdict=event["verdict"])
            self.console.print(f"level {event['level']}: {event['verdict']}: {'; '.join(event['reasons'])}",
                               highlight=False, markup=False)
        else:
            row.update({key: event[key] for key in ("phase", "elapsed_s", "completions", "in_flight", "e2e_p95_s",
                                                    "errors")})
        self.live.update(self.table())

    def __enter__(self) -> "LiveProgress":
        self.live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.live.stop()


def progress_reporter(stream: Any = None) -> Any:
    """LiveProgress on a terminal when rich is there, else None (then progress_line)."""
    stream = stream if stream is not None else sys.stderr
    if not getattr(stream, "isatty", lambda: False)():
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return LiveProgress(Console(file=stream))


def _observations(path: str) -> Dict[int, Dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    return {int(level): value for level, value in data.items()}


def redacted(argv: List[str]) -> List[str]:
    """The command line with the API key's value hidden (it goes into summary.json)."""
    out: List[str] = []
    for previous, arg in zip([""] + argv, argv):
        if previous == "--api-key":
            out.append("***")
        elif arg.startswith("--api-key="):
            out.append("--api-key=***")
        else:
            out.append(arg)
    return out


def main(argv: List[str]) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        counter = tokenizer_counter(args.tokenizer) if args.tokenizer else None
        prompt_set = load(args.prompts, args.prompt_tokens, counter)
        observations = _observations(args.node_observations) if args.node_observations else {}
    except PromptError as exc:
        print(f"revive bench: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError, AttributeError) as exc:
        print(f"revive bench: --node-observations {args.node_observations}: {exc}", file=sys.stderr)
        return 2
    options = Options(
        targets=args.url, model=args.model, concurrency=args.concurrency, duration=args.duration,
        warmup=args.warmup, max_tokens=args.max_tokens, prompt_set=prompt_set,
        command=shlex.join(["revive", "bench"] + redacted(argv)),
        bounds=Bounds(slo_e2e_p95_s=args.slo_e2e_p95, max_dispatch_lag_p99_s=args.max_lag_p99_ms / 1000.0,
                      min_achieved_share=args.min_achieved, max_error_rate=args.max_error_rate,
                      max_early_eos_share=args.max_early_eos),
        kind="chat" if args.chat else "completions", api_key=args.api_key, ignore_eos=args.ignore_eos,
        rate=args.rate, arrivals=args.arrivals or "poisson", seed=args.seed, timeout=args.timeout,
        connect_timeout=args.connect_timeout,
        confidence=args.confidence, node_observations=observations, time_scale=args.time_scale,
        exclude_queue=args.exclude_queue)
    live = progress_reporter()
    try:
        if live is None:
            result = run_sync(options, progress_line)
        else:
            with live:
                result = run_sync(options, live)
    except TimeScaleError as exc:
        print(f"revive bench: {exc}", file=sys.stderr)
        return 2
    except ProbeError as exc:
        print(f"revive bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("revive bench: interrupted; no report written", file=sys.stderr)
        return 2
    summary = result["summary"]
    paths = write(args.out, summary, result["levels"])
    if args.json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    verdicts = ", ".join(f"{c}: {v}" for c, v in summary["verdicts"].items())
    simulation = summary.get("simulation")
    simulated = f"; simulated server, time scale {simulation['time_scale']:g}" if simulation else ""
    print(f"revive bench: {verdicts}; recommended concurrency {summary['recommended_concurrency'] or 'none'}; "
          f"reports in {os.path.dirname(paths[0])}{simulated}", file=sys.stderr)
    return result["exit_code"]
