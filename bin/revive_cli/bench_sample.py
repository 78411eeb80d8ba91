"""revive bench-sample: sample a GPU node's replicas, units and GPUs while a bench runs (playbooks/benchmark.yml).

    revive bench-sample --out FILE [--record /var/lib/revive/releases.json] [--interval 1] [--duration S]
                        [--stop-file PATH] [--node NAME]

Samples every --interval seconds until --stop-file exists or --duration seconds passed, then reads the journal
for out-of-memory lines of the window; writes JSON lines to --out (module_utils/revive_bench/sampler.py).
Exit status: 0 done, 2 usage error or nothing to sample (no release record).
"""
from __future__ import annotations

import argparse
import socket
import sys
from typing import List

from ansible.module_utils.revive_bench.sampler import Probes, SampleError, run

from revive_cli.bench import _number


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="revive bench-sample", description=__doc__.split("\n\n")[0])
    positive = _number(float, 0, True)
    parser.add_argument("--out", required=True, help="JSON lines file")
    parser.add_argument("--record", default="/var/lib/revive/releases.json", help="the node's release record")
    parser.add_argument("--interval", type=positive, default=1.0, help="seconds between samples (default 1)")
    parser.add_argument("--duration", type=positive, default=3600.0, help="stop after this long (default 3600)")
    parser.add_argument("--stop-file", help="stop when this file exists")
    parser.add_argument("--node", default=socket.gethostname(), help="this node's inventory name")
    parser.add_argument("--host", default="", help="address of the replicas' /health and /metrics (default: each "
                        "replica's own, the --host its argv in the record binds)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        count = run(args.record, args.out, args.interval, args.duration, args.stop_file, args.node,
                    probes=Probes(host=args.host))
    except SampleError as exc:
        print(f"revive bench-sample: {exc}", file=sys.stderr)
        return 2
    print(f"revive bench-sample: {count} samples of {args.node} in {args.out}", file=sys.stderr)
    return 0
