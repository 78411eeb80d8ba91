"""The one performance model (module_utils/revive_perf.py) against the field table (data/field-calibration.yml,
docs/field-report.md ('Results')): what the planner predicts and what the lab twin's engine timing produces.

Setup as measured: 8x V100-PCIe (lab/profiles/v100-pcie-8x.json), the 20B FP16 model (InternLM2-Chat-20B
dimensions), one replica of TP 8 across both sockets with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, prompts of at
most 256 tokens, max_tokens 200, a closed loop.

Tolerances, and what each side reads off the table:
* the planner (revive_perf.closed_loop through revive_plan.layout.predict_layout, every prompt the 256-token
  cap): per-stream speed, which in the closed form is throughput / concurrency (464 / 16, 768 / 32) and the
  18 tok/s at 64, within 5 %; P50 TTFT at 16 and 32 within 10 %; P95 within the SLO at 32 and past it at 64.
* the twin (revive_perf.PerfModel.step under the twin's 0.5.4 scheduler in virtual time, calibrate.run_level,
  the table's ten minutes per level after 60 s of warm-up, the twin's approximation of the field prompts):
  P50 TTFT and total throughput at 16 and 32 within 15 %; at 64 the decode speed after the first token,
  (N - 1) / (E2E - TTFT), within 15 %; P95 within the SLO at 32 and past it at 64; throughput still rising
  from 32 to 64.
* the two evaluations of the one model agree at the anchor: the decode step of 32 streams within 2 %, and the
  closed form's queued prefill (TTFT_QUEUE_FACTOR x a 256-token prompt at NET_PROMPT_BANDWIDTH) within 10 % of
  the step model's cost per prompt of a 32-prompt cohort of the twin's prompts.
"""
from __future__ import annotations

import io
import random
import statistics
import sys

import pytest
import yaml
from ansible.module_utils import revive_perf
from ansible.module_utils.revive_kv import kv_bytes_per_token, kv_cache_plan
from ansible.module_utils.revive_model import model_from_config
from ansible.module_utils.revive_plan.gpus import gpu_set_from_facts
from ansible.module_utils.revive_plan.inputs import Decisions
from ansible.module_utils.revive_plan.layout import describe_group, form_groups, predict_layout, transport_for
from fixtures.gpus import REPO, lab_facts
from fixtures.models import model_config

sys.path.insert(0, str(REPO / "lab" / "vllm_twin" / "src"))

from vllm._twin import perf, vlog  # noqa: E402
from vllm._twin.calibrate import field_prompt_tokens, run_level  # noqa: E402
from vllm._twin.engine import EngineConfig  # noqa: E402

FIELD = yaml.safe_load((REPO / "data" / "field-calibration.yml").read_text())
LEVELS = {level["concurrency"]: level for level in FIELD["levels"]}
SETUP, LOAD, SLO = FIELD["setup"], FIELD["load"], FIELD["slo"]
TP = SETUP["tensor_parallel_size"]
TWIN_TOLERANCE = 0.15
TWIN_WARMUP_S = 60.0
V100_CUDA_TOTAL = 34089730048  # what CUDA reports for a V100-32GB (the twin derives it from NVML)

# field report "Results": concurrency -> (per-stream tok/s, P50 TTFT s); 64: P95 > 12 s (rejected)
NOTES_RESULTS = {c: (level.get("per_stream_tok_s") or level["throughput_tok_s"] / c, level.get("ttft_p50_s"))
                 for c, level in LEVELS.items()}


def model_facts():
    return model_from_config(model_config(SETUP["model_fixture"], dtype="F16"))


@pytest.fixture(scope="module")
def v100():
    return gpu_set_from_facts(lab_facts(SETUP["lab_profile"]), [], Decisions())


def predict(gpus, tp, streams, name="internlm2-chat-20b", p2p_disabled=True):
    model = model_from_config(model_config(name, dtype="F16"))
    group = describe_group(gpus, form_groups(gpus, tp)[0])
    transport = transport_for(group, p2p_disabled, p2p_disabled)
    return predict_layout(model, gpus, tp, transport, group.crosses_socket, streams, 256, 200, True,
                          model["weight_bytes"])


@pytest.mark.parametrize("concurrency", [16, 32, 64])
def test_anchor_reproduces_the_notes_per_stream_speed(v100, concurrency):
    speed, _ = NOTES_RESULTS[concurrency]
    assert predict(v100, 8, concurrency).per_stream_tok_s == pytest.approx(speed, rel=0.05)


@pytest.mark.parametrize("concurrency", [16, 32])
def test_anchor_reproduces_the_notes_ttft(v100, concurrency):
    _, ttft = NOTES_RESULTS[concurrency]
    assert predict(v100, 8, concurrency).ttft_p50_s == pytest.approx(ttft, rel=0.1)


def test_anchor_meets_the_slo_at_32_and_misses_it_at_64(v100):
    assert predict(v100, 8, 32).e2e_p95_s <= 12.0 < predict(v100, 8, 64).e2e_p95_s


