"""revive bench-judge: judge a bench report again with the GPU nodes' samples; plots (playbooks/benchmark.yml).

    revive bench-judge DIR [--samples FILE ...] [--outlier-margin 0.25] [--max-gpu-imbalance 0.2] [--no-plots]
                       [--json]

DIR is a `revive bench --out` directory; each FILE a node's `revive bench-sample` output. Every level's verdict
takes the nodes' observations (restarts, /health, /metrics counters, OOM lines, GPU balance); with several
replicas, each gets a verdict of its own, each node the worst of its replicas', and replicas slower than their peers
by more than the margin are flagged (module_utils/revive_bench/review.py). summary.json, levels.csv and report.md
are rewritten, the PNG plots rendered beside them (matplotlib, on the controller).
Exit status: as `revive bench` (0 pass, 1 fail, 3 inconclusive/invalid), 2 when the report or a sample file cannot
be read.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List

from ansible.module_utils.revive_bench.observe import ObserveError, gpu_series, level_spans, load_samples
from ansible.module_utils.revive_bench.report import write_summary
from ansible.module_utils.revive_bench.review import ReviewError, load_report, review

from revive_cli.bench import _number, _share


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="revive bench-judge", description=__doc__.split("\n\n")[0])
    parser.add_argument("report", help="a `revive bench --out` directory")
    parser.add_argument("--samples", nargs="*", default=[], help="node sample files (revive bench-sample)")
    parser.add_argument("--outlier-margin", type=_number(float, 0, True), default=0.25,
                        help="flag a replica this much slower than its peers' median (default 0.25)")
    parser.add_argument("--max-gpu-imbalance", type=_share, help="GPU utilisation spread tolerance (default: the "
                        "report's, 0.20)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--json", action="store_true", help="print the new summary.json on stdout")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        summary, records = load_report(args.report)
        nodes = [load_samples(path) for path in args.samples]
    except (ReviewError, ObserveError) as exc:
        print(f"revive bench-judge: {exc}", file=sys.stderr)
        return 2
    judged = review(summary, records, nodes, args.outlier_margin, args.max_gpu_imbalance)
    plots: List[str] = []
    if not args.no_plots:
        from ansible.module_utils.revive_bench import plots as plotting
        windows = [(c, ws, we) for c, _, ws, we in level_spans(judged)]
        try:
            plots = plotting.render(judged, args.report, gpu_series(nodes) or None, windows)
        except plotting.PlotError as exc:
            print(f"revive bench-judge: {exc} (or pass --no-plots)", file=sys.stderr)
            return 2
    judged["plots"] = [os.path.basename(path) for path in plots]
    write_summary(args.report, judged)
    if args.json:
        sys.stdout.write(json.dumps(judged, indent=2) + "\n")
    for level in judged["levels"]:
        verdict = level["verdict"]
        print(f"bench-judge: level {level['concurrency']}: {verdict['verdict']}: {'; '.join(verdict['reasons'])}",
              file=sys.stderr)
        for outlier in level["outliers"]:
            print(f"bench-judge: level {level['concurrency']}: outlier {outlier['replica']} {outlier['metric']} "
                  f"{outlier['value']:.3f} s = {outlier['ratio']}x its peers' median", file=sys.stderr)
    verdicts = ", ".join(f"{c}: {v}" for c, v in judged["verdicts"].items())
    print(f"revive bench-judge: {verdicts}; recommended concurrency {judged['recommended_concurrency'] or 'none'}; "
          f"reports in {args.report}", file=sys.stderr)
    return judged["exit_code"]
