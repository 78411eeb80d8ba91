"""bin/revive plan: every --gpus form, --json, overrides, refusals and exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fixtures.gpus import facts_file, lab_facts
from fixtures.models import write_model
from revive_cli import plan as cli


@pytest.fixture(scope="module")
def chat20b(tmp_path_factory):
    """The notes' 20B as a bare config.json (FP16), for what-if planning."""
    path = write_model(str(tmp_path_factory.mktemp("models") / "chat-20b-fp16"), "internlm2-chat-20b",
                       dtype="F16", config_only=True)
    return os.path.join(path, "config.json")


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def plan_json(capsys, *argv):
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def flag(args, name):
    return args[args.index(name) + 1]


def test_real_entry_point_with_a_lab_profile(repo, chat20b):
    proc = subprocess.run([sys.executable, str(repo / "bin" / "revive"), "plan", "--model", chat20b,
                           "--gpus", "v100-pcie-8x"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Release  vLLM 0.8.5.post1 (torch 2.6.0, xformers 0.0.29.post2" in out
    assert "Layout   2 replica(s) x TP 4" in out
    assert "  vllm-0  port 8000  GPUs 0,1,2,3  socket 0, CPUs 0-19,40-59" in out
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1,2,3 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1" in out
    for line in ("--dtype half", "--enforce-eager", "--gpu-memory-utilization 0.92", "--max-model-len 4096",
                 "--swap-space 16", "--disable-log-requests"):
        assert f"    {line}" in out
    assert "KV cache # GPU blocks: " in out and "1x TP8: 758 tok/s" in out
    assert "--disable-frontend-multiprocessing" not in out  # 0.8.5.post1 serves vllm:* metrics without it
    assert "  - tensor_parallel_size = 4: 2 replica(s) of TP 4 predicted best at concurrency 32" in out
    assert "[SIMULATED] from lab profile" in out


def test_json_has_the_keys_the_vllm_plan_module_documents(capsys, chat20b):
    result = plan_json(capsys, "--model", chat20b, "--gpus", "v100-pcie-8x")
    for key in ("vllm_version", "args", "env", "replicas", "kv_cache", "reasons", "warnings"):
        assert key in result
    for key in ("bytes_per_block", "num_gpu_blocks", "num_cpu_blocks", "tokens", "max_concurrency_at_max_model_len"):
        assert isinstance(result["kv_cache"][key], (int, float))
    assert result["kv_cache"]["bytes_per_block"] == 16 * 2 * 128 * 48 * 2 * 2
    assert result["args"][:8] == ["--model", os.path.dirname(chat20b), "--served-model-name", "chat-20b-fp16",
                                  "--host", "0.0.0.0", "--port", "8000"]


def test_facts_json_and_profile_give_the_same_plan(capsys, tmp_path, chat20b, repo):
    from_profile = plan_json(capsys, "--model", chat20b, "--gpus", "v100-pcie-8x")
    facts = facts_file(tmp_path, lab_facts("v100-pcie-8x"))
    from_facts = plan_json(capsys, "--model", chat20b, "--gpus", facts, "--host-ram-gib", "384")
    assert from_facts["args"] == from_profile["args"] and from_facts["env"] == from_profile["env"]
    module_shape = facts_file(tmp_path, {"changed": False, "gpu": lab_facts("v100-pcie-8x")}, "module.json")
    assert plan_json(capsys, "--model", chat20b, "--gpus", module_shape, "--host-ram-gib", "384")["args"] == \
        from_profile["args"]
    profile_file = str(repo / "lab" / "profiles" / "v100-pcie-8x.json")
    assert plan_json(capsys, "--model", chat20b, "--gpus", profile_file)["args"] == from_profile["args"]


def test_synthetic_spec(capsys, chat20b):
    result = plan_json(capsys, "--model", chat20b, "--gpus", "8x32@7.0", "--host-ram-gib", "384")
    assert result["gpu"]["count"] == 8 and result["gpu"]["compute_capability"] == "7.0"
    assert result["warnings"][0].startswith("GPU facts are simulated (SYNTHETIC: 8x 32 GiB CC 7.0; assumed "
                                            "PCIe-only, no NVLink, 2 socket(s)")
    assert result["env"]["NCCL_P2P_DISABLE"] == "1"
    assert plan_json(capsys, "--model", chat20b, "--gpus", "4x80@8.0")["vllm_version"] == "0.10.1.1"


def test_dgx1_has_no_nccl_variables(capsys, chat20b):
    result = plan_json(capsys, "--model", chat20b, "--gpus", "dgx1-v100")
    assert all("NCCL_P2P_DISABLE" not in r["env"] and "NCCL_SHM_DISABLE" not in r["env"] for r in result["replicas"])


def test_a100_bf16_without_eager(capsys, tmp_path):
    bf16 = write_model(str(tmp_path / "chat-20b"), "internlm2-chat-20b", config_only=True)
    result = plan_json(capsys, "--model", bf16, "--gpus", "a100-sxm4-8x")
    assert flag(result["args"], "--dtype") == "bfloat16" and "--enforce-eager" not in result["args"]


def test_overrides_reproduce_the_notes_command(capsys, chat20b):
    result = plan_json(capsys, "--model", chat20b, "--gpus", "v100-pcie-8x", "--tensor-parallel-size", "8",
                       "--max-num-seqs", "128", "--max-num-batched-tokens", "8192", "--max-model-len", "4096",
                       "--swap-space", "16", "--gpu-memory-utilization", "0.92", "--concurrency", "32")
    args = result["args"]
    assert [flag(args, f) for f in ("--tensor-parallel-size", "--max-num-seqs", "--max-num-batched-tokens",
                                    "--max-model-len", "--swap-space", "--gpu-memory-utilization")] == \
        ["8", "128", "8192", "4096", "16", "0.92"]
    assert result["kv_cache"]["max_concurrency_at_max_model_len"] > 32


def test_host_ram_bounds_swap(capsys, chat20b):
    assert flag(plan_json(capsys, "--model", chat20b, "--gpus", "v100-pcie-8x", "--host-ram-gib", "64")["args"],
                "--swap-space") == "3"


def test_pinned_release(capsys, chat20b):
    result = plan_json(capsys, "--model", chat20b, "--gpus", "t4-4x", "--vllm-version", "0.10.1.1")
    assert result["vllm_version"] == "0.10.1.1" and result["env"]["VLLM_USE_V1"] == "0"


def test_054_from_pypi_is_refused_and_plans_from_a_mirror(capsys, chat20b):
    assert cli.main(["--model", chat20b, "--gpus", "v100-pcie-8x", "--vllm-version", "0.5.4"]) == 1
    refusal = capsys.readouterr().err
    assert refusal.startswith("revive plan: REFUSED: vLLM 0.5.4 cannot be installed from PyPI: ")
    assert "pyairports" in refusal and "bin/revive lock 0.5.4 --supply DIR" in refusal
    result = plan_json(capsys, "--model", chat20b, "--gpus", "v100-pcie-8x", "--vllm-version", "0.5.4",
                       "--source", "mirror", "--index-url", "https://pypi.internal.example/simple")
    assert result["vllm_version"] == "0.5.4" and "--disable-frontend-multiprocessing" in result["args"]


def test_refusal_exits_1_with_the_reason(capsys, tmp_path):
    awq = write_model(str(tmp_path / "awq"), "llama-2-7b-chat-awq", config_only=True)
    code, out, err = run(capsys, "--model", awq, "--gpus", "v100-pcie-8x")
    assert code == 1 and out == ""
    assert err.startswith("revive plan: REFUSED: ") and "awq checkpoints need CC 7.5" in err
    code, out, err = run(capsys, "--model", awq, "--gpus", "v100-pcie-8x", "--json")
    assert code == 1 and json.loads(out)["refused"] is True
    assert json.loads(out)["source"].startswith("docs/facts/vllm-volta.md §7.3")


@pytest.mark.parametrize("extra, text", [
    (["--max-num-batched-tokens", "2048"], "max_num_batched_tokens (2048) is smaller than max_model_len (4096)"),
    (["--tensor-parallel-size", "5"], "--tensor-parallel-size 5: Total number of attention heads (48) must be "
                                      "divisible by tensor parallel size (5)."),
    (["--vllm-version", "0.20.0"], "vLLM 0.20.0 cannot run on Tesla V100-PCIE-32GB (CC 7.0)"),
])
def test_refused_overrides(capsys, chat20b, extra, text):
    code, _, err = run(capsys, "--model", chat20b, "--gpus", "v100-pcie-8x", *extra)
    assert code == 1 and text in err


def test_bad_gpus_spec_exits_2(capsys, chat20b):
    code, _, err = run(capsys, "--model", chat20b, "--gpus", "eight-v100s")
    assert code == 2
    assert err.startswith("revive plan: --gpus eight-v100s: not a file, not a lab profile (known: a100-sxm4-8x, ")


def test_unusable_model_exits_2(capsys, tmp_path):
    code, _, err = run(capsys, "--model", str(tmp_path / "none"), "--gpus", "8x32")
    assert code == 2 and "no such file or directory" in err
