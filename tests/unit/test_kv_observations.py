"""revive_kv against vLLM's own start-up lines (tests/data/kv_observations.yml, sources inside)."""
from __future__ import annotations

import statistics

import pytest
import yaml
from ansible.module_utils.revive_kv import GiB, kv_cache_plan
from ansible.module_utils.revive_model import model_from_config
from fixtures.models import model_config


def load_observations(repo):
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
        dtype=observation["dtype"],
        release=observation["vllm_version"],
        weights_bytes_per_gpu=int(observation["weights_gib_logged"] * GiB),
    )


def relative_error(observation):
    observed = observation["observed"]["gpu_blocks"]
    return (estimate(observation).num_gpu_blocks - observed) / observed


def test_at_least_ten_sourced_observations(repo):
    observations = load_observations(repo)
    assert len(observations) >= 10
    for observation in observations:
        assert observation["source"] and "blocks:" in observation["log"], observation["id"]
        assert str(observation["observed"]["gpu_blocks"]) in observation["log"]
        assert str(observation["observed"]["cpu_blocks"]) in observation["log"]


@pytest.mark.parametrize("index", range(13))
def test_cpu_blocks_exactly(repo, index):
    observation = load_observations(repo)[index]
    assert estimate(observation).num_cpu_blocks == observation["observed"]["cpu_blocks"]


@pytest.mark.parametrize("index", range(13))
def test_gpu_blocks_each_within_two_percent(repo, index):
    observation = load_observations(repo)[index]
    assert abs(relative_error(observation)) < 0.02, observation["id"]


def test_gpu_blocks_median_error_per_release_family_under_five_percent(repo):
    by_family = {}
    for observation in load_observations(repo):
        by_family.setdefault(estimate(observation).sizing, []).append(abs(relative_error(observation)))
    assert set(by_family) == {"v0-mem-get-info", "v0-torch-peak-global", "v0-per-instance"}
    for family, errors in by_family.items():
        assert statistics.median(errors) < 0.05, family
    assert statistics.median(e for errors in by_family.values() for e in errors) < 0.01


def test_the_054_log_line_is_reproduced_for_the_tp8_observation(repo):
    observation = next(o for o in load_observations(repo) if o["id"] == "issue-7593-gemma2-9b-tp8-l4")
    line = estimate(observation).log_line()
    assert line.startswith("# GPU blocks: 23") and line.endswith(", # CPU blocks: 6241")
