"""Start-up of the vLLM 0.5.4 twin: each failure 0.5.4 raises at start, with its message and exit status,
the `# GPU blocks` line from module_utils/revive_kv.py, and the default mode's hang after an engine error."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible.module_utils.revive_kv import kv_cache_plan
from ansible.module_utils.revive_model import inspect_model

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))

import harness  # noqa: E402

CUDA_TOTAL_V100 = 34089730048  # what CUDA reports for a V100-32GB (the twin derives it from NVML)
IN_PROCESS = ["--disable-frontend-multiprocessing"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        "20b": harness.write_model("internlm2-chat-20b", root / "chat-20b-fp16", dtype="F16"),
        "20b-bf16": harness.write_model("internlm2-chat-20b", root / "chat-20b-bf16", dtype="BF16"),
        "7b": harness.write_model("llama-2-7b-chat", root / "llama-2-7b", dtype="F16"),
        "awq": harness.write_model("llama-2-7b-chat-awq", root / "llama-2-7b-awq", dtype=None),
    }


def run(model, args, tmp_path, extra_env=None, timeout=60):
    env = harness.twin_env(tmp_path, time_scale=0.0001, extra=extra_env)
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(harness.free_port()), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def last_line(stderr: str) -> str:
    return stderr.rstrip().splitlines()[-1]


FIELD_FLAGS = harness.FIELD_NOTES_FLAGS


@pytest.mark.parametrize("name, model, args, env, expected", [
    ("bf16 auto on bf16 weights", "20b-bf16", ["-tp", "8"], {},
     "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla "
     "V100-PCIE-32GB GPU has compute capability 7.0. You can use float16 instead by explicitly setting the`dtype` "
     "flag in CLI, for example: --dtype=half."),
    ("explicit bfloat16", "20b", ["-tp", "8", "--dtype", "bfloat16"], {},
     "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla "
     "V100-PCIE-32GB GPU has compute capability 7.0. You can use float16 instead by explicitly setting the`dtype` "
     "flag in CLI, for example: --dtype=half."),
    ("tp does not divide heads", "20b", ["-tp", "5", "--dtype", "half"], {},
     "ValueError: Total number of attention heads (48) must be divisible by tensor parallel size (5)."),
    # The controller's Python has no Ray: 0.5.4 then stops at the import (v0.5.4 vllm/config.py:700-726); the GPU
    # message against a real cluster is tests/unit/test_twin_ray.py's.
    ("tp above the visible gpus", "20b", ["-tp", "4", "--dtype", "half"], {"CUDA_VISIBLE_DEVICES": "2,3"},
     "ValueError: Unable to load Ray which is required for multi-node inference, please install Ray with "
     "`pip install ray`."),
    ("weights do not fit", "20b", ["--dtype", "half"], {},
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of "
     "31.75 GiB of which 2.00 MiB is free. Including non-PyTorch memory, this process has 31.75 GiB memory in use. "
     "Of the allocated memory 31.48 GiB is allocated by PyTorch, and 2.00 MiB is reserved by PyTorch but "
     "unallocated. If reserved but unallocated memory is large try setting "
     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
     "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"),
    ("batched tokens below max-model-len", "20b", ["-tp", "8", "--dtype", "half", "--max-model-len", "4096",
                                                   "--max-num-batched-tokens", "2048"], {},
     "ValueError: max_num_batched_tokens (2048) is smaller than max_model_len (4096). This effectively limits the "
     "maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please increase "
     "max_num_batched_tokens or decrease max_model_len."),
    ("max-model-len above the config", "7b", ["--dtype", "half", "--max-model-len", "8192"], {},
     "ValueError: User-specified max_model_len (8192) is greater than the derived max_model_len "
     "(max_position_embeddings=4096 or model_max_length=None in model's config.json). This may lead to incorrect "
     "model outputs or CUDA errors. To allow overriding this maximum, set the env var "
     "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"),
    ("no memory left for the cache", "7b", ["--dtype", "half", "--gpu-memory-utilization", "0.4"], {},
     "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
     "initializing the engine."),
    ("utilisation above 1", "7b", ["--dtype", "half", "--gpu-memory-utilization", "1.2"], {},
     "ValueError: GPU memory utilization must be less than 1.0. Got 1.2."),
    ("swap space above 70 % of RAM", "20b", ["-tp", "8", "--dtype", "half", "--swap-space", "40"], {},
     "ValueError: Too large swap space. 320.00 GiB out of the 384.00 GiB total CPU memory is allocated for the "
     "swap space."),
    ("awq on volta", "awq", ["--dtype", "half"], {},
     "ValueError: The quantization method awq is not supported for the current GPU. Minimum capability: 75. "
     "Current capability: 70."),
    ("cuda graphs without room (field notes' first attempt: 0.95, default max-num-seqs)", "20b",
     ["-tp", "8", "--dtype", "float16", "--gpu-memory-utilization", "0.95", "--max-model-len", "4096",
      "--max-num-batched-tokens", "8192", "--swap-space", "16"], {"NCCL_P2P_DISABLE": "1"},
     "torch.OutOfMemoryError: CUDA out of memory."),
])
def test_startup_failure_message_and_exit_status(models, tmp_path, name, model, args, env, expected):
    done = run(models[model], args + IN_PROCESS, tmp_path, env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert last_line(done.stderr).startswith(expected)
    assert "Traceback (most recent call last):" in done.stderr


def test_max_model_len_above_the_kv_capacity(models, tmp_path):
    facts = inspect_model(str(models["7b"]))
    # a utilisation that leaves room for some blocks but fewer than 4096 tokens
    util = next(u / 1000 for u in range(450, 700) if 0 < kv_cache_plan(
        facts, 1, CUDA_TOTAL_V100, u / 1000, 4, max_model_len=4096).tokens < 4096)
    estimate = kv_cache_plan(facts, 1, CUDA_TOTAL_V100, util, 4, max_model_len=4096)
    done = run(models["7b"], ["--dtype", "half", "--gpu-memory-utilization", str(util)] + IN_PROCESS, tmp_path)
    assert done.returncode == 1
    assert f"# GPU blocks: {estimate.num_gpu_blocks}, # CPU blocks: {estimate.num_cpu_blocks}" in done.stdout
    assert last_line(done.stderr) == (
        f"ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be stored "
        f"in KV cache ({estimate.tokens}). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
        "when initializing the engine.")


def test_missing_model_path_fails_in_the_api_process_in_both_modes(tmp_path):
    for extra in ([], IN_PROCESS):
        done = run(tmp_path / "no-such-model", ["--dtype", "half"] + extra, tmp_path)
        assert done.returncode == 1
        assert last_line(done.stderr) == (f"OSError: Incorrect path_or_model_id: '{tmp_path / 'no-such-model'}'. "
                                          "Please provide either the path to a local folder or the repo_id of a "
                                          "model on the Hub.")


def test_field_notes_flags_start_and_log_the_gpu_blocks_of_revive_kv(models, tmp_path):
    facts = inspect_model(str(models["20b"]))
    estimate = kv_cache_plan(facts, 8, CUDA_TOTAL_V100, 0.92, 16, max_num_batched_tokens=8192, max_num_seqs=128,
                             max_model_len=4096)
    twin = harness.start(models["20b"], FIELD_FLAGS + IN_PROCESS,
                         harness.twin_env(tmp_path, time_scale=0.0001, extra=harness.FIELD_NOTES_ENV),
                         tmp_path / "twin.log")
    try:
        log = twin.log()
        assert f"# GPU blocks: {estimate.num_gpu_blocks}, # CPU blocks: {estimate.num_cpu_blocks}" in log
        assert "vLLM API server version 0.5.4+sim" in log and "[twin] This is the revive lab's twin" in log
        assert log.count("Loading model weights took 4.6243 GB") == 8
        assert log.count("(VllmWorkerProcess pid=") >= 7 * 3
        assert "network transport over loopback sockets" in log
        assert "Capturing the model for CUDA graphs" not in log
    finally:
        assert twin.stop() == 0


def test_port_opens_only_after_the_model_load_time(models, tmp_path):
    # 39.7 GB at 650 MB/s is 61 s of load, plus start-up; at a time scale of 0.02 about 1.5 s.
    env = harness.twin_env(tmp_path, time_scale=0.02, extra=harness.FIELD_NOTES_ENV)
    started = time.monotonic()
    twin = harness.start(models["20b"], FIELD_FLAGS + IN_PROCESS, env, tmp_path / "twin.log")
    try:
        assert time.monotonic() - started > 0.02 * 61
    finally:
        twin.stop()


def test_default_mode_prints_the_engine_error_and_hangs_like_054(models, tmp_path):
    env = harness.twin_env(tmp_path, time_scale=0.0001)
    port = harness.free_port()
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err:
        process = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                                    str(models["20b-bf16"]), "-tp", "8", "--port", str(port)],
                                   env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 30
        while "ValueError: Bfloat16" not in err_path.read_text() and time.monotonic() < deadline:
            assert process.poll() is None
            time.sleep(0.05)
        time.sleep(0.3)
        assert process.poll() is None  # still running, waiting for an engine process that died
        with pytest.raises(OSError):
            harness.request(harness.Twin(process, port, err_path, ""), "GET", "/health", timeout=2)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        assert process.returncode == -signal.SIGTERM
        stderr = err_path.read_text()
        assert stderr.startswith("Process Process-1:\nTraceback (most recent call last):")
        assert "ValueError: Bfloat16 is only supported" in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_cuda_graphs_are_captured_when_there_is_room(models, tmp_path):
    args = ["-tp", "8", "--dtype", "float16", "--gpu-memory-utilization", "0.92", "--max-model-len", "4096",
            "--max-num-seqs", "128", "--max-num-batched-tokens", "8192"]
    twin = harness.start(models["20b"], args + IN_PROCESS, harness.twin_env(tmp_path, time_scale=0.0001),
                         tmp_path / "twin.log")
    try:
        log = twin.log()
        assert log.count("CUDA graphs can take additional 1~3 GiB memory per GPU.") == 8
        assert "Graph capturing finished in" in log
    finally:
        twin.stop()


def test_cuda_visible_devices_and_device_order_select_gpus_like_cuda():
    sys.path.insert(0, str(REPO / "lab" / "vllm_twin" / "src"))
    from vllm._twin.gpus import Gpu, order_and_visibility

    def gpu(index, bus, cc=(7, 0)):
        return Gpu(index, "Tesla V100-PCIE-32GB", f"GPU-{index:02d}aa-{bus}", f"00000000:{bus}:00.0", cc, "volta",
                   1 << 35, 1 << 35, 0)

    gpus = [gpu(0, "1A"), gpu(1, "1B"), gpu(2, "3D", (8, 0)), gpu(3, "3E")]

    def visible(**env):
        return [g.nvml_index for g in order_and_visibility(gpus, env)]

    assert visible() == [2, 0, 1, 3]                                  # FASTEST_FIRST: the CC 8.0 card first
    assert visible(CUDA_DEVICE_ORDER="PCI_BUS_ID") == [0, 1, 2, 3]
    assert visible(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES="3,1") == [3, 1]
    assert visible(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES="1,7,2") == [1]  # stops at an invalid entry
    assert visible(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES="0,0,1") == [0]  # and at a duplicate
    assert visible(CUDA_VISIBLE_DEVICES="GPU-03aa,GPU-00") == [3, 0]                       # unique UUID prefixes
    assert visible(CUDA_VISIBLE_DEVICES="GPU-03aa,GPU-0") == [3]                           # an ambiguous one ends it
    assert visible(CUDA_VISIBLE_DEVICES="") == [] and visible(CUDA_VISIBLE_DEVICES="-1") == []
