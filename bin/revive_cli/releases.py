"""revive releases: the vLLM release matrix - every release of data/vllm-releases.yml on each compute capability
and GPU set, its pins, locks and installability, and which release the planner picks where.

    revive releases [--json] [--gpus SPEC[,SPEC...]] [--data FILE] [--locks DIR]

--gpus takes what `revive plan --gpus` takes (a lab profile name, a facts JSON from `revive gpus --json`, or
COUNTxMEMORY_GIB[@CC]); default: the lab profiles v100-pcie-8x, dgx1-v100 and a100-sxm4-8x (probed through the
lab's fake NVML: `make fakenvml`). Every cell is the planner's release rule (module_utils/revive_plan/rules.py)
with that release pinned, so the matrix says what `site.yml` would do (module_utils/revive_release_matrix.py).
Exit status: 0 printed, 2 bad arguments or data.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List

from ansible.module_utils.revive_release_matrix import format_matrix, matrix
from ansible.module_utils.revive_releases import ReleaseDataError, load_release_file

from revive_cli import REPO
from revive_cli.plan import InputError, resolve_gpus

DEFAULT_GPU_SETS = "v100-pcie-8x,dgx1-v100,a100-sxm4-8x"


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="revive releases", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="the matrix as JSON")
    parser.add_argument("--gpus", default=DEFAULT_GPU_SETS,
                        help=f"GPU sets, comma-separated, as revive plan --gpus (default {DEFAULT_GPU_SETS})")
    parser.add_argument("--data", default=str(REPO / "data" / "vllm-releases.yml"), help="the release data")
    parser.add_argument("--locks", default=str(REPO / "data" / "locks"), help="the lock directory")
    return parser.parse_args(argv)


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    try:
        data = load_release_file(args.data)
        gpu_sets = {spec: resolve_gpus(spec, None)[0] for spec in args.gpus.split(",") if spec.strip()}
    except (InputError, ReleaseDataError, OSError) as exc:
        print(f"revive releases: {exc}", file=sys.stderr)
        return 2
    if not gpu_sets:
        print("revive releases: --gpus: give at least one GPU set", file=sys.stderr)
        return 2
    result = matrix(data, args.locks, gpu_sets)
    sys.stdout.write(json.dumps(result, indent=2) + "\n" if args.json else format_matrix(result) + "\n")
    return 0
