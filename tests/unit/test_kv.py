"""revive_kv: vLLM 0.5.4's KV sizing terms, defaults and start-up errors."""
from __future__ import annotations

import pytest
from ansible.module_utils.revive_kv import (
    GiB,
    KvEstimate,
    cache_block_size_bytes,
    chunked_prefill_enabled,
    default_max_num_batched_tokens,
    forward_activation_bytes,
    kv_cache_plan,
    sampler_activation_bytes,
    sizing_for_release,
    swap_space_check,
)
from ansible.module_utils.revive_model import model_from_config
from fixtures.models import model_config

KiB = 1024
MiB = 1024 * KiB


def model(name, **overrides):
    return model_from_config(dict(model_config(name), **overrides))


CODELLAMA_13B = dict(model_config("llama-2-7b-chat"), hidden_size=5120, intermediate_size=13824,
                     num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40)
QWEN25_15B = dict(model_config("qwen2-7b-instruct"), hidden_size=1536, intermediate_size=8960,
                  num_attention_heads=12, num_key_value_heads=2, vocab_size=151936)


# docs/facts/vllm-volta.md §3.3, the worked values: bytes per block and CPU blocks at --swap-space 4
@pytest.mark.parametrize("config, tp, swap, block_bytes, cpu_blocks", [
    (model_config("llama-2-7b-chat"), 1, 4, 8 * MiB, 512),
    (model_config("meta-llama-3-8b-instruct"), 1, 4, 2 * MiB, 2048),
    (model_config("mistral-7b-instruct-v0.2"), 1, 4, 2 * MiB, 2048),
    (model_config("qwen2-7b-instruct"), 1, 4, 896 * KiB, 4681),
    (QWEN25_15B, 1, 4, 448 * KiB, 9362),
    (CODELLAMA_13B, 2, 4, int(6.25 * MiB), 655),
    (CODELLAMA_13B, 2, 8, int(6.25 * MiB), 1310),
    (model_config("gemma-2-9b-it"), 8, 4, 672 * KiB, 6241),
])
def test_block_size_and_cpu_blocks_from_the_reference_table(config, tp, swap, block_bytes, cpu_blocks):
    facts = model_from_config(config)
    assert cache_block_size_bytes(facts, tp) == block_bytes
    estimate = kv_cache_plan(facts, tp, 32 * GiB, 0.9, swap, max_model_len=2048)
    assert estimate.bytes_per_block == block_bytes
    assert estimate.num_cpu_blocks == cpu_blocks


def test_kv_heads_are_replicated_beyond_tp():
    # Llama-3-8B has 8 KV heads: TP 16 keeps one head per GPU (max(1, 8 // 16))
    facts = model("meta-llama-3-8b-instruct")
    assert cache_block_size_bytes(facts, 16) == cache_block_size_bytes(facts, 8) == 256 * KiB


def test_fp8_cache_halves_the_block():
    facts = model("meta-llama-3-8b-instruct")
    assert cache_block_size_bytes(facts, 1, 16, "fp8") == MiB


def test_pipeline_parallel_divides_the_counts():
    facts = model("llama-2-70b-chat")
    whole = kv_cache_plan(facts, 4, 80 * GiB, 0.9, 4, max_model_len=4096, release="0.5.4")
    staged = kv_cache_plan(facts, 4, 80 * GiB, 0.9, 4, max_model_len=4096, release="0.5.4",
                           pipeline_parallel_size=2)
    assert staged.bytes_per_block == whole.bytes_per_block // 2


