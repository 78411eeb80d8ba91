"""Benchmark: the lab's cold `up` (debootstrap into an empty cache), warm `up`, re-`up` and `down`.

Shape: the default fleet, 2 GPU nodes + model-store, bench, lb (5 hosts). Target (issue 2): warm `up` of
5 hosts in <= 20 s on 2 cores. Uses its own state and cache dirs, so a running `make demo` lab is untouched;
the cold run needs a Debian mirror (REVIVE_LAB_MIRROR) and about a minute.
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARM_TARGET_S = 20.0
WARM_RUNS = 3


def timed_lab(state_dir: Path, env: dict, *args: str) -> float:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "bin/lab"), "--state-dir", str(state_dir), *args],
                          capture_output=True, text=True, env=env)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, f"bin/lab {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}"
    return elapsed


def test_lab_up_and_down_times(tmp_path):
    env = dict(os.environ, REVIVE_LAB_CACHE=str(tmp_path / "cache"))
    state_dir = tmp_path / "lab"
    try:
        cold = timed_lab(state_dir, env, "up")
        down_times = [timed_lab(state_dir, env, "down")]
        warm = []
        for _ in range(WARM_RUNS):
            warm.append(timed_lab(state_dir, env, "up"))
            again = timed_lab(state_dir, env, "up")
            down_times.append(timed_lab(state_dir, env, "down"))
    finally:
        subprocess.run([sys.executable, str(REPO / "bin/lab"), "--state-dir", str(state_dir), "down"],
                       capture_output=True, env=env)
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
    print(f"\nlab benchmark, 5 hosts (2 GPU nodes + model-store, bench, lb), {os.cpu_count()} CPUs:")
    print(f"  cold up (debootstrap + boot): {cold:6.1f} s")
    print(f"  warm up (cached rootfs):      {statistics.median(warm):6.1f} s median of {WARM_RUNS} "
          f"({', '.join(f'{w:.1f}' for w in warm)})")
    print(f"  up again (no-op check):       {again:6.1f} s")
    print(f"  down:                         {statistics.median(down_times):6.1f} s median of {len(down_times)}")
    print(f"  target warm up <= {WARM_TARGET_S:.0f} s: {'met' if max(warm) <= WARM_TARGET_S else 'MISSED'}")
    assert max(warm) <= WARM_TARGET_S
