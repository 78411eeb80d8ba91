"""The planner's rules, one test (or a few) per rule, on the lab profiles probed through the fake NVML."""
from __future__ import annotations

import copy

import pytest
from ansible.module_utils.revive_kv import GiB, kv_cache_plan
from ansible.module_utils.revive_model import model_from_config
from ansible.module_utils.revive_plan import (
    Overrides,
    PackageSource,
    PlanError,
    PlanRefusal,
    Serve,
    Workload,
    plan_release,
    synthetic_gpu_facts,
)
from ansible.module_utils.revive_releases import load_release_data, load_release_file
from fixtures.gpus import lab_facts, lab_ram_bytes
from fixtures.models import model_config

V100 = "v100-pcie-8x"


@pytest.fixture(scope="module")
def releases(repo):
    return load_release_file(str(repo / "data" / "vllm-releases.yml"))


def model(name, dtype="F16", **overrides):
    return model_from_config(dict(model_config(name, dtype=dtype), **overrides), f"/data/models/{name}")


# 0.5.4 cannot be installed from PyPI today (its lock needs pyairports): its plans are for a mirror that supplies it.
MIRROR = PackageSource("mirror", "https://pypi.internal.example/simple")
NOTES_RELEASE = Overrides(vllm_version="0.5.4")


def plan(releases, profile=V100, name="internlm2-chat-20b", dtype="F16", workload=None, overrides=None,
         facts=None, ram=None, source=None, **model_overrides):
    facts = facts if facts is not None else lab_facts(profile)
    ram = ram if ram is not None else (lab_ram_bytes(profile) if profile else None)
    overrides = overrides or Overrides()
    if source is None and overrides.vllm_version == "0.5.4":
        source = MIRROR
    return plan_release(facts, model(name, dtype, **model_overrides), releases, workload or Workload(),
                        overrides, Serve(), ram, source)


def flag(args, name):
    return args[args.index(name) + 1]


def reason(result, decision):
    return next(r for r in result["reasons"] if r["decision"] == decision)


# ------------------------------------------------------------------- the notes' 20B on their box

