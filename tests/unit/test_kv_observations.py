"""revive_kv against vLLM's own start-up lines (tests/data/kv_observations.yml, sources inside).

Every observation is marked ``sample: in`` (a constant or term of revive_kv was set or checked on it, its
``sample_note`` says which) or ``sample: out`` (nothing was set on it: a test of the estimator). Errors are
judged per sizing family and per sample, each group against its own tolerance (``TOLERANCES``), so a family
whose out-of-sample points drift fails on its own. ``pytest -s`` prints the table of every point
(docs/facts/vllm-volta.md §3.7 has the same numbers with their reading).

The error of a point is that of the GPU block count, or, where the source quotes only vLLM's memory-profiling
line, that of the KV-cache bytes it prints (two decimals of GiB).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import yaml
from ansible.module_utils.revive_kv import GiB, kv_cache_plan
from ansible.module_utils.revive_model import model_from_config
from fixtures.models import model_config

# (sizing family, sample) -> (worst |error|, median |error|) the estimator meets on today's data. The
# out-of-sample worst case is the Qwen3-30B-A3B MoE at TP 4 (+22 %): the estimator's expert and NCCL terms
# are rough (docs/facts/vllm-volta.md §3.7); dense single-GPU points have their own, tight bound below.
TOLERANCES: Dict[Tuple[str, str], Tuple[float, float]] = {
    ("v0-mem-get-info", "in"): (0.02, 0.01),
    ("v0-torch-peak-global", "in"): (0.01, 0.005),
    ("v0-per-instance", "in"): (0.03, 0.01),
    ("v0-per-instance", "out"): (0.25, 0.01),
}
DENSE_SINGLE_GPU_WORST = 0.03     # every judged point without experts at TP 1, in or out of sample
MAX_POINT_TOLERANCE = 0.10        # the most a point's own `tolerance` (with its reason) may allow
MIN_OUT_OF_SAMPLE_PER_INSTANCE = 4


def load_observations(repo) -> List[dict]:
    with open(repo / "tests" / "data" / "kv_observations.yml") as handle:
        return yaml.safe_load(handle)["observations"]


def estimate(observation):
    config = (model_config(observation["model_fixture"]) if "model_fixture" in observation
              else observation["model_config"])
    return kv_cache_plan(
        model_from_config(config),
        tensor_parallel_size=observation["tensor_parallel_size"],
        gpu_total_bytes=int(observation["gpu_total_gib"] * GiB),
        gpu_memory_utilization=observation["gpu_memory_utilization"],
        swap_space_gib=observation["swap_space_gib"],
        max_num_batched_tokens=observation.get("max_num_batched_tokens"),
        max_num_seqs=observation["max_num_seqs"],
        max_model_len=observation["max_model_len"],
        block_size=observation.get("block_size", 16),
        dtype=observation["dtype"],
        release=observation["vllm_version"],
        enable_chunked_prefill=observation.get("enable_chunked_prefill"),
        weights_bytes_per_gpu=int(observation["weights_gib_logged"] * GiB),
    )


def relative_error(observation) -> float:
    result, observed = estimate(observation), observation["observed"]
    if "gpu_blocks" in observed:
        return (result.num_gpu_blocks - observed["gpu_blocks"]) / observed["gpu_blocks"]
    return (result.kv_bytes / GiB - observed["kv_cache_gib"]) / observed["kv_cache_gib"]


def is_dense_single_gpu(observation) -> bool:
    config = (model_config(observation["model_fixture"]) if "model_fixture" in observation
              else observation["model_config"])
    return observation["tensor_parallel_size"] == 1 and not config.get("num_experts")


def judged(observations) -> List[dict]:
    """The points held to a tolerance: all but those whose quoted inputs are known to be incomplete."""
    return [o for o in observations if not o.get("inputs_incomplete")]


def groups(observations) -> Dict[Tuple[str, str], List[float]]:
    by_group: Dict[Tuple[str, str], List[float]] = {}
    for observation in judged(observations):
        key = (estimate(observation).sizing, observation["sample"])
        by_group.setdefault(key, []).append(abs(relative_error(observation)))
    return by_group


def report(observations) -> str:
    lines = [f"{'id':44} {'vLLM':11} {'family':20} {'sample':6} {'estimate':>9} {'observed':>9} {'error':>7}"
             f"  {'activation est/log GiB':>22}  {'non-torch est/log':>17}"]
    for observation in observations:
        result, observed = estimate(observation), observation["observed"]
        if "gpu_blocks" in observed:
            est, obs = f"{result.num_gpu_blocks}", f"{observed['gpu_blocks']}"
        else:
            est, obs = f"{result.kv_bytes / GiB:.2f}G", f"{observed['kv_cache_gib']:.2f}G"
        logged = observation.get("profile_logged", {})
        activation = f"{result.peak_activation / GiB:.2f}/{logged.get('activation_gib', '-')}"
        non_torch = f"{result.non_torch / GiB:.2f}/{logged.get('non_torch_gib', '-')}"
        flag = " (inputs incomplete, not judged)" if observation.get("inputs_incomplete") else ""
        lines.append(f"{observation['id'][:44]:44} {observation['vllm_version']:11} {result.sizing:20} "
                     f"{observation['sample']:6} {est:>9} {obs:>9} {relative_error(observation):+7.2%}"
                     f"  {activation:>22}  {non_torch:>17}{flag}")
    for (family, sample), errors in sorted(groups(observations).items()):
        lines.append(f"{family:20} {sample:3}  n={len(errors):2}  median |error| {statistics.median(errors):6.2%}"
                     f"  worst {max(errors):6.2%}")
    dense = [abs(relative_error(o)) for o in judged(observations) if is_dense_single_gpu(o) and "tolerance" not in o]
    lines.append(f"dense, one GPU, either sample  n={len(dense):2}  worst {max(dense):6.2%}")
    return "\n".join(lines)


def test_every_observation_is_sourced_and_marked_in_or_out_of_sample(repo):
    observations = load_observations(repo)
    assert len({o["id"] for o in observations}) == len(observations)
    for observation in observations:
        assert observation["source"] and observation["log"], observation["id"]
        assert observation["sample"] in ("in", "out"), observation["id"]
        observed = observation["observed"]
        if "gpu_blocks" in observed:
            assert "blocks:" in observation["log"], observation["id"]
            assert f"blocks: {observed['gpu_blocks']}," in observation["log"], observation["id"]
            assert f"CPU blocks: {observed['cpu_blocks']}" in observation["log"], observation["id"]
        else:
            assert f"KV Cache is {observed['kv_cache_gib']:.2f}GiB" in observation["log"], observation["id"]
        if observation["sample"] == "in":
            assert observation.get("sample_note"), f"{observation['id']}: say which constant it set or checked"
        else:
            assert not observation.get("sample_note"), observation["id"]


# Parametrized by id over what each test judges (read at collection: a point is never skipped at run time). The
# points left out of a test are named, with why, by test_every_point_left_out_says_why.
OBSERVATIONS = load_observations(Path(__file__).resolve().parents[2])
WITH_CPU_BLOCKS = [o["id"] for o in OBSERVATIONS if o["observed"].get("cpu_blocks") is not None]
WITH_INPUTS = [o["id"] for o in OBSERVATIONS if not o.get("inputs_incomplete")]


def observation_by_id(repo, observation_id):
    return next(o for o in load_observations(repo) if o["id"] == observation_id)


def test_every_point_left_out_says_why(repo):
    for observation in load_observations(repo):
        if observation["id"] not in WITH_CPU_BLOCKS:
            assert "cpu blocks" not in str(observation.get("log", "")).lower(), \
                f"{observation['id']}: its log quotes CPU blocks, record them under observed"
        if observation["id"] not in WITH_INPUTS:
            assert len(observation["inputs_incomplete"]) > 20, observation["id"]


@pytest.mark.parametrize("observation_id", WITH_CPU_BLOCKS)
def test_cpu_blocks_exactly(repo, observation_id):
    observation = observation_by_id(repo, observation_id)
    assert estimate(observation).num_cpu_blocks == observation["observed"]["cpu_blocks"], observation["id"]


def test_the_parametrized_tests_cover_every_observation(repo):
    assert len(load_observations(repo)) == 26


@pytest.mark.parametrize("observation_id", WITH_INPUTS)
def test_each_point_is_within_the_tolerance_of_its_family_and_sample(repo, observation_id):
    observation = observation_by_id(repo, observation_id)
    worst, _ = TOLERANCES[(estimate(observation).sizing, observation["sample"])]
    if "tolerance" in observation:
        assert observation["tolerance_reason"] and observation["tolerance"] <= MAX_POINT_TOLERANCE
        worst = observation["tolerance"]
    elif is_dense_single_gpu(observation):
        worst = min(worst, DENSE_SINGLE_GPU_WORST)
    error = relative_error(observation)
    assert abs(error) <= worst, f"{observation['id']}: {error:+.2%} (tolerance {worst:.0%})"


def test_median_and_worst_error_per_family_and_sample(repo):
    observations = load_observations(repo)
    print("\n" + report(observations))
    by_group = groups(observations)
    assert set(by_group) == set(TOLERANCES), sorted(by_group)
    own = {o["id"] for o in observations if "tolerance" in o}
    for key, errors in by_group.items():
        worst, median = TOLERANCES[key]
        assert statistics.median(errors) <= median, (key, statistics.median(errors))
        held = [abs(relative_error(o)) for o in judged(observations)
                if o["id"] not in own and (estimate(o).sizing, o["sample"]) == key]
        assert max(held) <= worst, (key, max(held))


def test_the_per_instance_family_keeps_enough_out_of_sample_points(repo):
    out = [o for o in judged(load_observations(repo))
           if o["sample"] == "out" and estimate(o).sizing == "v0-per-instance"]
    assert len(out) >= MIN_OUT_OF_SAMPLE_PER_INSTANCE, [o["id"] for o in out]


def test_points_with_incomplete_inputs_are_still_what_the_log_says(repo):
    # The reason given for not judging them must stay true: the log's activation peak is far above
    # anything the quoted inputs produce.
    for observation in load_observations(repo):
        if observation.get("inputs_incomplete"):
            logged = observation["profile_logged"]["activation_gib"] * GiB
            assert logged > 2 * estimate(observation).peak_activation, observation["id"]


def test_the_054_log_line_is_reproduced_for_the_tp8_observation(repo):
    observation = next(o for o in load_observations(repo) if o["id"] == "issue-7593-gemma2-9b-tp8-l4")
    line = estimate(observation).log_line()
    assert line.startswith("# GPU blocks: 23") and line.endswith(", # CPU blocks: 6241")
