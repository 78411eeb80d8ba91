"""Plans across nodes (module_utils/revive_plan/pipeline.py, issue 16): TP inside a node, PP across nodes, the fewest
nodes that hold the model and the workload's KV; vLLM's own refusals before anything is installed; a group whose one
node suffices plans as a single node; the cost model's pipeline form agrees with the single-node one at one stage."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from ansible.module_utils.revive_kv import kv_cache_plan
from ansible.module_utils.revive_model import model_from_config
from ansible.module_utils.revive_perf import ModelShape, closed_loop, gpu_spec, pipeline_loop
from ansible.module_utils.revive_plan import (NodeGroup, Overrides, PackageSource, PlanInputError, PlanRefusal,
                                              Serve, Workload, plan_release, synthetic_gpu_facts)
from ansible.module_utils.revive_plan.pipeline import largest_stage_weight_bytes, stage_layers
from ansible.module_utils.revive_releases import load_release_file
from fixtures.gpus import lab_facts, lab_ram_bytes
from fixtures.models import model_config

V100 = "v100-pcie-8x"
MIRROR = PackageSource("mirror", "https://pypi.internal.example/simple")
PINNED = Overrides(vllm_version="0.5.4")


@pytest.fixture(scope="module")
def releases(repo):
    return load_release_file(str(repo / "data" / "vllm-releases.yml"))


def model(name, dtype="F16", **overrides):
    return model_from_config(dict(model_config(name, dtype=dtype), **overrides), f"/data/models/{name}")


def plan(releases, name="mixtral-8x22b-instruct", nodes=2, overrides=PINNED, facts=None, workload=None,
         link_gbit=25.0, **model_overrides):
    facts = facts if facts is not None else lab_facts(V100)
    return plan_release(facts, model(name, **model_overrides), releases, workload or Workload(), overrides, Serve(),
                        lab_ram_bytes(V100), MIRROR, NodeGroup(nodes=nodes, link_gbit=link_gbit))


def flag(args, name):
    return args[args.index(name) + 1]


def reason(result, decision):
    return next(r for r in result["reasons"] if r["decision"] == decision)


def test_mixtral_8x22b_on_two_v100_nodes_plans_tp8_by_pp2_with_its_reasons_and_kv(releases):
    result = plan(releases)
    assert result["tensor_parallel_size"] == 8 and result["pipeline_parallel_size"] == 2 and result["nodes"] == 2
    args = result["args"]
    assert flag(args, "--tensor-parallel-size") == "8" and flag(args, "--pipeline-parallel-size") == "2"
    assert flag(args, "--distributed-executor-backend") == "ray" and flag(args, "--dtype") == "half"
    assert len(result["replicas"]) == 1 and result["replicas"][0]["gpus"] == list(range(8))
    # every stage count compared; one node cannot hold 282 GB
    candidates = result["layout"]["candidates"]
    assert [c["pipeline_parallel_size"] for c in candidates] == [1, 2]
    assert not candidates[0]["feasible"] and "No available memory for the cache blocks" in candidates[0]["why_not"]
    assert candidates[1]["feasible"] and candidates[1]["stage_layers"] == [28, 28]
    why = reason(result, "pipeline_parallel_size")["reason"]
    assert "TP 8 inside each node" in why and "PP 2 (layers [28, 28])" in why and "KV tokens per virtual engine" in why
    assert reason(result, "distributed_executor_backend")["value"] == "ray"
    # the KV estimate of the largest stage, its blocks split between the 2 virtual engines
    kv = result["kv_cache"]
    assert kv["weights_per_gpu_bytes"] > 16 * 2 ** 30 and kv["tokens"] > 100_000
    assert any("#7194" in w for w in result["warnings"])


def test_the_kv_estimate_is_the_largest_stages_with_its_blocks_split_per_virtual_engine(releases):
    result = plan(releases, nodes=3)
    assert result["pipeline_parallel_size"] == 2  # the fewest that hold it; the third node is not used
    assert any("the group has 3 nodes and 2 hold" in w for w in result["warnings"])
    layers_3 = plan(releases, nodes=3, overrides=Overrides(vllm_version="0.5.4"))["layout"]["candidates"][2]
    assert layers_3["stage_layers"] == [18, 18, 20]
    facts = model("mixtral-8x22b-instruct")
    settings = result["settings"]
    two_stages = kv_cache_plan(facts, 8, result["gpu"]["total_bytes"], settings["gpu_memory_utilization"],
                               settings["swap_space"], max_num_batched_tokens=settings["max_num_batched_tokens"],
                               max_num_seqs=settings["max_num_seqs"], max_model_len=settings["max_model_len"],
                               release="0.5.4", pipeline_parallel_size=2,
                               weights_bytes_per_gpu=result["kv_cache"]["weights_per_gpu_bytes"], stage_layers=28)
    assert result["kv_cache"]["num_gpu_blocks"] == two_stages.num_gpu_blocks
    one_engine = kv_cache_plan(facts, 8, result["gpu"]["total_bytes"], settings["gpu_memory_utilization"],
                               settings["swap_space"], max_num_batched_tokens=settings["max_num_batched_tokens"],
                               max_num_seqs=settings["max_num_seqs"], max_model_len=settings["max_model_len"],
                               release="0.5.4", pipeline_parallel_size=1,
                               weights_bytes_per_gpu=result["kv_cache"]["weights_per_gpu_bytes"], stage_layers=28)
    assert abs(two_stages.num_gpu_blocks * 2 - one_engine.num_gpu_blocks) <= 1
    # vLLM logs the worker's whole cache, before the virtual engines divide it (v0.5.4 core/scheduler.py:287-293)
    assert result["kv_cache"]["log_line"] == (f"# GPU blocks: {one_engine.num_gpu_blocks}, "
                                              f"# CPU blocks: {one_engine.num_cpu_blocks}")
    assert two_stages.log_line() == one_engine.log_line()


def test_a_single_node_is_refused_and_says_so(releases):
    with pytest.raises(PlanRefusal, match="does not fit 8x Tesla V100-PCIE-32GB"):
        plan(releases, nodes=1)


def test_a_release_without_pipeline_data_is_refused_before_anything_is_installed(releases):
    with pytest.raises(PlanRefusal) as refused:
        plan(releases, overrides=Overrides())
    assert "needs 2 nodes" in refused.value.reason and "Pin --vllm-version 0.5.4" in refused.value.reason


def test_an_architecture_054_cannot_pipeline_is_refused_with_vllms_message(releases):
    # InternLM2 (0.5.4 lists InternLMForCausalLM, not InternLM2ForCausalLM) on nodes too small for its 40 GB
    small = synthetic_gpu_facts(4, 8.0, "7.0")
    with pytest.raises(PlanRefusal) as refused:
        plan(releases, name="internlm2-chat-20b", facts=small)
    message = refused.value.reason
    assert ("NotImplementedError: Pipeline parallelism is only supported for the following  architectures: "
            "['AquilaModel', 'AquilaForCausalLM', 'DeepseekV2ForCausalLM'") in message
    assert "config.json names InternLM2ForCausalLM" in message and "v0.5.4:vllm/config.py" in message


def test_a_group_whose_one_node_holds_the_model_plans_exactly_as_one_node(releases):
    alone = plan(releases, name="internlm2-chat-20b", nodes=1)
    group = plan(releases, name="internlm2-chat-20b", nodes=2)
    assert group["pipeline_parallel_size"] == 1 and "--pipeline-parallel-size" not in group["args"]
    note = [w for w in group["warnings"] if w not in alone["warnings"]]
    assert len(note) == 1 and "the group has 2 nodes and 1 hold" in note[0]
    assert {k: v for k, v in group.items() if k != "warnings"} == {k: v for k, v in alone.items() if k != "warnings"}


def test_a_slower_link_costs_time_between_the_stages(releases):
    fast = plan(releases, link_gbit=100.0)["layout"]["candidates"][1]["predicted"]
    slow = plan(releases, link_gbit=1.0)["layout"]["candidates"][1]["predicted"]
    assert slow["stage_hop_ms"] > fast["stage_hop_ms"] * 10
    assert slow["e2e_p95_s"] > fast["e2e_p95_s"]


@pytest.mark.parametrize("group,field", [({"nodes": 0}, "group.nodes"), ({"nodes": 65}, "group.nodes"),
                                         ({"nodes": True}, "group.nodes"), ({"nodes": "2"}, "group.nodes"),
                                         ({"link_gbit": 0}, "group.link_gbit"),
                                         ({"link_gbit": float("nan")}, "group.link_gbit")])
def test_group_inputs_out_of_range_are_refused_naming_them(group, field):
    with pytest.raises(PlanInputError) as refused:
        NodeGroup(**group)
    assert refused.value.field == field


def test_the_stage_split_is_054s_and_a_stage_needs_a_layer():
    assert stage_layers(56, 2) == [28, 28] and stage_layers(56, 3) == [18, 18, 20] and stage_layers(80, 1) == [80]
    with pytest.raises(PlanRefusal, match="every stage needs a layer"):
        stage_layers(2, 3)


def test_the_largest_stage_holds_its_layers_and_the_embedding_or_the_head():
    facts = model("llama-2-70b-chat")
    total = int(facts["parameter_count"]) * 2
    assert largest_stage_weight_bytes(facts, [80], "half") == total
    two = largest_stage_weight_bytes(facts, [40, 40], "half")
    vocab_matrix = facts["vocab_size"] * facts["hidden_size"] * 2
    assert two == pytest.approx((total - 2 * vocab_matrix) / 2 + vocab_matrix, rel=1e-6)


def test_the_pipeline_form_at_one_stage_is_the_single_node_closed_form():
    shape = ModelShape(20_000_000_000, 40_000_000_000, 48, 6144, 48 * 2 * 8 * 128 * 2)
    spec = gpu_spec("Tesla V100-PCIE-32GB", "volta")
    one = closed_loop(shape, spec, 8, "net", True, 32, 256, 200, True)
    piped = pipeline_loop(shape, spec, 8, "net", True, 32, 256, 200, True, 1, 25e9 / 8)
    assert piped == one and piped.pipeline_stages == 1 and piped.stage_hop_ms == 0.0


def test_the_cli_plans_a_group_and_refuses_a_bad_node_count(repo, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(model_config("mixtral-8x22b-instruct", dtype="F16")))
    base = [sys.executable, str(repo / "bin" / "revive"), "plan", "--model", str(tmp_path / "config.json"),
            "--gpus", "8x32@7.0", "--vllm-version", "0.5.4", "--source", "mirror",
            "--index-url", "https://pypi.internal.example/simple"]
    proc = subprocess.run(base + ["--nodes", "2", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["pipeline_parallel_size"] == 2 and "--pipeline-parallel-size" in result["args"]
    human = subprocess.run(base + ["--nodes", "2"], capture_output=True, text=True, timeout=120)
    assert "x TP 8 x PP 2 across 2 nodes" in human.stdout
    bad = subprocess.run(base + ["--nodes", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--nodes is 0: it must be a whole number at least 1 and at most 64" in bad.stderr
    link = subprocess.run(base + ["--nodes", "2", "--node-link-gbit", "-1"], capture_output=True, text=True,
                          timeout=120)
    assert link.returncode == 2 and "--node-link-gbit is -1" in link.stderr