def test_20b_on_v100_pcie_yields_the_field_notes_essentials(releases):
    result = plan(releases, overrides=NOTES_RELEASE)
    args = result["args"]
    assert result["vllm_version"] == "0.5.4"
    assert "the field notes' measured release" in reason(result, "vllm_version")["reason"]
    assert result["pins"]["torch"] == "2.4.0" and result["pins"]["xformers"] == "0.0.27.post2"
    assert flag(args, "--dtype") == "half"
    assert "--enforce-eager" in args
    assert flag(args, "--gpu-memory-utilization") == "0.92"
    assert flag(args, "--max-model-len") == "4096"
    assert flag(args, "--max-num-batched-tokens") == "8192"
    assert flag(args, "--swap-space") == "16"
    assert {"--disable-log-requests", "--disable-frontend-multiprocessing", "--disable-custom-all-reduce"} <= set(args)
    for replica in result["replicas"]:
        assert replica["env"]["NCCL_P2P_DISABLE"] == "1" and replica["env"]["NCCL_SHM_DISABLE"] == "1"
        assert replica["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert replica["env"]["VLLM_ATTENTION_BACKEND"] == "XFORMERS"
    assert "under 0.1 % of requests exceed 4096 tokens" in reason(result, "max_model_len")["reason"]


def test_the_volta_default_is_0851_with_its_own_differences(releases):
    result = plan(releases)
    args = result["args"]
    assert result["vllm_version"] == "0.8.5.post1"
    assert result["pins"]["torch"] == "2.6.0" and result["pins"]["xformers"] == "0.0.29.post2"
    assert (result["engine"], result["attention_backend"]) == ("V0", "XFORMERS")
    assert "installs from PyPI today" in reason(result, "vllm_version")["reason"]
    assert flag(args, "--dtype") == "half" and "--enforce-eager" in args
    assert flag(args, "--swap-space") == "16"
    # /metrics has the vllm:* series in the default front-end mode from 0.5.5 on; prompts are still logged
    assert "--disable-frontend-multiprocessing" not in args and "--disable-log-requests" in args
    for replica in result["replicas"]:
        assert replica["env"]["VLLM_USE_V1"] == "0"  # no V1 attempt on CC 7.0
        assert replica["env"]["NCCL_P2P_DISABLE"] == "1" and replica["env"]["VLLM_ATTENTION_BACKEND"] == "XFORMERS"
    assert result["kv_cache"]["sizing"] == "v0-per-instance"
    assert releases.release("0.8.5.post1").validate_argv(args) == []


def test_054_from_pypi_is_refused_with_the_reason_and_the_remedy(releases):
    with pytest.raises(PlanRefusal) as err:
        plan(releases, overrides=NOTES_RELEASE, source=PackageSource())
    assert err.value.reason.startswith("vLLM 0.5.4 cannot be installed from PyPI: ")
    assert "vllm-project/vllm#23983" in err.value.reason and "pyairports-0.0.1.tar.gz" in err.value.reason
    assert "bin/revive lock 0.5.4 --supply DIR" in err.value.reason
    assert err.value.source == "data installability; docs/runtime-install.md"


def test_054_from_a_wheelhouse_plans(releases):
    result = plan(releases, overrides=NOTES_RELEASE, source=PackageSource("wheelhouse"))
    assert result["vllm_version"] == "0.5.4"
    assert "a wheelhouse, which must supply its whole lock" in reason(result, "vllm_version")["reason"]


def test_a_release_whose_compiled_dependency_lacks_the_gpus_sm_is_refused(repo):
    import yaml
    with open(repo / "data" / "vllm-releases.yml") as handle:
        raw = yaml.safe_load(handle)
    raw["releases"]["0.8.5.post1"]["kernels"] = [
        {"distribution": "xformers", "version": "0.0.29.post2", "cubin_archs": [75, 80, 86, 90], "ptx_archs": []}]
    with pytest.raises(PlanRefusal, match=r"vLLM 0.8.5.post1 cannot run on Tesla V100-PCIE-32GB \(CC 7.0\): its "
                                          r"compiled dependencies xformers 0.0.29.post2 \(cubins sm_75, sm_80, sm_86, "
                                          r"sm_90\) carry no code for sm_70"):
        plan(load_release_data(raw))


def test_20b_on_v100_pcie_picks_two_socket_local_tp4_replicas_and_says_why(releases):
    result = plan(releases)
    assert result["tensor_parallel_size"] == 4
    assert [r["gpus"] for r in result["replicas"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [r["cuda_visible_devices"] for r in result["replicas"]] == ["0,1,2,3", "4,5,6,7"]
    assert [r["port"] for r in result["replicas"]] == [8000, 8001]
    assert [(r["socket"], r["numa_node"], r["cpu_list"]) for r in result["replicas"]] == [
        (0, 0, "0-19,40-59"), (1, 1, "20-39,60-79")]
    candidates = {c["tensor_parallel_size"]: c for c in result["layout"]["candidates"]}
    assert candidates[1]["feasible"] is False and "No available memory for the cache blocks" in candidates[1]["why_not"]
    tp4, tp8 = candidates[4], candidates[8]
    assert tp4["total_throughput_tok_s"] > tp8["total_throughput_tok_s"]
    assert tp4["predicted"]["e2e_p95_s"] < tp8["predicted"]["e2e_p95_s"] <= 12
    text = reason(result, "tensor_parallel_size")["reason"]
    gain = tp4["total_throughput_tok_s"] / tp8["total_throughput_tok_s"] - 1
    assert f"Versus the notes' single TP 8 replica: {gain:+.0%} throughput" in text
    assert "never across sockets" in text


def test_pinning_tp8_reproduces_the_notes_launch_command(releases):
    result = plan(releases, overrides=Overrides(tensor_parallel_size=8))
    args = result["args"]
    assert len(result["replicas"]) == 1 and result["replicas"][0]["gpus"] == list(range(8))
    assert flag(args, "--tensor-parallel-size") == "8"
    assert flag(args, "--max-num-seqs") == "128"   # notes: 128 at concurrency 32
    assert result["env"]["NCCL_P2P_DISABLE"] == "1" and result["env"]["NCCL_SHM_DISABLE"] == "1"
    assert result["replicas"][0]["numa_node"] is None and result["replicas"][0]["cpus"] == []


def test_kv_estimate_is_revive_kv_for_the_chosen_settings(releases):
    result = plan(releases, overrides=NOTES_RELEASE)
    facts = lab_facts(V100)
    expected = kv_cache_plan(model("internlm2-chat-20b"), 4, facts["devices"][0]["memory"]["total_bytes"], 0.92, 16,
                             max_num_batched_tokens=8192, max_num_seqs=64, max_model_len=4096, release="0.5.4")
    kv = result["kv_cache"]
    assert (kv["bytes_per_block"], kv["num_gpu_blocks"], kv["num_cpu_blocks"], kv["tokens"]) == (
        expected.bytes_per_block, expected.num_gpu_blocks, expected.num_cpu_blocks, expected.tokens)
    assert kv["max_concurrency_at_max_model_len"] == round(expected.tokens / 4096, 2)
    assert kv["log_line"] == f"# GPU blocks: {expected.num_gpu_blocks}, # CPU blocks: {expected.num_cpu_blocks}"


@pytest.mark.parametrize("name", ["llama-2-7b-chat", "meta-llama-3-8b-instruct", "mistral-7b-instruct-v0.2",
                                  "qwen2-7b-instruct"])
def test_7_to_10b_models_never_get_tp8(releases, name):
    result = plan(releases, name=name)
    assert result["tensor_parallel_size"] in (2, 4)
    tp8 = next(c for c in result["layout"]["candidates"] if c["tensor_parallel_size"] == 8)
    if tp8["feasible"]:
        best = max(c.get("total_throughput_tok_s", 0) for c in result["layout"]["candidates"])
        assert tp8["total_throughput_tok_s"] < 0.9 * best
    else:  # Qwen2-7B: 28 heads
        assert tp8["why_not"] == "Total number of attention heads (28) must be divisible by tensor parallel size (8)."


def test_70b_only_fits_at_tp8_and_misses_the_slo(releases):
    result = plan(releases, name="llama-2-70b-chat")
    assert result["tensor_parallel_size"] == 8
    assert any(w.startswith("no layout meets the SLO") for w in result["warnings"])


def test_70b_on_four_gpus_is_refused(releases):
    with pytest.raises(PlanRefusal) as err:
        plan(releases, profile=None, facts=synthetic_gpu_facts(4, 32), name="llama-2-70b-chat", ram=256 * GiB)
    assert "does not fit 4x synthetic volta GPU" in err.value.reason
    assert "TP 4: weights 32.1 GiB" in err.value.reason


# --------------------------------------------------------------------------------- NVLink machines

def test_dgx1_never_gets_nccl_p2p_or_shm_variables(releases):
    for overrides in (Overrides(), Overrides(tensor_parallel_size=4), Overrides(tensor_parallel_size=2)):
        result = plan(releases, profile="dgx1-v100", overrides=overrides)
        for replica in result["replicas"]:
            assert "NCCL_P2P_DISABLE" not in replica["env"] and "NCCL_SHM_DISABLE" not in replica["env"]
        assert "NVLink connects the replica's GPUs" in reason(result, "nccl")["reason"]


def test_custom_all_reduce_follows_nvlink_coverage(releases):
    tp8 = plan(releases, profile="dgx1-v100", overrides=Overrides(tensor_parallel_size=8))
    assert "--disable-custom-all-reduce" in tp8["args"]  # hybrid cube-mesh: not every pair has NVLink
    assert "not fully NVLink-connected" in reason(tp8, "disable_custom_all_reduce")["reason"]
    tp4 = plan(releases, profile="dgx1-v100", overrides=Overrides(tensor_parallel_size=4))
    assert "--disable-custom-all-reduce" not in tp4["args"]  # each quad is fully NVLinked


def test_a100_runs_graphs_and_bf16(releases):
    result = plan(releases, profile="a100-sxm4-8x", dtype="BF16")
    args = result["args"]
    assert result["vllm_version"] == "0.10.1.1" and result["engine"] == "V1"
    assert "--enforce-eager" not in args
    assert flag(args, "--dtype") == "bfloat16"
    assert flag(args, "--gpu-memory-utilization") == "0.9"
    assert "--swap-space" not in args and result["kv_cache"]["num_cpu_blocks"] == 0
    assert "--disable-log-requests" not in args and "--disable-frontend-multiprocessing" not in args
    for replica in result["replicas"]:
        assert not {"NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "VLLM_ATTENTION_BACKEND"} & set(replica["env"])
    assert result["conversion"] is None and result["warnings"][1:] == []


# ----------------------------------------------------------------------------------------- dtype

def test_bf16_weights_on_volta_need_conversion(releases):
    result = plan(releases, name="qwen2-7b-instruct", dtype="BF16")
    assert flag(result["args"], "--dtype") == "half"
    assert result["conversion"] == {"from": "BF16", "to": "F16"}
    assert any("BF16 weights on a GPU without BF16: the sync role must convert them to FP16" in w
               for w in result["warnings"])


def test_bf16_weights_on_volta_refused_without_conversion(releases):
    with pytest.raises(PlanRefusal) as err:
        plan(releases, name="qwen2-7b-instruct", dtype="BF16", overrides=Overrides(allow_bf16_conversion=False))
    assert err.value.reason == (
        "/data/models/qwen2-7b-instruct: the weights are BF16 and Tesla V100-PCIE-32GB (CC 7.0) has no BF16; "
        "conversion to FP16 is disabled. Convert the checkpoint (the model sync role does) or allow conversion.")
    assert err.value.source.startswith("docs/facts/vllm-volta.md §1.4")


def test_fp16_on_ampere_stays_float16(releases):
    assert flag(plan(releases, profile="a100-sxm4-8x", dtype="F16")["args"], "--dtype") == "float16"


# ---------------------------------------------------------------------------------- quantization

def test_awq_is_refused_on_volta(releases):
    with pytest.raises(PlanRefusal) as err:
        plan(releases, name="llama-2-7b-chat-awq")
    assert ("awq checkpoints need CC 7.5; Tesla V100-PCIE-32GB is CC 7.0 (vLLM: 'The quantization method awq is "
            "not supported for the current GPU. Minimum capability: 75. Current capability: 70.')") in err.value.reason


@pytest.mark.parametrize("qcfg, method", [
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, "marlin"),
])
def test_marlin_and_fp8_are_refused_below_ampere(releases, qcfg, method):
    with pytest.raises(PlanRefusal, match=f"{method} checkpoints need CC 8.0"):
        plan(releases, name="llama-2-7b-chat", quantization_config=qcfg)


def test_gptq_runs_on_volta_with_the_notes_warning(releases):
    result = plan(releases, name="qwen2-7b-instruct-gptq-int4")
    assert reason(result, "quantization")["value"] == "gptq"
    assert any("GPTQ on Volta: the notes measured ~30 % slower than FP16 with jittery P99" in w
               for w in result["warnings"])


def test_bitsandbytes_is_single_gpu(releases):
    result = plan(releases, name="llama-2-7b-chat",
                  quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True})
    assert result["tensor_parallel_size"] == 1
    tp2 = next(c for c in result["layout"]["candidates"] if c["tensor_parallel_size"] == 2)
    assert "BitAndBytes quantization with TP is not supported" in tp2["why_not"]


# ------------------------------------------------------------------------------- model refusals

def test_gemma2_softcapping_is_refused_on_xformers(releases):
    with pytest.raises(PlanRefusal, match="'XFormers does not support attention logits soft capping.'"):
        plan(releases, name="gemma-2-9b-it")


def test_unsupported_head_size_is_refused(releases):
    with pytest.raises(PlanRefusal, match=r"head size 72 is not supported by PagedAttention in vLLM 0.5.4"):
        plan(releases, name="llama-2-7b-chat", hidden_size=72 * 32, overrides=NOTES_RELEASE)
    with pytest.raises(PlanRefusal, match=r"head size 72 is not supported by PagedAttention in vLLM 0.8.5.post1"):
        plan(releases, name="llama-2-7b-chat", hidden_size=72 * 32)


def test_tp_that_does_not_divide_the_heads_is_refused(releases):
    with pytest.raises(PlanRefusal) as err:
        plan(releases, name="internlm2-chat-20b", overrides=Overrides(tensor_parallel_size=5))
    assert err.value.reason == ("--tensor-parallel-size 5: Total number of attention heads (48) must be divisible "
                                "by tensor parallel size (5).")


def test_max_model_len_beyond_the_model_is_refused(releases):
    with pytest.raises(PlanRefusal, match=r"User-specified max_model_len \(8192\) is greater than the derived "
                                          r"max_model_len \(4096\)"):
        plan(releases, name="llama-2-7b-chat", workload=Workload(max_model_len=8192))


def test_max_model_len_beyond_the_model_needs_the_override_which_sets_vllms_variable(releases):
    with pytest.raises(PlanRefusal, match=r"or set allow_long_max_model_len \(--allow-long-max-model-len\)"):
        plan(releases, name="llama-2-7b-chat", workload=Workload(max_model_len=8192))
    result = plan(releases, name="llama-2-7b-chat", workload=Workload(max_model_len=8192),
                  overrides=Overrides(allow_long_max_model_len=True))
    assert flag(result["args"], "--max-model-len") == "8192"
    assert all(r["env"]["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1" for r in result["replicas"])
    assert "with allow_long_max_model_len" in reason(result, "max_model_len")["reason"]
    assert any("above the model's 4096 positions" in w for w in result["warnings"])
    # within the model's length the override changes nothing
    within = plan(releases, name="llama-2-7b-chat", overrides=Overrides(allow_long_max_model_len=True))
    assert within == plan(releases, name="llama-2-7b-chat")
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" not in within["env"]


def test_batched_tokens_below_max_model_len_is_refused(releases):
    with pytest.raises(PlanRefusal) as err:
        plan(releases, overrides=Overrides(max_num_batched_tokens=2048))
    assert err.value.reason.startswith("max_num_batched_tokens (2048) is smaller than max_model_len (4096): vLLM "
                                       "refuses to start without chunked prefill.")


# -------------------------------------------------------------------------------- release choice

def test_pinning_a_release_without_sm70_kernels_is_refused(releases):
    with pytest.raises(PlanRefusal) as err:
        plan(releases, overrides=Overrides(vllm_version="0.20.0"))
    assert err.value.reason.startswith("vLLM 0.20.0 cannot run on Tesla V100-PCIE-32GB (CC 7.0): No sm_70 cubins")
    with pytest.raises(PlanRefusal, match="vLLM 0.33.0 cannot run on"):
        plan(releases, overrides=Overrides(vllm_version="0.33.0"))


def test_pinning_an_unknown_release_is_refused(releases):
    with pytest.raises(PlanRefusal, match=r"vLLM 0.6.3 is not in the release data"):
        plan(releases, overrides=Overrides(vllm_version="0.6.3"))


def test_pinning_010_on_volta_is_refused_for_its_xformers(releases):
    with pytest.raises(PlanRefusal, match=r"vLLM 0.10.1.1 cannot run on Tesla V100-PCIE-32GB \(CC 7.0\): .*pin "
                                          r"xformers==0.0.31 .* no sm_70 code"):
        plan(releases, overrides=Overrides(vllm_version="0.10.1.1"))


def test_pinning_010_on_turing_runs_v0_with_its_flags(releases):
    result = plan(releases, profile="t4-4x", name="llama-2-7b-chat", overrides=Overrides(vllm_version="0.10.1.1"))
    assert result["engine"] == "V0" and result["env"]["VLLM_USE_V1"] == "0"
    assert "--disable-frontend-multiprocessing" not in result["args"]  # fixed in 0.5.5
    assert "--disable-log-requests" not in result["args"]              # opt-in logging since 0.10.1
    assert result["kv_cache"]["sizing"] == "v0-per-instance"


def test_pascal_is_refused(releases):
    with pytest.raises(PlanRefusal, match="no release in the data serves compute capability 6.0"):
        plan(releases, profile=None, facts=synthetic_gpu_facts(4, 16, "6.0"), ram=128 * GiB)


def test_old_driver_is_refused(releases):
    facts = lab_facts(V100)
    facts["driver_branch"], facts["driver_version"] = 470, "470.223.02"
    with pytest.raises(PlanRefusal) as err:
        plan(releases, facts=facts)
    assert err.value.reason.startswith("driver 470.223.02 (R470) is older than R525, which vLLM 0.8.5.post1 "
                                       "(CUDA 12.4) needs.")


# --------------------------------------------------------------------------------- NCCL by topology

def test_nccl_stays_on_behind_one_pcie_switch(releases):
    facts = synthetic_gpu_facts(2, 32)
    facts["topology"]["matrix"] = [["X", "PIX"], ["PIX", "X"]]
    result = plan(releases, profile=None, facts=facts, name="llama-2-7b-chat", ram=128 * GiB,
                  overrides=Overrides(tensor_parallel_size=2))
    assert "NCCL_P2P_DISABLE" not in result["env"]
    assert "sits behind one PCIe switch (PIX)" in reason(result, "nccl")["reason"]
    assert "TP 2 on PCIe keeps vLLM's custom all-reduce on" in reason(result, "disable_custom_all_reduce")["reason"]


def test_single_gpu_replicas_get_no_nccl_variables(releases):
    result = plan(releases, profile=None, facts=synthetic_gpu_facts(1, 32), name="llama-2-7b-chat", ram=64 * GiB)
    assert result["env"] == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0",
                             "VLLM_ATTENTION_BACKEND": "XFORMERS", "VLLM_USE_V1": "0"}
    assert "--disable-custom-all-reduce" not in result["args"]


# ------------------------------------------------------------------------- scheduler and memory

def test_max_num_seqs_follows_concurrency(releases):
    assert flag(plan(releases, overrides=Overrides(tensor_parallel_size=8),
                     workload=Workload(concurrency=16))["args"], "--max-num-seqs") == "64"
    assert flag(plan(releases, overrides=Overrides(tensor_parallel_size=8),
                     workload=Workload(concurrency=100))["args"], "--max-num-seqs") == "256"


def test_max_num_seqs_is_capped_by_kv_capacity(releases):
    facts = synthetic_gpu_facts(1, 24)
    result = plan(releases, profile=None, facts=facts, name="llama-2-7b-chat", ram=64 * GiB,
                  workload=Workload(concurrency=64))
    kv = result["kv_cache"]
    seqs = int(flag(result["args"], "--max-num-seqs"))
    assert seqs <= kv["tokens"] // kv["typical_sequence_tokens"] and seqs % 8 == 0
    assert any("expect preemptions" in w for w in result["warnings"])


def test_swap_space_is_bounded_by_host_ram(releases):
    result = plan(releases, ram=64 * GiB)
    assert flag(result["args"], "--swap-space") == "3"  # 40 % of 64 GiB over 8 workers
    assert "pin at most 40 % of the 64 GiB host RAM" in reason(result, "swap_space")["reason"]


def test_swap_space_override_that_pins_too_much_is_refused(releases):
    with pytest.raises(PlanRefusal) as err:
        plan(releases, ram=128 * GiB, overrides=Overrides(swap_space=16))
    assert err.value.reason.startswith("--swap-space 16 pins 128 GiB (8 workers x 16 GiB) of 128 GiB host RAM")


def test_fractional_swap_space_is_refused_on_054(releases):
    with pytest.raises(PlanRefusal, match=r"--swap-space 0.5: vLLM 0.5.4 takes whole GiB \(int\)"):
        plan(releases, overrides=Overrides(vllm_version="0.5.4", swap_space=0.5))
    assert flag(plan(releases, overrides=Overrides(swap_space=0.5))["args"], "--swap-space") == "0.5"  # float from 0.5.5


def test_unknown_host_ram_keeps_vllms_default_swap(releases):
    result = plan_release(lab_facts(V100), model("internlm2-chat-20b"), releases)
    assert flag(result["args"], "--swap-space") == "4"
    assert "host RAM unknown: swap space left at vLLM's default instead of the notes' 16 GiB" in result["warnings"]


def test_metrics_off_drops_the_frontend_flag(releases):
    result = plan(releases, workload=Workload(metrics=False))
    assert "--disable-frontend-multiprocessing" not in result["args"]


def test_excluded_gpus_are_not_used(releases):
    result = plan(releases, overrides=Overrides(exclude_gpus=[7]))
    used = {g for r in result["replicas"] for g in r["gpus"]}
    assert 7 not in used and used <= set(range(7))


def test_gpu_memory_held_by_others_is_a_warning(releases):
    facts = lab_facts(V100)
    facts["devices"][3]["memory"]["used_bytes"] = 4 * GiB
    result = plan(releases, facts=facts)
    assert any(w.startswith("GPU 3: 4.0 GiB already in use by other processes") for w in result["warnings"])


def test_serve_settings_reach_the_argv(releases):
    result = plan_release(lab_facts(V100), model("internlm2-chat-20b"), releases,
                          serve=Serve(model_path="/data/models/chat-20b-fp16", served_model_name="chat-20b",
                                      host="10.0.0.5", base_port=9000), host_ram_bytes=lab_ram_bytes(V100))
    args = result["args"]
    assert (flag(args, "--model"), flag(args, "--served-model-name"), flag(args, "--host"), flag(args, "--port")) == (
        "/data/models/chat-20b-fp16", "chat-20b", "10.0.0.5", "9000")
    assert flag(result["replicas"][1]["args"], "--port") == "9001"
    assert "--trust-remote-code" in args  # InternLM2's config.json uses auto_map


# ------------------------------------------------------------------ flags checked against the data

def test_a_flag_missing_from_the_release_table_is_a_planner_error(repo):
    import yaml
    with open(repo / "data" / "vllm-releases.yml") as handle:
        raw = yaml.safe_load(handle)
    arguments = raw["releases"]["0.5.4"]["cli"]["arguments"]
    raw["releases"]["0.5.4"]["cli"]["arguments"] = [a for a in arguments if a["flags"] != ["--enforce-eager"]]
    with pytest.raises(PlanError, match=r"planner emitted an argv vLLM 0.5.4 rejects: unknown flag --enforce-eager"):
        plan(load_release_data(copy.deepcopy(raw)), overrides=NOTES_RELEASE)


def test_every_replica_argv_is_valid_for_its_release(releases):
    for profile, dtype in ((V100, "F16"), ("dgx1-v100", "F16"), ("a100-sxm4-8x", "BF16")):
        result = plan(releases, profile=profile, dtype=dtype)
        release = releases.release(result["vllm_version"])
        for replica in result["replicas"]:
            assert release.validate_argv(replica["args"]) == []
