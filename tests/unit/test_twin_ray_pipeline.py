"""The twin's pipeline parallelism without Ray (issue 16): the stage split and weights are the planner's, a step
of a virtual engine costs what the planner's pipeline_loop says, the runner keeps one scheduler per stage with 1/PP
of the blocks, a lost Ray worker kills a busy engine at once and an idle one at its next request, and a
single-node pipeline (mp) logs 0.5.4's whole-cache KV line. tests/unit/test_twin_ray.py runs the Ray path itself."""
from __future__ import annotations

import asyncio
import io
import math
import re
import sys
from pathlib import Path

import pytest
from ansible.module_utils.revive_kv import (kv_bytes_per_token, kv_cache_plan, pipeline_stage_layers,
                                           pipeline_stage_weight_bytes)
from ansible.module_utils.revive_model import inspect_model, model_from_config
from ansible.module_utils.revive_perf import ModelShape, gpu_spec, pipeline_loop, stage_hop_seconds
from ansible.module_utils.revive_plan.pipeline import largest_stage_weight_bytes
from fixtures.models import model_config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin" / "src"))
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))

import harness  # noqa: E402
from vllm._twin import perf, vlog  # noqa: E402
from vllm._twin.engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from vllm._twin.runner import Runner  # noqa: E402
from vllm._twin.settings import Settings, SettingsError, load  # noqa: E402

V100 = perf.gpu_spec("Tesla V100-PCIE-32GB", "volta")
CUDA_TOTAL_V100 = 34089730048


@pytest.fixture(autouse=True)
def quiet_log():
    sink = io.StringIO()
    vlog.set_stream(sink)
    yield sink
    vlog.set_stream(sys.stdout)


def model(name: str) -> dict:
    return model_from_config(dict(model_config(name, dtype="F16")), f"/data/models/{name}")


# --- the stages: module_utils/revive_kv.py's split, which the planner and the twin share -----------------------

