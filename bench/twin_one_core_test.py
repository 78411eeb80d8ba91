"""The twin is not the bottleneck: on one core, in real time, it sustains 64 concurrent streams.

The server (and its idle TP worker processes) run pinned to CPU 0 with `taskset -c 0`, at time scale 1
(real time), with the field notes' deployment; the closed-loop client runs in this process on another
CPU. Over the measured window the benchmark prints the server's CPU use (share of one core, from
/proc/<pid>/stat) and compares what the clients got with what the same engine and performance model
give in virtual time, where the twin costs nothing: if the server kept up, the token throughput agrees.

    .venv/bin/python -m pytest -s bench/twin_one_core_test.py     (TWIN_ONE_CORE_SECONDS, default 60)
"""
from __future__ import annotations

import asyncio
import io
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))
sys.path.insert(0, str(REPO / "lab" / "vllm_twin" / "src"))

import harness  # noqa: E402
import twin_client  # noqa: E402
from twin_calibration_test import field_setup  # noqa: E402
from vllm._twin import vlog  # noqa: E402
from vllm._twin.calibrate import run_level  # noqa: E402

CONCURRENCY = 64
WARMUP = 20.0


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().split(b")")[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_one_core_sustains_64_streams_in_real_time(tmp_path):
    assert shutil.which("taskset"), "taskset (util-linux) is needed to pin the server to one CPU"
    seconds = float(os.environ.get("TWIN_ONE_CORE_SECONDS", "60"))
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpus = cpus[0], set(cpus[1:]) or {cpus[0]}
    model = harness.write_model("internlm2-chat-20b", tmp_path / "chat-20b-fp16")
    env = harness.twin_env(tmp_path, time_scale=1.0, extra={**harness.FIELD_NOTES_ENV,
                                                             "VLLM_SIM_COLD_START_REQUESTS": "0"})
    twin = harness.start(model, harness.FIELD_NOTES_FLAGS + ["--disable-frontend-multiprocessing"], env,
                         tmp_path / "twin.log", served_name="chat-20b", timeout=600, cpu=server_cpu)
    os.sched_setaffinity(0, client_cpus)
    try:
        pid = int(Path(f"/proc/{twin.process.pid}/task/{twin.process.pid}/children").read_text().split()[0]) \
            if Path(f"/proc/{twin.process.pid}/comm").read_text().strip() == "taskset" else twin.process.pid

        async def measured():
            loop = asyncio.get_running_loop()
            cpu_marks = {}
            loop.call_later(WARMUP, lambda: cpu_marks.setdefault("start", (time.monotonic(), cpu_seconds(pid))))
            loop.call_later(WARMUP + seconds, lambda: cpu_marks.setdefault("end", (time.monotonic(), cpu_seconds(pid))))
            stats = await twin_client.run_level(f"http://127.0.0.1:{twin.port}", "chat-20b", CONCURRENCY, seconds,
                                                WARMUP, 1.0)
            return stats, cpu_marks

        stats, marks = asyncio.run(measured())
    finally:
        os.sched_setaffinity(0, set(cpus))
        twin.stop()
    (t0, c0), (t1, c1) = marks["start"], marks["end"]
    core_share = (c1 - c0) / (t1 - t0)
    vlog.set_stream(io.StringIO())
    try:
        config, perf_model = field_setup()
        reference = run_level(config, perf_model, CONCURRENCY, duration=seconds, warmup=WARMUP)
    finally:
        vlog.set_stream(sys.stdout)
    print()
    print(f"One core (CPU {server_cpu}), real time, {CONCURRENCY} streams, {seconds:.0f} s measured after {WARMUP:.0f} s:")
    print("| | over HTTP on one core | engine model in virtual time |")
    print("|---|---|---|")
    print(f"| requests completed | {stats.requests} | {reference.requests} |")
    print(f"| generation throughput | {stats.throughput:.0f} tok/s | {reference.throughput:.0f} tok/s |")
    print(f"| per-stream decode speed | {stats.per_stream_decode:.1f} tok/s | {reference.per_stream_decode:.1f} tok/s |")
    print(f"| P50 TTFT | {stats.ttft_p50:.2f} s | {reference.ttft_p50:.2f} s |")
    print(f"| P95 E2E | {stats.e2e_p95:.2f} s | {reference.e2e_p95:.2f} s |")
    print(f"server CPU: {core_share * 100:.0f} % of one core; failed requests: {stats.failures}")
    assert stats.failures == 0
    assert core_share < 0.9
    # Kept up: the tokens delivered equal the engine model's. (Per-stream speed and TTFT may differ a
    # little: clients that connect a few ms apart can split the 64-stream cohort in two prefill steps.)
    assert stats.throughput >= 0.95 * reference.throughput
