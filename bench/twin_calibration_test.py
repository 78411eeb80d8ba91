"""Calibration of the vLLM twin against the field report's load test (docs/field-report.md ('Results')).

The field table and its setup are data/field-calibration.yml; the performance model's constants are in
module_utils/revive_perf.py. Setup as in the report: 8x V100-PCIe (lab/profiles/v100-pcie-8x.json), a 20B
FP16 chat model (InternLM2-Chat-20B dimensions, tests/fixtures/models.py), its launch flags,
NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1; closed loop at concurrency 8/16/32/64, prompts <= 256 tokens,
max_tokens=200, streaming, TTFT at the first content chunk.

Two runs, each printed beside the field table with its deviations beyond 15 %:
* virtual time: the twin's engine and performance model (the code the server runs) with a virtual clock,
  10 simulated minutes per level after 60 s of warm-up, as the report measured. Deterministic. The
  acceptance is asserted once, by tests/unit/test_perf_calibration.py (the same run at the table's levels);
  this bench only prints the numbers (lab/vllm_twin/README.md "Calibration" shows them).
* live HTTP: the real server and the asyncio client (bench/twin_client.py), with a time scale
  (TWIN_BENCH_SCALE, default 0.5: simulated time runs twice as fast as wall time) and shorter levels
  (TWIN_BENCH_SECONDS simulated seconds measured, default 120, after 30 s).

    make bench            # or: .venv/bin/python -m pytest -s bench/twin_calibration_test.py
"""
from __future__ import annotations

