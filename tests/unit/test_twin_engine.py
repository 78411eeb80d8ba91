"""The twin's engine core and performance model in virtual time: 0.5.4's scheduling rules, preemption,
token accounting, and the step-time model's dependencies (no wall-clock timing)."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin" / "src"))

from vllm._twin import perf, vlog  # noqa: E402
from vllm._twin.calibrate import run_level  # noqa: E402
from vllm._twin.engine import Engine, EngineConfig, EngineDeadError, SamplingParams  # noqa: E402
from vllm._twin.settings import Settings  # noqa: E402
from vllm._twin.runner import Runner  # noqa: E402


@pytest.fixture(autouse=True)
def quiet_log():
    sink = io.StringIO()
    vlog.set_stream(sink)
    yield sink
    vlog.set_stream(sys.stdout)


def config(**overrides) -> EngineConfig:
    values = dict(block_size=16, num_gpu_blocks=1000, num_cpu_blocks=100, max_num_seqs=256,
                  max_num_batched_tokens=4096, max_model_len=4096)
    values.update(overrides)
    return EngineConfig(**values)


class Recorder:
    def __init__(self):
        self.events = {}

    def sink(self, group, events):
        self.events.setdefault(group.request_id, []).extend(events)


def drive(engine: Engine, steps: int = 10_000):
    """Run steps until idle; returns the scheduled steps."""
    done = []
    now = 0.0
    for _ in range(steps):
        if not engine.has_unfinished():
            break
        step = engine.schedule(now)
        now += 0.01
        engine.finish_step(step, now)
        done.append(step)
    return done


def test_prefills_go_first_and_a_prefill_step_runs_only_prefills():
    engine = Engine(config())
    rec = Recorder()
    engine.add_request("a", 100, SamplingParams(max_tokens=5, ignore_eos=True), 0.0, rec.sink)
    first = engine.schedule(0.0)
    engine.finish_step(first, 0.01)
    engine.add_request("b", 50, SamplingParams(max_tokens=5, ignore_eos=True), 0.01, rec.sink)
    second = engine.schedule(0.01)
    assert [g.request_id for g, _ in second.prefills] == ["b"] and second.decodes == []
    engine.finish_step(second, 0.02)
    third = engine.schedule(0.02)
    assert third.prefills == [] and [g.request_id for g in third.decodes] == ["a", "b"]


def test_token_budget_and_max_num_seqs_limit_admission():
    engine = Engine(config(max_num_batched_tokens=300, max_num_seqs=2))
    rec = Recorder()
    for i in range(4):
        engine.add_request(f"r{i}", 100, SamplingParams(max_tokens=3, ignore_eos=True), 0.0, rec.sink)
    step = engine.schedule(0.0)
    assert [g.request_id for g, _ in step.prefills] == ["r0", "r1"]
    assert len(engine.waiting) == 2


def test_prompt_over_the_limit_is_ignored_with_finish_reason_length(quiet_log):
    engine = Engine(config(max_num_batched_tokens=4096, max_model_len=8192, num_gpu_blocks=2000))
    rec = Recorder()
    engine.add_request("long", 5000, SamplingParams(max_tokens=3), 0.0, rec.sink)
    drive(engine)
    assert [(e.finish_reason, e.delta_text) for e in rec.events["long"]] == [("length", "")]
    assert "Input prompt (5000 tokens) is too long and exceeds limit of 4096" in quiet_log.getvalue()


def test_decode_preempts_the_last_group_by_recompute_when_blocks_run_out(quiet_log):
    # 3 prompts of 32 tokens (2 blocks each) in 8 blocks: the third group's growth forces a preemption.
    engine = Engine(config(num_gpu_blocks=8, max_num_batched_tokens=4096))
    rec = Recorder()
    for i in range(3):
        engine.add_request(f"r{i}", 32, SamplingParams(max_tokens=40, ignore_eos=True), 0.0, rec.sink)
    steps = drive(engine)
    assert sum(s.preempted for s in steps) > 0
    assert "is preempted by PreemptionMode.RECOMPUTE mode" in quiet_log.getvalue()
    for i in range(3):
        tokens = [e for e in rec.events[f"r{i}"] if e.token_id >= 0]
        assert [e.num_output_tokens for e in tokens] == list(range(1, 41))
        assert tokens[-1].finish_reason == "length"


def test_groups_of_several_sequences_are_swapped_and_swap_space_exhaustion_kills_the_engine(quiet_log):
    engine = Engine(config(num_gpu_blocks=10, num_cpu_blocks=100))
    rec = Recorder()
    for i in range(2):
        engine.add_request(f"r{i}", 40, SamplingParams(n=2, best_of=2, max_tokens=60, ignore_eos=True), 0.0,
                           rec.sink)
    steps = drive(engine)
    assert any(s.swapped_blocks for s in steps)
    assert "PreemptionMode.SWAP" in quiet_log.getvalue()
    dead = Engine(config(num_gpu_blocks=10, num_cpu_blocks=1))
    for i in range(2):
        dead.add_request(f"r{i}", 40, SamplingParams(n=2, best_of=2, max_tokens=60, ignore_eos=True), 0.0, rec.sink)
    with pytest.raises(EngineDeadError, match="Aborted due to the lack of CPU swap space"):
        drive(dead)


def test_text_is_deterministic_for_a_seed_and_eos_ends_answers_unless_ignored():
    def answer(params, key=7):
        engine = Engine(config())
        rec = Recorder()
        engine.add_request("x", 20, params, 0.0, rec.sink, prompt_key=key)
        drive(engine)
        return rec.events["x"]

    seeded = answer(SamplingParams(max_tokens=3000, seed=42))
    assert [e.delta_text for e in seeded] == [e.delta_text for e in answer(SamplingParams(max_tokens=3000, seed=42))]
    assert seeded[-1].finish_reason == "stop" and seeded[-1].token_id == 2 and seeded[-1].delta_text == ""
    assert seeded[-1].num_output_tokens == len(seeded) < 3000
    ignored = answer(SamplingParams(max_tokens=3000, seed=42, ignore_eos=True))
    assert len(ignored) == 3000 and ignored[-1].finish_reason == "length"
    greedy = answer(SamplingParams(max_tokens=50, temperature=0.0), key=1)
    assert [e.delta_text for e in greedy] == [e.delta_text for e in answer(SamplingParams(max_tokens=50,
                                                                                      temperature=0.0), key=1)]


def test_stop_strings_and_min_tokens():
    engine = Engine(config())
    rec = Recorder()
    engine.add_request("x", 20, SamplingParams(max_tokens=400, stop=("e",), seed=3), 0.0, rec.sink)
    drive(engine)
    events = rec.events["x"]
    assert events[-1].finish_reason == "stop" and events[-1].stop_reason == "e"
    assert "e" not in "".join(e.delta_text for e in events)
    engine.add_request("y", 20, SamplingParams(max_tokens=30, min_tokens=30, stop=("e",), seed=3), 0.0, rec.sink)
    drive(engine)
    assert len(rec.events["y"]) == 30 and rec.events["y"][-1].finish_reason == "length"


def test_abort_frees_blocks():
    engine = Engine(config())
    rec = Recorder()
    engine.add_request("x", 64, SamplingParams(max_tokens=100, ignore_eos=True), 0.0, rec.sink)
    engine.finish_step(engine.schedule(0.0), 0.01)
    assert engine.free_gpu_blocks < 1000
    engine.abort("x")
    assert engine.free_gpu_blocks == 1000 and not engine.has_unfinished()


def shape_20b():
    return perf.ModelShape(19861149696, 39722299392, 48, 6144, 2 * 48 * 8 * 128 * 2)


def model(tp=8, transport=None, eager=True, graph_batch=0):
    transport = transport or perf.choose_transport(tp, False, False, "SYS", True, True)
    return perf.PerfModel(shape_20b(), perf.gpu_spec("Tesla V100-PCIE-32GB", "volta"), tp, transport, eager,
                          graph_batch)


def test_transport_follows_nccl_and_slower_paths_cost_more():
    nvlink = perf.choose_transport(8, True, True, "NV", False, False)
    p2p = perf.choose_transport(8, False, True, "PXB", False, False)
    shm_phb = perf.choose_transport(4, False, False, "PHB", False, False)
    shm_sys = perf.choose_transport(8, False, False, "SYS", False, False)
    net = perf.choose_transport(8, False, False, "SYS", True, True)
    assert [t.name for t in (nvlink, p2p, shm_phb, shm_sys, net)] == ["nvlink", "p2p", "shm", "shm", "net"]
    assert perf.choose_transport(8, True, True, "NV", True, False).name == "shm"  # NCCL_P2P_DISABLE on NVLink
    costs = [model(transport=t).step([200] * 8, []).seconds for t in (nvlink, p2p, shm_phb, shm_sys, net)]
    assert costs == sorted(costs) and costs[-1] > 3 * costs[0]


def test_step_time_grows_with_the_batch_and_context_and_eager_costs_launches():
    m = model()
    decode = [m.step([], [300] * b).seconds for b in (1, 16, 32, 64)]
    assert decode == sorted(decode)
    assert m.step([], [3000] * 32).seconds > m.step([], [300] * 32).seconds
    assert m.step([150] * 32, []).seconds > 10 * m.step([], [300] * 32).seconds
    graphs = model(eager=False, graph_batch=128)
    assert graphs.step([], [300] * 16).seconds < m.step([], [300] * 16).seconds
    single = perf.PerfModel(shape_20b(), perf.gpu_spec("Tesla V100-PCIE-32GB", "volta"), 1,
                            perf.choose_transport(1, False, False, "X", False, False), True, 0)
    assert single.step([], [300] * 16).seconds > m.step([], [300] * 16).seconds  # 8x the weights per GPU


def test_graph_memory_reproduces_the_7553_measurement_and_the_field_notes_oom():
    yi_34b = perf.graph_memory_bytes(256, 60, 7168)
    assert abs(yi_34b / perf.MiB - 2464) / 2464 < 0.15
    assert perf.graph_batch_sizes(128)[-1] == 128 and len(perf.graph_batch_sizes(128)) == 19
    assert perf.graph_batch_sizes(3) == [1, 2, 4]


def test_a_short_closed_loop_in_virtual_time_behaves_like_vllm():
    """Sanity of the whole loop (not a timing target: bench/twin_calibration.py has those)."""
    cfg = config(num_gpu_blocks=60000, max_num_seqs=128, max_num_batched_tokens=8192)
    low = run_level(cfg, model(), 4, duration=60, warmup=10)
    high = run_level(cfg, model(), 32, duration=60, warmup=10)
    assert high.throughput > low.throughput
    assert high.ttft_p50 > low.ttft_p50
    assert low.requests > 0 and 150 < low.mean_output_tokens <= 200


def test_runner_slowdowns_cold_start_drift_and_decode_factor():
    class FakePerf:
        pass

    def runner(**knobs):
        settings = Settings(**knobs)
        r = Runner(Engine(config()), FakePerf(), settings, 0, None, False, None)
        r.ready_time = 0.0
        return r

    r = runner()
    assert r._factor(False, 0.0) == pytest.approx(4.0)
    r.finished_requests = 10
    assert r._factor(False, 0.0) == pytest.approx(2.5)
    r.finished_requests = 20
    assert r._factor(True, 0.0) == 1.0
    never = runner(warmup_requests=1_000_000)
    never.finished_requests = 500
    assert never._factor(False, 0.0) > 3.9
    drift = runner(latency_drift_per_minute=0.5, cold_start_requests=0, time_scale=0.01)
    assert drift._factor(False, 1.2) == pytest.approx(2.0)  # 1.2 s at scale 0.01 = 2 simulated minutes
    slow = runner(decode_slowdown=3.0, cold_start_requests=0)
    assert (slow._factor(True, 0.0), slow._factor(False, 0.0)) == (3.0, 1.0)
