"""The reports under --out: requests.jsonl (raw records), summary.json, levels.csv, report.md.

Times in requests.jsonl are seconds since the run's zero (summary.json `clock_zero` has its wall-clock time), one
monotonic clock for every request, so every metric of the summary can be recomputed from the file
(load.summarize over one level's records and its `window`).
"""
from __future__ import annotations

import csv
import json
import os
from typing import Any, Dict, List, Optional, Sequence

CSV_COLUMNS = ("concurrency", "verdict", "requests", "completed", "failed", "error_rate", "ttft_p50_s", "ttft_p95_s",
               "e2e_p50_s", "e2e_p95_s", "e2e_p95_lower_s", "e2e_p95_upper_s", "tpot_p50_s", "itl_p95_s",
               "output_throughput_tok_s", "requests_per_s", "achieved_concurrency", "dispatch_lag_p99_s",
               "output_tokens_mean", "early_eos", "warmup_excluded", "drain_excluded", "queue_p50_s", "queue_p95_s",
               "queue_reported")
NO_PLOTS = ("No plots yet: `revive bench` writes none on the bench host (standard library only); `revive "
            "bench-judge DIR` renders them on the controller (playbooks/benchmark.yml runs it).")


def csv_row(level: Dict[str, Any]) -> Dict[str, Any]:
    s = level["stats"]
    return {
        "concurrency": level["concurrency"], "verdict": level["verdict"]["verdict"], "requests": s["requests"],
        "completed": s["completed"], "failed": s["failed"], "error_rate": s["error_rate"],
        "ttft_p50_s": s["ttft_s"]["p50"], "ttft_p95_s": s["ttft_s"]["p95"], "e2e_p50_s": s["e2e_s"]["p50"],
        "e2e_p95_s": s["e2e_s"]["p95"], "e2e_p95_lower_s": s["e2e_p95_bounds"]["lower"],
        "e2e_p95_upper_s": s["e2e_p95_bounds"]["upper"], "tpot_p50_s": s["tpot_s"]["p50"],
        "itl_p95_s": s["itl_s"]["p95"], "output_throughput_tok_s": s["output_throughput_tok_s"],
        "requests_per_s": s["requests_per_s"], "achieved_concurrency": s["achieved_concurrency"],
        "dispatch_lag_p99_s": s["dispatch_lag_s"]["p99"], "output_tokens_mean": s["output_tokens_mean"],
        "early_eos": s["early_eos"], "warmup_excluded": s["warmup_excluded"], "drain_excluded": s["drain_excluded"],
        "queue_p50_s": (s.get("queue_s") or {}).get("p50"), "queue_p95_s": (s.get("queue_s") or {}).get("p95"),
        "queue_reported": s.get("queue_reported", 0),
    }


def _fmt(value: Any, scale: float = 1.0, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value * scale:.{digits}f}"
    return str(value)


