"""Property tests: for generated models and GPU sets, every plan is internally valid, or a refusal with a reason."""
from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ansible.module_utils.revive_kv import GiB, kv_cache_plan
from ansible.module_utils.revive_model import model_from_config
from ansible.module_utils.revive_plan import Overrides, PlanRefusal, Workload, plan_release, synthetic_gpu_facts
from ansible.module_utils.revive_releases import load_release_file
from fixtures.gpus import REPO, lab_facts

RELEASES = load_release_file(str(REPO / "data" / "vllm-releases.yml"))
PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def model_configs(draw):
    heads = draw(st.sampled_from([8, 12, 16, 24, 28, 32, 40, 48, 64]))
    kv_heads = draw(st.sampled_from([d for d in (1, 2, 4, 8, heads) if heads % d == 0]))
    head_dim = draw(st.sampled_from([64, 80, 96, 128, 128, 256, 72]))
    model_type = draw(st.sampled_from(["llama", "qwen2", "internlm2", "mistral", "gpt_neox"]))
    hidden = heads * head_dim
    config = {
        "architectures": ["GeneratedForCausalLM"], "model_type": model_type, "hidden_size": hidden,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads if model_type != "gpt_neox" else heads,
        "num_hidden_layers": draw(st.integers(2, 96)),
        "intermediate_size": hidden * draw(st.sampled_from([2, 3, 4])) // 8 * 8,
        "vocab_size": draw(st.sampled_from([32000, 50432, 92544, 128256, 152064, 256000])),
        "max_position_embeddings": draw(st.sampled_from([2048, 4096, 8192, 32768])),
        "tie_word_embeddings": draw(st.booleans()),
        "torch_dtype": draw(st.sampled_from(["float16", "bfloat16", "float32"])),
    }
    quant = draw(st.sampled_from([None, None, None, "gptq", "awq"]))
    if quant:
        config["quantization_config"] = {"quant_method": quant, "bits": 4, "group_size": 128}
        config["torch_dtype"] = "float16"
    return config


@st.composite
def gpu_sets(draw):
    if draw(st.booleans()):
        name = draw(st.sampled_from(["v100-pcie-8x", "dgx1-v100", "a100-sxm4-8x"]))
        return lab_facts(name)
    return synthetic_gpu_facts(draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([16, 24, 32, 40, 48, 80])),
                               draw(st.sampled_from(["7.0", "7.0", "7.5", "8.0", "8.6", "9.0"])))


def check_plan(result, facts, model, ram):
    release = RELEASES.release(result["vllm_version"])
    tp = result["tensor_parallel_size"]
    settings_ = result["settings"]
    heads, kv_heads = model["num_attention_heads"], model["num_key_value_heads"]
    assert heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)
    assert settings_["max_num_batched_tokens"] >= settings_["max_model_len"]
    assert settings_["max_num_batched_tokens"] >= settings_["max_num_seqs"]
    kv = kv_cache_plan(model, tp, result["gpu"]["total_bytes"], settings_["gpu_memory_utilization"],
                       settings_["swap_space"] or 0, max_num_batched_tokens=settings_["max_num_batched_tokens"],
                       max_num_seqs=settings_["max_num_seqs"], max_model_len=settings_["max_model_len"],
                       dtype=settings_["dtype"], release=result["vllm_version"], sizing=result["kv_cache"]["sizing"])
    assert kv.errors == [] and kv.tokens >= settings_["max_model_len"]
    assert kv.weights_per_gpu + kv.peak_activation + kv.non_torch + kv.kv_bytes == kv.budget_bytes
    assert kv.num_gpu_blocks * kv.bytes_per_block <= kv.kv_bytes
    assert result["kv_cache"]["num_gpu_blocks"] == kv.num_gpu_blocks
    used = []
    ports = set()
    for replica in result["replicas"]:
        assert release.validate_argv(replica["args"]) == []
        assert replica["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, replica["gpus"]))
        assert replica["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert len(replica["gpus"]) == tp
        used += replica["gpus"]
        ports.add(replica["port"])
        matrix = facts["topology"]["matrix"]
        paths = [matrix[a][b] for a in replica["gpus"] for b in replica["gpus"] if a < b]
        nvlink = any(p.startswith("NV") for p in paths)
        host = any(p in ("PHB", "NODE", "SYS") for p in paths)
        assert ("NCCL_P2P_DISABLE" in replica["env"]) == (tp > 1 and not nvlink and host)
        assert ("NCCL_SHM_DISABLE" in replica["env"]) == ("NCCL_P2P_DISABLE" in replica["env"])
    assert len(used) == len(set(used)) and set(used) <= {d["index"] for d in facts["devices"]}
    assert len(ports) == len(result["replicas"])
    if result["gpu"]["compute_capability"] < "8.0":
        assert "--enforce-eager" in result["args"] and settings_["dtype"] == "half"
    if ram and settings_["swap_space"]:
        assert settings_["swap_space"] * GiB * tp * len(result["replicas"]) <= 0.4 * ram
    for reason in result["reasons"]:
        assert reason["decision"] and reason["reason"] and reason["source"]


@PROPERTY_SETTINGS
@given(config=model_configs(), facts=gpu_sets(), concurrency=st.integers(1, 128),
       max_model_len=st.sampled_from([None, 1024, 2048, 4096, 8192]),
       ram_gib=st.sampled_from([None, 32, 128, 384, 1024]))
def test_every_plan_is_valid_or_a_refusal_with_a_reason(config, facts, concurrency, max_model_len, ram_gib):
    model = model_from_config(config, "/data/models/generated")
    ram = ram_gib * GiB if ram_gib else None
    try:
        result = plan_release(facts, model, RELEASES, Workload(concurrency=concurrency, max_model_len=max_model_len),
                              Overrides(), host_ram_bytes=ram)
    except PlanRefusal as refusal:
        assert refusal.reason and refusal.source
        event(f"refused: {refusal.source}")
        return
    event(f"planned TP {result['tensor_parallel_size']}")
    check_plan(result, facts, model, ram)


@PROPERTY_SETTINGS
@given(config=model_configs(), tp=st.sampled_from([1, 2, 3, 4, 8]), utilization=st.floats(0.5, 0.98),
       seqs=st.sampled_from([None, 8, 64, 300]), batched=st.sampled_from([None, 1024, 8192, 20000]))
def test_operator_overrides_give_a_valid_plan_or_a_refusal(config, tp, utilization, seqs, batched):
    facts = lab_facts("v100-pcie-8x")
    model = model_from_config(config, "/data/models/generated")
    overrides = Overrides(tensor_parallel_size=tp, gpu_memory_utilization=round(utilization, 2),
                          max_num_seqs=seqs, max_num_batched_tokens=batched)
    try:
        result = plan_release(facts, model, RELEASES, Workload(), overrides, host_ram_bytes=384 * GiB)
    except PlanRefusal as refusal:
        assert refusal.reason and refusal.source
        event(f"refused: {refusal.source}")
        return
    event("planned")
    assert result["tensor_parallel_size"] == tp
    if seqs is not None:
        assert result["settings"]["max_num_seqs"] == seqs
    check_plan(result, facts, model, 384 * GiB)
