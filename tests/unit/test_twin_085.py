"""The vLLM 0.8.5.post1 twin: its parser built from the release's CLI table, and the behaviour the lab sees
that differs from 0.5.4 (V0/V1 choice on Volta, per-instance KV sizing and its log lines, engine start-up
failure, /metrics in the default mode, SIGTERM, a dead engine, request logging, API shapes).

The twin runs from the files of its 0.8.5.post1 wheel (harness.release_src), as a node runs the wheel."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ansible.module_utils.revive_kv import kv_cache_plan
from ansible.module_utils.revive_model import inspect_model, model_from_config
from ansible.module_utils.revive_plan import Serve, Workload, plan_release
from ansible.module_utils.revive_releases import load_release_file
from fixtures.gpus import lab_facts, lab_ram_bytes

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))

import harness  # noqa: E402

RELEASE = "0.8.5.post1"
CUDA_TOTAL_V100 = 34089730048  # what CUDA reports for a V100-32GB (the twin derives it from NVML)
V100 = "v100-pcie-8x"
# Normalises the parser's actions in the twin's process: flags, action class, default, choices, nargs.
DUMP_PARSER = """
import argparse, json, sys
from vllm.entrypoints.openai.cli_args import build_parser
rows = []
for action in build_parser()._actions:
    if isinstance(action, argparse._HelpAction):
        continue
    rows.append({"flags": action.option_strings, "kind": type(action).__name__, "default": action.default,
                 "choices": None if action.choices is None else [str(c) for c in action.choices],
                 "nargs": None if action.nargs == 0 else action.nargs})