@pytest.mark.parametrize("name", ["mixtral-8x22b-instruct", "llama-2-70b-chat", "meta-llama-3-8b-instruct",
                                  "qwen2-7b-instruct-gptq-int4"])
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_every_layer_lands_on_one_stage_and_the_remainder_on_the_last(name, stages):
    facts = model(name)
    total = int(facts["num_hidden_layers"])
    layers = pipeline_stage_layers(total, stages)
    assert sum(layers) == total and len(layers) == stages
    assert set(layers[:-1]) <= {total // stages} and layers[-1] == total // stages + total % stages
    weights = pipeline_stage_weight_bytes(facts, layers, 2)
    assert max(weights) == largest_stage_weight_bytes(facts, layers, "half")
    if stages == 1 and not facts.get("quantization"):
        assert weights == [int(facts["parameter_count"]) * 2]


def test_the_first_stage_holds_the_embedding_and_the_last_the_lm_head():
    facts = model("llama-2-70b-chat")  # 80 layers, untied embeddings
    assert pipeline_stage_layers(80, 3) == [26, 26, 28]
    first, middle, last = pipeline_stage_weight_bytes(facts, [26, 26, 28], 2)
    vocab_matrix = int(facts["vocab_size"]) * int(facts["hidden_size"]) * 2
    assert first - middle == pytest.approx(vocab_matrix, abs=1)
    assert last > first  # two more layers and the LM head
    assert first + middle + last == pytest.approx(int(facts["parameter_count"]) * 2, abs=3)
    with pytest.raises(ValueError, match="81 pipeline stages for 80 layers: every stage needs a layer"):
        pipeline_stage_layers(80, 81)


# --- a step through the stages costs what pipeline_loop predicts --------------------------------------------------

def mixtral_stage() -> ModelShape:
    """The planner's largest stage of Mixtral-8x22B at PP 2 (module_utils/revive_plan/pipeline.py _evaluate)."""
    facts = model("mixtral-8x22b-instruct")
    layers = pipeline_stage_layers(int(facts["num_hidden_layers"]), 2)
    return ModelShape(int(int(facts["parameter_count"]) * max(layers) / sum(layers)),
                      largest_stage_weight_bytes(facts, layers, "half"), max(layers), int(facts["hidden_size"]),
                      kv_bytes_per_token(facts) * max(layers) // int(facts["num_hidden_layers"]))


@pytest.mark.parametrize("link_gbit", [25.0, 1.0])
@pytest.mark.parametrize("streams", [2, 16, 64])
def test_a_decode_step_through_both_stages_costs_what_the_planner_predicts(link_gbit, streams):
    stage = mixtral_stage()
    link = Settings(node_link_gbit=link_gbit).node_link_bytes_per_s()
    transport = perf.choose_transport(8, False, False, "SYS", True, True)  # the field NCCL setting, across sockets
    twin = perf.PipelineModel(perf.PerfModel(stage, V100, 8, transport, True, 0), 2, link)
    prompt, output = 200, 200_000  # a long answer leaves the prompt's share of the closed form's step near nothing
    predicted = pipeline_loop(stage, gpu_spec("Tesla V100-PCIE-32GB", "volta"), 8, "net", True, streams, prompt,
                              output, True, 2, link)
    per_engine = math.ceil(streams / 2)
    token = predicted.step_ms / 1000 - per_engine * predicted.prefill_ms / 1000 / output
    step = twin.step([], [int(prompt + output / 2)] * per_engine)
    assert step.seconds == pytest.approx(token, rel=0.002)
    assert round(stage_hop_seconds(per_engine, stage.hidden_size, link) * 1000, 3) == predicted.stage_hop_ms
    # each stage's GPUs are busy for their own stage only
    alone = twin.stage.step([], [int(prompt + output / 2)] * per_engine)
    assert step.gpu_busy_seconds == alone.gpu_busy_seconds and step.seconds > 2 * alone.seconds


def test_a_slower_link_costs_exactly_the_longer_hops():
    stage = mixtral_stage()
    transport = perf.choose_transport(8, False, False, "SYS", True, True)
    fast, slow = (perf.PipelineModel(perf.PerfModel(stage, V100, 8, transport, True, 0), 3, gbit * 1e9 / 8)
                  for gbit in (100.0, 10.0))
    tokens = 512
    difference = slow.step([tokens], []).seconds - fast.step([tokens], []).seconds
    per_hop = tokens * 2 * stage.hidden_size * 2 * (8 / 10e9 - 8 / 100e9)
    assert difference == pytest.approx(2 * per_hop, rel=1e-9)


# --- virtual engines ------------------------------------------------------------------------------------------------

class FixedStep:
    def step(self, prefill_lengths, decode_contexts, swapped_blocks=0, block_bytes=0):
        return perf.StepCost(0.001 if prefill_lengths or decode_contexts else 0.0, 0.0, 0.0)


def engines(count: int, blocks: int = 500) -> list:
    return [Engine(EngineConfig(block_size=16, num_gpu_blocks=blocks, num_cpu_blocks=10, max_num_seqs=8,
                                max_num_batched_tokens=4096, max_model_len=4096)) for _ in range(count)]


def runner(virtual: list, total=(1001, 21)) -> Runner:
    return Runner(virtual, FixedStep(), Settings(cold_start_requests=0, time_scale=1.0), 0, None, False, None, total)


def add(r: Runner, request_id: str, max_tokens: int = 4, events=None) -> None:
    r.add(request_id, 10, SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0),
          lambda group, new: (events if events is not None else []).extend(new), 0)


def test_requests_go_to_the_virtual_engine_with_the_fewest_unfinished_and_usage_is_against_the_whole_cache():
    virtual = engines(2)
    r = runner(virtual)
    for request_id in ("a", "b", "c"):
        add(r, request_id)
    assert (sorted(virtual[0].groups), sorted(virtual[1].groups)) == (["a", "c"], ["b"])
    stats = r._system_stats(virtual[0].snapshot_stats(0.0))
    assert (stats.num_waiting, stats.num_running) == (3, 0)
    # 0.5.4 divides 1001 blocks into 2 x 500: the idle cache shows the block lost to the division as used
    assert stats.gpu_cache_usage == pytest.approx(1 - 1000 / 1001) and stats.cpu_cache_usage == pytest.approx(1 / 21)


def test_every_virtual_engine_steps_and_finishes_its_requests():
    virtual = engines(2)
    r = runner(virtual)
    events: list = []

    async def serve():
        task = asyncio.create_task(r.run())
        for request_id in ("a", "b", "c", "d"):
            add(r, request_id, events=events)
        while any(e.has_unfinished() for e in virtual):
            await asyncio.sleep(0.01)
        r.stop()
        await task

    asyncio.run(serve())
    assert sum(1 for e in events if e.finish_reason == "length") == 4
    assert r.finished_requests == 4 and r.steps == 2 * 4  # each engine: a prefill (token 1), then 3 decodes


def test_a_lost_worker_kills_a_busy_engine_at_once_and_an_idle_one_at_its_next_request():
    busy = runner(engines(2))
    deaths: list = []
    busy.on_dead = deaths.append
    add(busy, "a")
    assert busy.worker_lost("ray.exceptions.ActorDiedError: gone") is True
    assert busy.dead == "ray.exceptions.ActorDiedError: gone" and deaths == [busy.dead]

    idle = runner(engines(2))
    idle.on_dead = deaths.append
    assert idle.worker_lost("ray.exceptions.ActorDiedError: later") is False
    assert idle.dead is None

    async def next_request():
        task = asyncio.create_task(idle.run())
        add(idle, "b")
        await asyncio.wait_for(task, 5)

    asyncio.run(next_request())
    assert idle.dead == "ray.exceptions.ActorDiedError: later" and deaths[-1] == idle.dead


# --- the link setting ---------------------------------------------------------------------------------------------

def test_the_node_link_setting_defaults_to_the_planners_25_gbit_and_is_validated(tmp_path):
    env_file = str(tmp_path / "none.env")
    assert load({"VLLM_SIM_ENV_FILE": env_file}).node_link_gbit == 25.0
    assert load({"VLLM_SIM_ENV_FILE": env_file, "VLLM_SIM_NODE_LINK_GBIT": "100"}).node_link_bytes_per_s() == 12.5e9
    with pytest.raises(SettingsError, match="VLLM_SIM_NODE_LINK_GBIT='0': expected a link speed in Gbit/s above 0"):
        load({"VLLM_SIM_ENV_FILE": env_file, "VLLM_SIM_NODE_LINK_GBIT": "0"})


# --- a pipeline inside one node (mp): the same KV sizing ----------------------------------------------------------

def test_a_pipeline_on_one_node_logs_the_whole_cache_and_serves(tmp_path):
    directory = harness.write_model("llama-2-70b-chat", tmp_path / "llama-2-70b", dtype="F16")
    facts = inspect_model(str(directory))
    args = ["-tp", "4", "-pp", "2", "--dtype", "half", "--max-model-len", "4096", "--enforce-eager",
            "--disable-log-requests", "--disable-frontend-multiprocessing"]
    twin = harness.start(directory, args, harness.twin_env(tmp_path, time_scale=0.001), tmp_path / "twin.log")
    try:
        status, _, _ = harness.request(twin, "POST", "/v1/completions", {
            "model": twin.model, "prompt": "Hello", "max_tokens": 4, "ignore_eos": True})
        assert status == 200
        log = twin.log()
    finally:
        twin.stop()
    assert "Defaulting to use mp for distributed inference" in log and "ray_gpu_executor" not in log
    layers = pipeline_stage_layers(80, 2)
    weights = math.ceil(largest_stage_weight_bytes(facts, layers, "half") / 4)
    # the planner's estimate per virtual engine, from the largest stage
    planned = kv_cache_plan(facts, 4, CUDA_TOTAL_V100, 0.9, 4, max_num_seqs=256, max_model_len=4096,
                            pipeline_parallel_size=2, weights_bytes_per_gpu=weights, stage_layers=max(layers))
    gpu_blocks, cpu_blocks = map(int, re.search(r"# GPU blocks: (\d+), # CPU blocks: (\d+)", log).groups())
    assert (gpu_blocks // 2, cpu_blocks // 2) == (planned.num_gpu_blocks, planned.num_cpu_blocks)
    assert f"[twin] pipeline: 2 stages of layers [40, 40], 2 virtual engines of {gpu_blocks // 2} GPU" in log
    assert "over the stage's NCCL transport inside the node" in log
    # 4 ranks of each stage, the first 4 on GPUs 0-3: a TP group of 4 allows the custom all-reduce world size
    assert "unsupported world size" not in log