def markdown(summary: Dict[str, Any]) -> str:
    lines = [f"# revive bench: {summary['model']} at {', '.join(summary['targets'])}", "",
             f"SLO: P95 E2E <= {summary['slo']['e2e_p95_s']:g} s at {summary['slo']['confidence']:.0%} confidence "
             f"(one-sided order-statistic bound; a level needs >= {summary['slo']['min_completions']} completions). "
             f"Recommended concurrency: **{summary['recommended_concurrency'] or 'none'}**.", "",
             f"Latencies: {summary.get('latency_basis') or 'as the client saw them'}.", "",
             "| concurrency | verdict | completed / requests | TTFT p50 / p95 s | E2E p50 / p95 s | E2E p95 bounds s "
             "| TPOT p50 ms | output tok/s | achieved conc. | lag p99 ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for level in summary["levels"]:
        s, b = level["stats"], level["stats"]["e2e_p95_bounds"]
        lines.append(
            f"| {level['concurrency']} | {level['verdict']['verdict']} | {s['completed']} / {s['requests']} | "
            f"{_fmt(s['ttft_s']['p50'])} / {_fmt(s['ttft_s']['p95'])} | {_fmt(s['e2e_s']['p50'])} / "
            f"{_fmt(s['e2e_s']['p95'])} | {_fmt(b['lower'])} .. {_fmt(b['upper'])} | "
            f"{_fmt(s['tpot_s']['p50'], 1000, 1)} | {_fmt(s['output_throughput_tok_s'], 1, 1)} | "
            f"{_fmt(s['achieved_concurrency'], 1, 2)} | {_fmt(s['dispatch_lag_s']['p99'], 1000, 2)} |")
    queued = [level for level in summary["levels"] if level["stats"].get("queue_reported")]
    if queued:
        lines += ["", "## Front-door queue", "",
                  "| concurrency | requests with a wait reported | queue p50 / p95 / max s |", "|---|---|---|"]
        lines += [f"| {level['concurrency']} | {level['stats']['queue_reported']} | "
                  f"{_fmt(level['stats']['queue_s']['p50'])} / {_fmt(level['stats']['queue_s']['p95'])} / "
                  f"{_fmt(level['stats']['queue_s']['max'])} |" for level in queued]
    lines += ["", "## Verdicts", ""]
    for level in summary["levels"]:
        verdict = level["verdict"]
        lines.append(f"- **{level['concurrency']}: {verdict['verdict']}**")
        lines += [f"  - {reason}" for reason in verdict["reasons"]]
        lines += [f"  - not checked: {rule}" for rule in verdict["not_checked"]]
        usage = level["stats"]["usage_vs_stream"]
        if usage["mismatched"]:
            lines.append(f"  - usage vs stream: {usage['mismatched']} of {usage['with_usage']} answers differ, "
                         f"{usage['usage_minus_stream_tokens']} tokens in all")
    lines += ["", "## Knees", ""]
    lines += [f"- {k['metric']}: {k['from']} -> {k['to']}, {k['before']:.3f} s -> {k['after']:.3f} s "
              f"(elasticity {k['elasticity']})" for k in summary["knees"]] or ["- none found"]
    p = summary["provenance"]
    lines += ["", "## Provenance", "", f"- command: `{p['command']}`", f"- bench {p['bench_version']}, "
              f"{p['started']} .. {p['ended']}",
              f"- prompts: {p['prompts']['path']} sha256 {p['prompts']['sha256']} ({p['prompts']['count']}, "
              f"budget {p['prompts']['budget']} tokens, {p['prompts']['approximation']})"]
    lines += [f"- {label}: version {json.dumps(traits['version'])}; usage {traits['usage']}, [DONE] "
              f"{'sent' if traits['sends_done'] else 'not sent'}, stream_options "
              f"{'accepted' if traits['include_usage_accepted'] else 'refused'}"
              for label, traits in p["servers"].items()]
    lines += _node_sections(summary)
    lines += ["", "## Plots", ""]
    lines += [f"![{name}]({name})" for name in summary.get("plots") or []] or [NO_PLOTS]
    lines.append("")
    return "\n".join(lines)


def _node_sections(summary: Dict[str, Any]) -> List[str]:
    """Per-replica verdicts, outliers, node observations and node provenance (after `revive bench-judge`)."""
    lines: List[str] = []
    levels = [level for level in summary["levels"] if level.get("replicas")]
    if levels:
        lines += ["", "## Replicas", "", "| concurrency | replica | node | verdict | completed / requests | "
                  "TTFT p50 s | E2E p50 / p95 s | TPOT p50 ms | output tok/s |", "|---|---|---|---|---|---|---|---|---|"]
        for level in levels:
            for label, r in level["replicas"].items():
                lines.append(f"| {level['concurrency']} | {label} | {r['node'] or '?'} | {r['verdict']['verdict']} | "
                             f"{r['completed']} / {r['requests']} | {_fmt(r['ttft_s']['p50'])} | "
                             f"{_fmt(r['e2e_s']['p50'])} / {_fmt(r['e2e_s']['p95'])} | "
                             f"{_fmt(r['tpot_s']['p50'], 1000, 1)} | {_fmt(r['output_throughput_tok_s'], 1, 1)} |")
        flagged = [(level["concurrency"], o) for level in levels for o in level.get("outliers") or []]
        lines += ["", "## Outliers", ""]
        lines += [f"- {c}: **{o['replica']}** ({o['node']}) {o['metric']} {o['value']:.3f} s = {o['ratio']}x its "
                  f"peers' median {o['peers_median']:.3f} s (margin {o['margin']:.0%})" for c, o in flagged] \
            or ["- none"]
    observed = [level for level in summary["levels"] if level.get("node")]
    if observed:
        lines += ["", "## What the nodes saw", ""]
        for level in observed:
            node = level["node"]
            lines.append(f"- {level['concurrency']}: restarts {node['restarts']}, /health failures "
                         f"{node.get('health_failures', 0)}, OOM lines {node['oom_lines']}, GPU spread "
                         f"{_fmt(node.get('gpu_imbalance'), 1, 2)} ({node.get('gpu_imbalance_where') or '-'}); "
                         f"replica GPU means {json.dumps(node.get('replica_gpu_util_mean') or {})}")
    headers = (summary.get("review") or {}).get("node_headers") or {}
    if headers:
        lines += ["", "## Nodes", ""]
        lines += [f"- {name}: vLLM {h.get('vllm_version')}, release {h.get('release_id')}, "
                  f"{'simulated (lab twin), ' if h.get('simulated') else ''}GPUs from {h.get('gpu_source')}; "
                  f"replicas {', '.join(r['name'] + ':' + str(r['port']) for r in h.get('replicas') or [])}; "
                  f"argv `{' '.join(h.get('argv') or [])}`" for name, h in sorted(headers.items())]
    simulation = summary.get("simulation")
    if simulation:
        lines += ["", "## Simulation", "", f"- {simulation.get('note') or json.dumps(simulation)}"]
    return lines


def write(out: str, summary: Dict[str, Any], levels: Sequence[Dict[str, Any]]) -> List[str]:
    """Write the four reports; returns their paths."""
    os.makedirs(out, exist_ok=True)
    records = os.path.join(out, "requests.jsonl")
    with open(records, "w", encoding="utf-8") as handle:
        for level in levels:
            for record in level["records"]:
                handle.write(json.dumps(record, separators=(",", ":")) + "\n")
    return [records] + write_summary(out, summary)


def write_summary(out: str, summary: Dict[str, Any]) -> List[str]:
    """summary.json, levels.csv and report.md (what `revive bench-judge` rewrites); returns their paths."""
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, name) for name in ("summary.json", "levels.csv", "report.md")]
    with open(paths[0], "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
        handle.write("\n")
    with open(paths[1], "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for level in summary["levels"]:
            writer.writerow(csv_row(level))
    with open(paths[2], "w", encoding="utf-8") as handle:
        handle.write(markdown(summary))
    return paths


def level_summary(level: Dict[str, Any], verdict: Dict[str, Any], node: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """A level as summary.json keeps it: everything but the raw records."""
    return {"concurrency": level["concurrency"], "rate": level["rate"], "window": level["window"],
            "stats": level["stats"], "verdict": verdict, "node": node}