import asyncio
import io
import math
import os
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))
sys.path.insert(0, str(REPO / "lab" / "vllm_twin" / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import twin_client  # noqa: E402
from vllm._revive import module_utils  # noqa: E402
from vllm._twin import perf, vlog  # noqa: E402
from vllm._twin.calibrate import run_level  # noqa: E402
from vllm._twin.engine import EngineConfig  # noqa: E402

FIELD = yaml.safe_load((REPO / "data" / "field-calibration.yml").read_text())
FIELD_LEVELS = {level["concurrency"]: level for level in FIELD["levels"]}
SETUP = FIELD["setup"]
LEVELS = (8, 16, 32, 64)
TOLERANCE = 0.15
V100_CUDA_TOTAL = 34089730048


def field_setup():
    """Engine config and performance model for the report's deployment, through the same module_utils."""
    sys.path.insert(0, str(REPO / "tests"))
    from fixtures.models import model_config  # type: ignore[import-not-found]
    revive_model = module_utils("revive_model")
    revive_kv = module_utils("revive_kv")
    tp = SETUP["tensor_parallel_size"]
    facts = revive_model.model_from_config(model_config(SETUP["model_fixture"], dtype="F16"))
    kv = revive_kv.kv_cache_plan(facts, tp, V100_CUDA_TOTAL, SETUP["gpu_memory_utilization"], SETUP["swap_space_gib"],
                                 max_num_batched_tokens=SETUP["max_num_batched_tokens"],
                                 max_num_seqs=SETUP["max_num_seqs"], max_model_len=SETUP["max_model_len"])
    shape = perf.ModelShape(facts["parameter_count"], facts["weight_bytes"], facts["num_hidden_layers"],
                            facts["hidden_size"], revive_kv.kv_bytes_per_token(facts))
    transport = perf.choose_transport(tp, False, False, "SYS", SETUP["nccl_env"]["NCCL_P2P_DISABLE"] == "1",
                                      SETUP["nccl_env"]["NCCL_SHM_DISABLE"] == "1")
    model = perf.PerfModel(shape, perf.gpu_spec("Tesla V100-PCIE-32GB", "volta"), tp, transport,
                           SETUP["enforce_eager"], 0)
    config = EngineConfig(block_size=16, num_gpu_blocks=kv.num_gpu_blocks, num_cpu_blocks=kv.num_cpu_blocks,
                          max_num_seqs=SETUP["max_num_seqs"], max_num_batched_tokens=SETUP["max_num_batched_tokens"],
                          max_model_len=SETUP["max_model_len"])
    return config, model


def within(value: float, target: float) -> bool:
    return abs(value - target) <= TOLERANCE * target


def table(rows, title: str) -> str:
    lines = [title,
             "| conc | P50 TTFT field | P50 TTFT twin | gen tok/s field | gen tok/s twin | per-stream field | "
             "per-stream twin (decode / total) | P95 E2E twin | mean tokens |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        level = FIELD_LEVELS.get(r.concurrency, {})
        ttft_f = f"{level['ttft_p50_s']:.1f} s" if "ttft_p50_s" in level else "-"
        thr_f = (f"{level['throughput_tok_s']:.0f}" if "throughput_tok_s" in level
                 else "still rising" if level.get("throughput_rising") else "-")
        stream_f = f"{level['per_stream_tok_s']:.0f} tok/s" if "per_stream_tok_s" in level else "-"
        e2e_note = f" (> {level['e2e_p95_s_above']:.0f} s: rejected)" if "e2e_p95_s_above" in level else ""
        lines.append(f"| {r.concurrency} | {ttft_f} | {r.ttft_p50:.2f} s | {thr_f} | {r.throughput:.0f} | {stream_f} | "
                     f"{r.per_stream_decode:.1f} / {r.per_stream_total:.1f} tok/s | {r.e2e_p95:.1f} s{e2e_note} | "
                     f"{getattr(r, 'mean_output_tokens', getattr(r, 'mean_tokens', 0)):.0f} |")
    return "\n".join(lines)


def check(rows) -> list:
    """Deviations from the field table beyond TOLERANCE (printed, not asserted)."""
    by = {r.concurrency: r for r in rows}
    failures = []
    for c, level in FIELD_LEVELS.items():
        r = by[c]
        if "ttft_p50_s" in level and not within(r.ttft_p50, level["ttft_p50_s"]):
            failures.append(f"P50 TTFT at {c}: {r.ttft_p50:.2f} s vs {level['ttft_p50_s']} s")
        if "throughput_tok_s" in level and not within(r.throughput, level["throughput_tok_s"]):
            failures.append(f"throughput at {c}: {r.throughput:.0f} vs {level['throughput_tok_s']}")
        if "per_stream_tok_s" in level and not within(r.per_stream_decode, level["per_stream_tok_s"]):
            failures.append(f"per-stream speed at {c}: {r.per_stream_decode:.1f} vs {level['per_stream_tok_s']} tok/s")
        if "e2e_p95_s_above" in level and not r.e2e_p95 > level["e2e_p95_s_above"]:
            failures.append(f"P95 E2E at {c}: {r.e2e_p95:.1f} s, not above {level['e2e_p95_s_above']} s")
    return failures


def test_virtual_time_calibration_against_the_field_notes():
    vlog.set_stream(io.StringIO())
    try:
        config, model = field_setup()
        rows = [run_level(config, model, c, duration=600.0, warmup=60.0) for c in LEVELS]
    finally:
        vlog.set_stream(sys.stdout)
    print()
    print(table(rows, "Twin, virtual time, 10 simulated minutes per level after 60 s (field report beside):"))
    print("deviations beyond 15 %:", check(rows) or "none")


@pytest.fixture(scope="module")
def live_twin(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("calibration")
    model = harness.write_model("internlm2-chat-20b", tmp / "chat-20b-fp16")
    scale = float(os.environ.get("TWIN_BENCH_SCALE", "0.5"))
    env = harness.twin_env(tmp, time_scale=scale, extra=harness.FIELD_NOTES_ENV)
    twin = harness.start(model, harness.FIELD_NOTES_FLAGS + ["--disable-frontend-multiprocessing"], env,
                         tmp / "twin.log", served_name="chat-20b", timeout=600)
    yield twin, scale
    twin.stop()


def test_live_http_calibration_against_the_field_notes(live_twin):
    twin, scale = live_twin
    seconds = float(os.environ.get("TWIN_BENCH_SECONDS", "120"))
    url = f"http://127.0.0.1:{twin.port}"
    asyncio.run(twin_client.warm_up(url, "chat-20b", 20, scale))
    rows = []
    for concurrency in LEVELS:
        rows.append(asyncio.run(twin_client.run_level(url, "chat-20b", concurrency, seconds, 30.0, scale)))
    print()
    print(table(rows, f"Twin over HTTP, time scale {scale} (simulated seconds), {seconds:.0f} s measured per level "
                      "after 30 s (field report beside):"))
    print("failed requests per level:", [r.failures for r in rows])
    print("deviations beyond 15 %:", check(rows) or "none")
    assert all(r.failures == 0 and r.requests > 0 and not math.isnan(r.ttft_p50) for r in rows)


if __name__ == "__main__":
    test_virtual_time_calibration_against_the_field_notes()