def test_the_planner_anchor_is_the_field_setup_and_its_throughput_still_rises(v100):
    """The anchor tests above predict the file's setup: TP 8 over the network transport across sockets."""
    assert (TP, LOAD["prompt_tokens_max"], LOAD["max_tokens"], SLO["e2e_p95_s"]) == (8, 256, 200, 12.0)
    group = describe_group(v100, form_groups(v100, TP)[0])
    assert transport_for(group, True, True) == "net" and group.crosses_socket
    assert LEVELS[64]["throughput_rising"]
    assert predict(v100, TP, 64).throughput_tok_s > predict(v100, TP, 32).throughput_tok_s


@pytest.fixture(scope="module")
def twin_levels():
    """The twin's engine in virtual time at every level of the table (the code the twin server runs)."""
    facts = model_facts()
    kv = kv_cache_plan(facts, TP, V100_CUDA_TOTAL, SETUP["gpu_memory_utilization"], SETUP["swap_space_gib"],
                       max_num_batched_tokens=SETUP["max_num_batched_tokens"], max_num_seqs=SETUP["max_num_seqs"],
                       max_model_len=SETUP["max_model_len"])
    shape = perf.ModelShape(facts["parameter_count"], facts["weight_bytes"], facts["num_hidden_layers"],
                            facts["hidden_size"], kv_bytes_per_token(facts))
    transport = perf.choose_transport(TP, False, False, "SYS", SETUP["nccl_env"]["NCCL_P2P_DISABLE"] == "1",
                                      SETUP["nccl_env"]["NCCL_SHM_DISABLE"] == "1")
    model = perf.PerfModel(shape, perf.gpu_spec("Tesla V100-PCIE-32GB", "volta"), TP, transport,
                           SETUP["enforce_eager"], 0)
    config = EngineConfig(block_size=16, num_gpu_blocks=kv.num_gpu_blocks, num_cpu_blocks=kv.num_cpu_blocks,
                          max_num_seqs=SETUP["max_num_seqs"], max_num_batched_tokens=SETUP["max_num_batched_tokens"],
                          max_model_len=SETUP["max_model_len"])
    vlog.set_stream(io.StringIO())
    try:
        return {c: run_level(config, model, c, duration=float(LOAD["seconds_per_level"]), warmup=TWIN_WARMUP_S,
                             max_tokens=LOAD["max_tokens"]) for c in LEVELS}
    finally:
        vlog.set_stream(sys.stdout)


def test_the_twin_runs_the_planners_model():
    assert perf.PerfModel is revive_perf.PerfModel and perf.gpu_spec is revive_perf.gpu_spec
    net = perf.choose_transport(TP, False, False, "SYS", True, True)
    assert net.name == "net"
    assert net.latency == revive_perf.allreduce_latency("net", TP, True) == pytest.approx(121e-6)
    assert net.bandwidth == revive_perf.TRANSPORTS["net"].bandwidth


@pytest.mark.parametrize("concurrency", [16, 32])
def test_the_twin_reproduces_ttft_and_throughput(twin_levels, concurrency):
    level, result = LEVELS[concurrency], twin_levels[concurrency]
    assert result.ttft_p50 == pytest.approx(level["ttft_p50_s"], rel=TWIN_TOLERANCE)
    assert result.throughput == pytest.approx(level["throughput_tok_s"], rel=TWIN_TOLERANCE)


def test_the_twin_reproduces_the_knee_at_64(twin_levels):
    level, result = LEVELS[64], twin_levels[64]
    assert result.per_stream_decode == pytest.approx(level["per_stream_tok_s"], rel=TWIN_TOLERANCE)
    assert result.e2e_p95 > level["e2e_p95_s_above"]
    assert level["throughput_rising"] and result.throughput > twin_levels[32].throughput


def test_the_twin_meets_the_slo_at_the_production_limit(twin_levels):
    assert LEVELS[32]["meets_slo"] and twin_levels[32].e2e_p95 <= SLO["e2e_p95_s"]


def test_the_closed_form_and_the_step_model_agree_at_the_anchor():
    facts = model_facts()
    shape = revive_perf.ModelShape(facts["parameter_count"], facts["weight_bytes"], facts["num_hidden_layers"],
                                   facts["hidden_size"], kv_bytes_per_token(facts))
    spec = revive_perf.gpu_spec("Tesla V100-PCIE-32GB", "volta")
    prompt, output, streams = LOAD["prompt_tokens_max"], LOAD["max_tokens"], 32
    closed = revive_perf.closed_loop(shape, spec, TP, "net", True, streams, prompt, output, True)
    step = perf.PerfModel(shape, spec, TP, perf.choose_transport(TP, False, False, "SYS", True, True), True, 0)
    rng = random.Random(1)
    mean_prompt = round(statistics.fmean(field_prompt_tokens(rng) for _ in range(10_000)))
    decode_s = closed.step_ms / 1000 - streams * closed.prefill_ms / 1000 / output
    assert step.step([], [mean_prompt + output // 2] * streams).seconds == pytest.approx(decode_s, rel=0.02)
    cohort_s = step.step([mean_prompt] * streams, []).seconds / streams
    assert revive_perf.TTFT_QUEUE_FACTOR * closed.prefill_ms / 1000 == pytest.approx(cohort_s, rel=0.1)
