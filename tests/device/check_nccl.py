#!/usr/bin/env python3
"""Run the NCCL check (module_utils/revive_nccl/, the code of the nccl_check module) on a machine with NVIDIA GPUs.

Needs python3 with torch (CUDA build, NCCL) and nvidia-smi; no Ansible, no network. From a plain checkout:

    python3 tests/device/check_nccl.py [--out FILE.json] [--sizes 1MiB,4MiB,...] [--world 1,2,4,8]

For every world size n (default: 1 and each of 2, 4, 8 the machine has GPUs for) it checks one replica of GPUs
0..n-1 the way the module does on a node: one rank process per GPU, CUDA_DEVICE_ORDER=PCI_BUS_ID and
CUDA_VISIBLE_DEVICES as the planner writes them, the ranks pinned to NUMA node 0's CPUs, an all-reduce sweep,
and compare: the same with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 forced. The plan's side has no NCCL
variables, as the planner writes for NVLink-connected GPUs. Every rank also gets NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 (NVLink multicast stays off on shared hosts) and
this process's own environment as the base (the image's library paths), where the module uses systemd's.

Then two failures on real hardware, which must fail the way the module reports them: a rank whose GPU is not
visible (CUDA_VISIBLE_DEVICES=0,0: one GPU for two ranks) fails and stops the other; a 1 s deadline kills
the rank mid-start. Exit status: 0 all as expected, 1 something was not, 2 the check could not run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bin"))

from revive_cli import use_module_utils  # noqa: E402

use_module_utils()

from ansible.module_utils.revive_nccl import CheckSpec, Deps, NcclCheckError, check, parse_size  # noqa: E402

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True, timeout=60).stdout


def gpu_facts() -> Dict[str, Any]:
    rows = [line.split(",") for line in smi("--query-gpu=index,pci.bus_id,name", "--format=csv,noheader").splitlines()
            if line.strip()]
    return {"devices": [{"index": int(i), "pci_bus_id": bus.strip(), "name": name.strip()} for i, bus, name in rows]}


def node0_cpus() -> str:
    path = Path("/sys/devices/system/node/node0/cpulist")
    return path.read_text().strip() if path.exists() else ""


def replica(name: str, gpus: List[int], visible: str, cpu_list: str) -> Dict[str, Any]:
    return {"name": name, "index": 0, "gpus": gpus, "cpu_list": cpu_list, "numa_node": 0 if cpu_list else None,
            "env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": visible}, "nvlink": None,
            "slowest_path": None}


def table(entry: Dict[str, Any]) -> str:
    run, other = entry["run"], entry.get("compare") or {}
    lines = [f"{entry['name']}: world size {entry['world_size']}, ok={entry['ok']}, {run.get('duration_s')} s, "
             f"versions {run.get('versions')}, transports {run.get('transports')}",
             f"  {'size':>8}  {'time_us':>10}  {'algbw':>8}  {'busbw':>8}  |  {'P2P/SHM off: time_us':>21}  "
             f"{'algbw':>8}  {'busbw':>8}  {'ratio':>6}"]
    alt = {row["bytes"]: row for row in other.get("sizes") or []}
    for row in run.get("sizes") or []:
        o = alt.get(row["bytes"])
        ratio = f"{o['algbw_gbps'] / row['algbw_gbps']:.3f}" if o and row["algbw_gbps"] else "-"
        lines.append(f"  {row['size']:>8}  {row['time_us']:>10}  {row['algbw_gbps']:>8}  {row['busbw_gbps']:>8}  |  "
                     f"{(o or {}).get('time_us', '-'):>21}  {(o or {}).get('algbw_gbps', '-'):>8}  "
                     f"{(o or {}).get('busbw_gbps', '-'):>8}  {ratio:>6}")
    if other:
        lines.append(f"  compare: {other.get('verdict')}: {other.get('message')}")
    if not entry["ok"]:
        lines.append(f"  reason: {entry['reason']}")
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write every result as JSON here")
    parser.add_argument("--sizes", default="1MiB,4MiB,16MiB,64MiB,256MiB")
    parser.add_argument("--world", help="world sizes, e.g. 1,2 (default: 1 and 2/4/8 as far as the GPUs go)")
    parser.add_argument("--timeout", type=float, default=180)
    args = parser.parse_args(argv)
    try:
        facts = gpu_facts()
        topo = smi("topo", "-m")
    except (OSError, subprocess.SubprocessError) as error:
        print(f"check_nccl: nvidia-smi did not answer: {error}", file=sys.stderr)
        return 2
    count = len(facts["devices"])
    worlds = [int(w) for w in args.world.split(",")] if args.world else [1] + [n for n in (2, 4, 8) if n <= count]
    cpus = node0_cpus()
    spec = CheckSpec(python=sys.executable, backend="nccl", sizes=[parse_size(s) for s in args.sizes.split(",")],
                     timeout_s=args.timeout, compare=True, extra_env=dict(NO_MULTICAST), base_env=dict(os.environ),
                     single_gpu="run", log_lines=60)
    print(f"{platform.node()}: {count} GPU(s) {sorted({d['name'] for d in facts['devices']})}; python {sys.executable}")
    print(topo)
    report: Dict[str, Any] = {"host": platform.node(), "gpus": facts, "topo_m": topo, "node0_cpus": cpus,
                              "spec": {"sizes": list(spec.sizes), "iterations": spec.iterations, "warmup": spec.warmup,
                                       "extra_env": spec.extra_env}, "sweeps": [], "failures": []}
    ok = True
    started = time.monotonic()
    try:
        for n in worlds:
            result = check([replica(f"tp{n}", list(range(n)), ",".join(map(str, range(n))), cpus)], spec, Deps(),
                           gpu=facts)
            report["sweeps"].append(result)
            print(table(result["replicas"][0]))
            ok = ok and result["ok"] and (result["replicas"][0]["compare"] or {}).get("ok", False)
        # The failure paths, on the real driver and NCCL: both must fail, and say why.
        quick = CheckSpec(**dict(spec.__dict__, compare=False, sizes=[parse_size("1MiB")], timeout_s=60.0))
        unseen = check([replica("unseen-gpu", [0, 0], "0,0", cpus)], quick, Deps(), gpu=facts)
        deadline = check([replica("deadline", [0], "0", cpus)], CheckSpec(**dict(quick.__dict__, timeout_s=1.0)),
                         Deps(), gpu=facts)
    except NcclCheckError as error:
        print(f"check_nccl: cannot run: {error}", file=sys.stderr)
        return 2
    for name, result, expect in (("unseen GPU (CUDA_VISIBLE_DEVICES=0,0)", unseen, "failed in phase"),
                                 ("1 s deadline", deadline, "did not finish within the 1 s deadline")):
        entry = result["replicas"][0]
        as_expected = not result["ok"] and expect in (entry["reason"] or "")
        ok = ok and as_expected
        report["failures"].append(dict(result, expected=expect, as_expected=as_expected))
        print(f"failure path '{name}': {'as expected' if as_expected else 'NOT AS EXPECTED'}: "
              f"{(entry['reason'] or 'passed')[:1500]}")
    report["wall_s"] = round(time.monotonic() - started, 1)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"check_nccl: {'all as expected' if ok else 'SOMETHING WAS NOT AS EXPECTED'} in {report['wall_s']} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