def test_20b_on_v100_at_tp8_fits_the_field_notes_budget():
    facts = model("internlm2-chat-20b", torch_dtype="float16")
    estimate = kv_cache_plan(facts, 8, 32 * GiB, 0.92, 16, max_num_batched_tokens=8192, max_num_seqs=128,
                             max_model_len=4096)
    assert estimate.weights_per_gpu == -(-facts["parameter_count"] * 2 // 8)
    assert 4.5 * GiB < estimate.weights_per_gpu < 5 * GiB          # notes: "~5 GB per card at TP=8"
    assert estimate.bytes_per_block == 16 * 1 * 128 * 48 * 2 * 2     # one KV head per GPU
    assert estimate.num_cpu_blocks == 16 * GiB // estimate.bytes_per_block
    assert estimate.errors == []
    assert estimate.max_concurrency_at_max_model_len > 32            # notes: concurrency 32 without OOM


def test_longer_max_model_len_leaves_fewer_blocks():
    # #8185 (V100S, torch 2.4): the profile run grows with max-model-len, so the block count shrinks
    facts = model("meta-llama-3-8b-instruct")
    short = kv_cache_plan(facts, 1, 32 * GiB, 0.9, 4, max_model_len=4096)
    long = kv_cache_plan(facts, 1, 32 * GiB, 0.9, 4, max_model_len=16384)
    assert long.num_gpu_blocks < short.num_gpu_blocks
    assert long.profile_tokens == 16384 and short.profile_tokens == 4096


def test_no_memory_for_blocks_is_vllms_error():
    facts = model("llama-2-70b-chat")
    estimate = kv_cache_plan(facts, 2, 32 * GiB, 0.9, 4, max_model_len=4096)
    assert estimate.num_gpu_blocks == 0
    assert estimate.errors == ["No available memory for the cache blocks. Try increasing "
                               "`gpu_memory_utilization` when initializing the engine."]


def test_max_model_len_above_the_cache_is_vllms_error():
    facts = model("meta-llama-3-8b-instruct")
    estimate = kv_cache_plan(facts, 1, 19 * GiB, 0.9, 4, max_model_len=8192)
    assert 0 < estimate.tokens < 8192
    assert estimate.errors == [
        f"The model's max seq len (8192) is larger than the maximum number of tokens that can be stored in KV "
        f"cache ({estimate.tokens}). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine."]


def test_default_batched_tokens_and_chunked_prefill():
    assert default_max_num_batched_tokens(512, "v0-mem-get-info", False) == 2048
    assert default_max_num_batched_tokens(4096, "v0-mem-get-info", False) == 4096
    assert chunked_prefill_enabled(32768, "v0-mem-get-info") is False
    assert chunked_prefill_enabled(32769, "v0-mem-get-info") is True
    assert default_max_num_batched_tokens(40000, "v0-mem-get-info", True) == 512
    assert default_max_num_batched_tokens(4096, "v1", True, 32 * GiB) == 2048
    assert default_max_num_batched_tokens(4096, "v1", True, 80 * GiB) == 8192


def test_chunked_prefill_drops_the_sampler_term():
    facts = model("meta-llama-3-8b-instruct")
    chunked = kv_cache_plan(facts, 1, 32 * GiB, 0.9, 4, max_model_len=40000)
    assert chunked.chunked_prefill and chunked.sampler_activation == 0 and chunked.profile_tokens == 512


def test_activation_terms():
    facts = model("meta-llama-3-8b-instruct")
    assert forward_activation_bytes(facts, 1000, 1) == 1000 * 2 * (3 * 4096 + 3 * 14336)
    assert forward_activation_bytes(facts, 1000, 4) == 1000 * 2 * (3 * 4096 + 3 * 14336 // 4)
    assert sampler_activation_bytes(facts, 256) == 256 * 128256 * 36
    neox = model("gpt-neoxt-chat-base-20b")
    assert forward_activation_bytes(neox, 10, 1) == 10 * 2 * (3 * 6144 + 2 * 24576)


@pytest.mark.parametrize("name, hidden, intermediate, vocab", [
    ("qwen2-7b-instruct", 3584, 18944, 152064), ("internlm2-chat-20b", 6144, 16384, 92544),
    ("gemma-2-9b-it", 3584, 14336, 256000),
])
def test_allocated_peak_families_count_the_kept_gate_up_and_the_model_dtype_logits(name, hidden, intermediate,
                                                                                   vocab):
    # Qwen2/InternLM2/Gemma-2 MLPs keep gate_up alive at down_proj, so the layer input held by the model's
    # loop is a fourth H-wide tensor; 0.5.4's calibrated model keeps three (docs/facts/vllm-volta.md §3.7).
    facts = model(name)
    assert forward_activation_bytes(facts, 1000, 2, sizing="v0-per-instance") == \
        1000 * 2 * (4 * hidden + 3 * intermediate // 2)
    assert forward_activation_bytes(facts, 1000, 2, sizing="v0-torch-peak-global") == \
        1000 * 2 * (4 * hidden + 3 * intermediate // 2)
    assert forward_activation_bytes(facts, 1000, 2) == 1000 * 2 * (3 * hidden + 3 * intermediate // 2)
    assert sampler_activation_bytes(facts, 256, "v0-per-instance", "half") == 256 * vocab * 38
    assert sampler_activation_bytes(facts, 256, "v0-per-instance", "float32") == 256 * vocab * 40
    assert sampler_activation_bytes(facts, 256, "v0-mem-get-info", "half") == 256 * vocab * 36


def test_llama_mlp_frees_gate_up_so_three_hidden_tensors_stay_in_every_family():
    facts = model("meta-llama-3-8b-instruct")
    for sizing in ("v0-mem-get-info", "v0-torch-peak-global", "v0-per-instance"):
        assert forward_activation_bytes(facts, 1000, 1, sizing=sizing) == 1000 * 2 * (3 * 4096 + 3 * 14336)


def test_the_per_instance_plan_of_a_qwen_model_uses_both_refinements():
    facts = model("qwen2-7b-instruct")
    plan = kv_cache_plan(facts, 1, int(31.74 * GiB), 0.9, 4, max_model_len=32768, release="0.8.5.post1")
    assert plan.forward_activation == 32768 * 2 * (4 * 3584 + 3 * 18944)
    assert plan.sampler_activation == 256 * 152064 * 38
    old = kv_cache_plan(facts, 1, int(31.74 * GiB), 0.9, 4, max_model_len=32768, release="0.5.4")
    assert old.forward_activation == 32768 * 2 * (3 * 3584 + 3 * 18944)


@pytest.mark.parametrize("release, engine, sizing", [
    ("0.5.4", None, "v0-mem-get-info"), ("0.6.3.post1", None, "v0-mem-get-info"),
    ("0.6.4.post1", None, "v0-torch-peak-global"), ("0.6.5", None, "v0-per-instance"),
    ("0.10.1.1", None, "v0-per-instance"), ("0.10.1.1", "V1", "v1"), ("0.11.0", None, "v1"),
])
def test_sizing_family_by_release(release, engine, sizing):
    assert sizing_for_release(release, engine) == sizing


def test_v1_has_no_cpu_blocks():
    estimate = kv_cache_plan(model("meta-llama-3-8b-instruct"), 1, 80 * GiB, 0.9, 4, max_model_len=4096,
                             release="0.10.1.1", engine="V1")
    assert estimate.sizing == "v1" and estimate.num_cpu_blocks == 0 and estimate.swap_space_bytes == 0


def test_global_budget_subtracts_other_processes():
    facts = model("meta-llama-3-8b-instruct")
    alone = kv_cache_plan(facts, 1, 24 * GiB, 0.9, 4, max_model_len=4096, release="0.6.4")
    shared = kv_cache_plan(facts, 1, 24 * GiB, 0.9, 4, max_model_len=4096, release="0.6.4",
                           gpu_used_by_others_bytes=GiB)
    assert alone.num_gpu_blocks - shared.num_gpu_blocks == GiB // alone.bytes_per_block


def test_swap_space_check_texts():
    assert swap_space_check(16, 8, 512 * GiB) == (
        "ok", "128.00 GiB out of the 512.00 GiB total CPU memory is allocated for the swap space.")
    assert swap_space_check(16, 8, 256 * GiB)[0] == "warn"
    level, message = swap_space_check(16, 8, 128 * GiB)
    assert level == "error" and message == ("Too large swap space. 128.00 GiB out of the 128.00 GiB total CPU "
                                            "memory is allocated for the swap space.")


def test_estimate_is_plain_data():
    estimate = kv_cache_plan(model("llama-2-7b-chat"), 1, 32 * GiB, 0.92, 16, max_model_len=4096)
    assert isinstance(estimate, KvEstimate)
    data = estimate.as_dict()
    assert data["bytes_per_block"] == 8 * MiB and data["num_cpu_blocks"] == 2048
    assert estimate.log_line() == f"# GPU blocks: {estimate.num_gpu_blocks}, # CPU blocks: 2048"


def test_the_chunked_prefill_profile_batch_is_2048_tokens_from_the_per_instance_releases_on():
    assert default_max_num_batched_tokens(40000, "v0-torch-peak-global", True) == 512
    assert default_max_num_batched_tokens(40000, "v0-per-instance", True) == 2048
    facts = model("qwen2-7b-instruct")
    plan = kv_cache_plan(facts, 1, int(31.74 * GiB), 0.9, 4, max_model_len=65536, release="0.8.5.post1")
    assert plan.chunked_prefill and plan.profile_tokens == 2048