json.dump(rows, sys.stdout, default=str)
"""
PARSE = """
import json, sys
from vllm.entrypoints.openai.cli_args import build_parser
print(json.dumps(vars(build_parser().parse_args(json.loads(sys.argv[1]))), default=str))
"""
KINDS = {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
         "_AppendAction": "append"}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return harness.release_src(RELEASE, tmp_path_factory.mktemp("twin-085"))


@pytest.fixture(scope="module")
def release():
    return load_release_file(str(REPO / "data" / "vllm-releases.yml")).release(RELEASE)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        "20b": harness.write_model("internlm2-chat-20b", root / "chat-20b-fp16", dtype="F16"),
        "20b-bf16": harness.write_model("internlm2-chat-20b", root / "chat-20b-bf16", dtype="BF16"),
        "7b": harness.write_model("llama-2-7b-chat", root / "llama-2-7b", dtype="F16"),
    }


def python(src: Path, code: str, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(src))
    return subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=60)


def run(src, model, args, tmp_path, extra_env=None, time_scale=0.0001, timeout=90):
    env = harness.twin_env(tmp_path, time_scale=time_scale, extra=extra_env, src=src)
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(harness.free_port()), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def start(src, model, args, tmp_path, extra_env=None, time_scale=0.0001):
    env = harness.twin_env(tmp_path, time_scale=time_scale, extra=extra_env, src=src)
    return harness.start(model, args, env, tmp_path / "twin.log", timeout=120)


def last_line(stderr: str) -> str:
    return stderr.rstrip().splitlines()[-1]


# ------------------------------------------------------------------------------- release and parser

def test_the_release_is_fixed_in_the_wheel_files(src, tmp_path):
    code = "import vllm; print(vllm.__version__, vllm.__commit__, vllm.__simulated__)"
    assert python(src, code).stdout.split() == ["0.8.5.post1+sim", "None", "True"]
    checkout = python(REPO / "lab" / "vllm_twin" / "src", code)
    assert checkout.stdout.split() == ["0.5.4+sim", "4db5176d9758b720b05460c50ace3c01026eb158", "True"]
    release_json = json.loads((src / "vllm" / "_twin" / "release.json").read_text())
    assert (release_json["release"], release_json["behaviour"]["parser"]) == (RELEASE, "table")


def test_parser_equals_the_085_table(src, release):
    done = python(src, DUMP_PARSER)
    assert done.returncode == 0, done.stderr
    rows = {row["flags"][0]: row for row in json.loads(done.stdout)}
    assert list(rows) == [argument.flags[0] for argument in release.arguments]
    problems = []
    for argument in release.arguments:
        row = rows[argument.flags[0]]
        expected = {"flags": list(argument.flags), "kind": argument.action,
                    "default": json.loads(json.dumps(argument.default, default=str)),
                    "choices": None if argument.choices is None else list(argument.choices),
                    "nargs": argument.nargs}
        actual = dict(row, kind=KINDS.get(row["kind"], row["kind"]))
        if expected != actual:
            problems.append(f"{argument.flags[0]}: table {expected} != parser {actual}")
    assert problems == []


def test_table_types_actions_and_underscored_names(src):
    argv = ["--swap-space", "0.5", "--max-model-len", "32k", "--tensor_parallel_size=8", "--enable-chunked-prefill",
            "--no-enable-prefix-caching", "--quantization", "None", "--served-model-name", "a", "b",
            "--max_num_batched_tokens=2048"]
    done = python(src, PARSE, json.dumps(argv))
    assert done.returncode == 0, done.stderr
    args = json.loads(done.stdout)
    assert (args["swap_space"], args["max_model_len"], args["tensor_parallel_size"]) == (0.5, 32000, 8)
    assert (args["enable_chunked_prefill"], args["enable_prefix_caching"], args["quantization"]) == (True, False, None)
    assert (args["served_model_name"], args["max_num_batched_tokens"]) == (["a", "b"], 2048)


@pytest.mark.parametrize("argv, message", [
    (["--enable-log-requests"], "error: unrecognized arguments: --enable-log-requests"),
    (["--swap-space", "lots"], "error: argument --swap-space: invalid float value: 'lots'"),
    (["--block-size", "7"], "error: argument --block-size: invalid choice: 7 (choose from 1, 8, 16, 32, 64, 128)"),
    (["--max-model-len", "1.5K"], "error: argument --max-model-len: Decimals are not allowed with binary suffixes "
                                   "like K. Did you mean to use 1.5k instead?"),
    (["--config", "serve.yaml"], "error: [twin] --config (arguments from a YAML file) is not simulated; pass the "
                                 "arguments on the command line"),
])
def test_unknown_or_invalid_arguments_exit_2(src, argv, message):
    env = dict(os.environ, PYTHONPATH=str(src))
    done = subprocess.run([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *argv], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("usage: api_server.py [-h] [--host HOST] [--port PORT]")
    assert done.stderr.splitlines()[-1].endswith(message)


# ----------------------------------------------------------------- the planner's argv, default mode

def test_the_planners_argv_starts_with_per_instance_kv_and_metrics_in_the_default_mode(src, models, release,
                                                                                      tmp_path):
    facts = inspect_model(str(models["20b"]))
    plan = plan_release(lab_facts(V100), model_from_config(json.loads((models["20b"] / "config.json").read_text()),
                                                           str(models["20b"])),
                        load_release_file(str(REPO / "data" / "vllm-releases.yml")), Workload(),
                        serve=Serve(model_path=str(models["20b"]), host="127.0.0.1"),
                        host_ram_bytes=lab_ram_bytes(V100))
    assert plan["vllm_version"] == RELEASE and "--disable-frontend-multiprocessing" not in plan["args"]
    args = plan["args"]
    args = [a for i, a in enumerate(args) if a not in ("--model", "--host", "--port")
            and (i == 0 or args[i - 1] not in ("--model", "--host", "--port"))]
    value = {flag: args[args.index(flag) + 1] for flag in ("--tensor-parallel-size", "--gpu-memory-utilization",
                                                           "--swap-space", "--max-num-batched-tokens",
                                                           "--max-num-seqs", "--max-model-len")}
    tp, util = int(value["--tensor-parallel-size"]), float(value["--gpu-memory-utilization"])
    estimate = kv_cache_plan(facts, tp, CUDA_TOTAL_V100, util, float(value["--swap-space"]),
                             max_num_batched_tokens=int(value["--max-num-batched-tokens"]),
                             max_num_seqs=int(value["--max-num-seqs"]), max_model_len=int(value["--max-model-len"]),
                             sizing="v0-per-instance")
    twin = start(src, models["20b"], args, tmp_path, extra_env=plan["env"])
    served = args[args.index("--served-model-name") + 1]
    try:
        status, _, body = harness.request(twin, "POST", "/v1/completions",
                                          {"model": served, "prompt": "hello", "max_tokens": 4})
        assert status == 200 and json.loads(body)["choices"][0]["prompt_logprobs"] is None
        status, _, metrics = harness.request(twin, "GET", "/metrics")
        log = twin.log()
    finally:
        assert twin.stop() == 0
    assert "[api_server.py:1043] vLLM API server version 0.8.5.post1+sim" in log
    assert f"[executor_base.py:112] # cuda blocks: {estimate.num_gpu_blocks}, # CPU blocks: {estimate.num_cpu_blocks}" \
        in log
    concurrency = estimate.num_gpu_blocks * 16 / int(value["--max-model-len"])
    assert f"[executor_base.py:117] Maximum concurrency for {value['--max-model-len']} tokens per request: " \
           f"{concurrency:.2f}x" in log
    assert log.count("[worker.py:287] Memory profiling takes") == tp
    assert f"the rest of the memory reserved for KV Cache is {estimate.kv_bytes / (1 << 30):.2f}GiB." in log
    assert "Falling back to V0" not in log  # VLLM_USE_V1=0: V0 without a word
    assert log.count("[cuda.py:228] Using XFormers backend.") == tp  # the plan's VLLM_ATTENTION_BACKEND
    assert "[api_server.py:246] Started engine process with PID" in log
    samples = {(name, labels.get("finished_reason")): value for name, labels, value in
               harness.iter_metrics(metrics.decode())}
    assert status == 200 and samples[("vllm:request_success_total", "length")] == 1.0
    assert ("vllm:num_requests_running", None) in samples and ("vllm:iteration_tokens_total_count", None) in samples
    assert not any(name.startswith(("python_", "process_", "vllm:avg_")) for name, _ in samples)
    families = {line.split()[2] for line in metrics.decode().splitlines() if line.startswith("# TYPE ")}
    assert set(release.metrics) <= families  # the release's `metrics:` of data/vllm-releases.yml


# ------------------------------------------------------------------------------------ V1 on Volta

def test_v1_on_volta_falls_back_when_unset_and_refuses_when_asked(src, models, tmp_path):
    refused = run(src, models["7b"], ["--dtype", "half"], tmp_path, {"VLLM_USE_V1": "1"})
    assert refused.returncode == 1
    assert last_line(refused.stderr) == "NotImplementedError: VLLM_USE_V1=1 is not supported with Compute Capability " \
                                        "< 8.0."
    assert "Started engine process" not in refused.stdout
    twin = start(src, models["7b"], ["--dtype", "half", "--max-model-len", "2048"], tmp_path)
    try:
        log = twin.log()
    finally:
        assert twin.stop() == 0
    assert "WARNING" in log and "[arg_utils.py:1658] Compute Capability < 8.0 is not supported by the V1 Engine. " \
                                 "Falling back to V0. " in log


# ------------------------------------------------------------------------- start-up failures

def test_an_engine_error_in_the_default_mode_exits_at_the_next_rpc_poll(src, models, tmp_path):
    # VLLM_RPC_TIMEOUT 30000 s x time scale 0.0001 = a 3 s poll
    started = time.monotonic()
    done = run(src, models["20b-bf16"], ["-tp", "8"], tmp_path, {"VLLM_RPC_TIMEOUT": "30000000"})
    elapsed = time.monotonic() - started
    assert done.returncode == 1
    assert elapsed >= 3.0
    assert done.stderr.startswith("Process SpawnProcess-1:\nTraceback (most recent call last):")
    assert "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla " \
           "V100-PCIE-32GB GPU has compute capability 7.0. You can use float16 instead by explicitly setting the " \
           "`dtype` flag in CLI, for example: --dtype=half." in done.stderr
    assert last_line(done.stderr) == "RuntimeError: Engine process failed to start. See stack trace for the root cause."
    assert re.search(r"^ERROR \d\d-\d\d [\d:]+ \[engine\.py:448\] Bfloat16 is only supported", done.stdout, re.M)


def test_configuration_errors_end_the_api_process_at_once(src, models, tmp_path):
    done = run(src, models["20b"], ["-tp", "5", "--dtype", "half"], tmp_path)
    assert done.returncode == 1
    assert "SpawnProcess" not in done.stderr and "Started engine process" not in done.stdout
    assert last_line(done.stderr) == "ValueError: Total number of attention heads (48) must be divisible by tensor " \
                                     "parallel size (5)."
    missing = run(src, tmp_path / "no-such-model", ["--dtype", "half"], tmp_path)
    assert missing.returncode == 1
    assert f"ValueError: Invalid repository ID or local directory specified: '{tmp_path / 'no-such-model'}'." \
           in missing.stderr


# ------------------------------------------------------------------------- shutdown and engine death

def _stream_in_thread(twin, body, timeout):
    result = {}
    thread = threading.Thread(target=lambda: result.update(r=harness.stream(twin, "/v1/chat/completions", body,
                                                                            timeout=timeout)))
    thread.start()
    return thread, result


def test_sigterm_in_the_default_mode_stalls_open_streams_until_their_clients_leave(src, models, tmp_path):
    twin = start(src, models["7b"], ["--dtype", "half", "--max-model-len", "4096", "--enforce-eager"], tmp_path,
                 time_scale=0.05)
    body = {"model": twin.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000,
            "ignore_eos": True, "stream": True}
    thread, result = _stream_in_thread(twin, body, timeout=4)
    try:
        deadline = time.monotonic() + 30
        while "Added request chatcmpl-" not in twin.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        twin.process.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert twin.process.poll() is None  # waiting for the open stream's connection
        with pytest.raises(OSError):
            harness.request(twin, "GET", "/health", timeout=2)
        twin.process.send_signal(signal.SIGTERM)  # a second signal changes nothing
        thread.join(timeout=30)
        stream = result["r"]
        assert stream.error is not None and "timed out" in stream.error  # no [DONE], no finish_reason
        assert stream.events[-1] != "[DONE]" and all(c["choices"][0].get("finish_reason") is None
                                                     for c in stream.chunks() if c["choices"])
        assert twin.process.wait(timeout=20) == 0
        log = twin.log()
    finally:
        twin.stop(signal.SIGKILL)
    assert "[launcher.py:79] Shutting down FastAPI HTTP server." in log
    assert "INFO:     Waiting for connections to close. (CTRL+C to force quit)" in log
    assert log.index("Waiting for connections to close") < log.index("Application shutdown complete.")


def test_a_dead_engine_ends_streams_with_an_error_and_stops_the_server(src, models, tmp_path):
    twin = start(src, models["20b"], ["-tp", "8", "--dtype", "half", "--max-model-len", "4096", "--enforce-eager"],
                 tmp_path, time_scale=0.05)
    body = {"model": twin.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000,
            "ignore_eos": True, "stream": True}
    thread, result = _stream_in_thread(twin, body, timeout=30)
    try:
        deadline = time.monotonic() + 30
        while "Added request chatcmpl-" not in twin.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        worker = int(re.findall(r"VllmWorkerProcess pid=(\d+)", twin.log())[0])
        os.kill(worker, signal.SIGKILL)
        thread.join(timeout=30)
        # the watchdog stops the server (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH unset)
        assert twin.process.wait(timeout=20) == 0
        log = twin.log()
    finally:
        twin.stop(signal.SIGKILL)
    stream = result["r"]
    assert stream.complete and stream.events[-1] == "[DONE]"
    error = json.loads(stream.events[-2])["error"]
    assert error["message"] == ("Engine loop is not running. Inspect the stacktrace to find the original error: "
                                f"RuntimeError('Worker VllmWorkerProcess pid {worker} died, exit code: -9').")
    assert (error["type"], error["code"]) == ("BadRequestError", 400)
    assert f"Worker VllmWorkerProcess pid {worker} died, exit code: -9" in log
    assert "INFO:     Finished server process" in log


# ------------------------------------------------------------------ swap space, request log, API shapes

def test_float_swap_space_request_log_and_085_response_shapes(src, models, tmp_path):
    facts = inspect_model(str(models["7b"]))
    estimate = kv_cache_plan(facts, 1, CUDA_TOTAL_V100, 0.9, 0.5, max_model_len=4096, max_num_seqs=256,
                             max_num_batched_tokens=4096, sizing="v0-per-instance")
    twin = start(src, models["7b"], ["--dtype", "half", "--swap-space", "0.5"], tmp_path)
    try:
        request = {"model": twin.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        status, _, body = harness.request(twin, "POST", "/v1/chat/completions", request)
        stream = harness.stream(twin, "/v1/chat/completions", dict(request, stream=True))
        log = twin.log()
    finally:
        assert twin.stop() == 0
    assert f"# cuda blocks: {estimate.num_gpu_blocks}, # CPU blocks: {estimate.num_cpu_blocks}" in log
    answer = json.loads(body)
    assert status == 200 and answer["id"].startswith("chatcmpl-")
    assert list(answer["choices"][0]["message"]) == ["role", "reasoning_content", "content", "tool_calls"]
    assert answer["prompt_logprobs"] is None and answer["usage"]["prompt_tokens_details"] is None
    assert stream.chunks()[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert re.search(rf"\[logger\.py:39\] Received request {answer['id']}: prompt: .*bad_words=\[\]", log)
    assert f"[engine.py:310] Added request {answer['id']}." in log
    assert "Finished request" not in log  # the MQ engine does not log it


def test_sigterm_while_the_engine_starts_interrupts_the_server(src, models, tmp_path):
    # 39.7 GB at 650 MB/s is 61 s of load; at a time scale of 0.2, 12 s: the signal arrives during the load
    env = harness.twin_env(tmp_path, time_scale=0.2, src=src)
    twin = harness.start(models["20b"], ["-tp", "8", "--dtype", "half"], env, tmp_path / "twin.log", wait=False)
    try:
        deadline = time.monotonic() + 30
        while "Starting to load model" not in twin.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        twin.process.send_signal(signal.SIGTERM)
        assert twin.process.wait(timeout=20) == -signal.SIGINT  # Python re-raises an unhandled KeyboardInterrupt
        log = twin.log()
    finally:
        twin.stop(signal.SIGKILL)
    assert log.rstrip().splitlines()[-1] == "KeyboardInterrupt: terminated"


def test_in_process_mode_serves_the_default_registry_and_finishes_streams_on_sigterm(src, models, tmp_path):
    twin = start(src, models["7b"], ["--dtype", "half", "--max-model-len", "4096", "--enforce-eager",
                                     "--disable-frontend-multiprocessing"], tmp_path, time_scale=0.05)
    body = {"model": twin.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60,
            "ignore_eos": True, "stream": True}
    try:
        _, _, metrics = harness.request(twin, "GET", "/metrics")
        thread, result = _stream_in_thread(twin, body, timeout=30)
        deadline = time.monotonic() + 30
        while "Added request chatcmpl-" not in twin.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        twin.process.send_signal(signal.SIGTERM)
        thread.join(timeout=30)
        assert twin.process.wait(timeout=30) == 0
        log = twin.log()
    finally:
        twin.stop(signal.SIGKILL)
    names = {name for name, _, _ in harness.iter_metrics(metrics.decode())}
    # the default registry: its collectors, and every vllm:* family before its first series
    assert "python_gc_objects_collected_total" in names
    assert "# TYPE vllm:num_requests_running gauge" in metrics.decode()
    stream = result["r"]
    assert stream.complete and stream.events[-1] == "[DONE]"
    assert stream.chunks()[-1]["choices"][0]["finish_reason"] == "length"
    assert "Started engine process" not in log and "[async_llm_engine.py:211] Added request" in log
