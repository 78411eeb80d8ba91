"""The twin of the matrix's other V0 releases (0.6.6.post1, 0.7.3, 0.9.2): each runs from the files of its own
wheel (harness.release_src) and speaks as that release does - `X+sim` in /version, its parser (data/vllm-releases.yml's
CLI table), exactly the metric names of its data in the default mode, its KV line - and where the releases differ
in what the data cannot say (vllm/_twin/release.py BEHAVIOURS, each switch with its upstream source), the
difference is asserted here.

One server per release (module scope) runs the planner's argv for the 20B on v100-pcie-8x, pinned to that release;
the other tests run the twin once each. A release whose data entry has no CLI table or metric list yet is skipped
with the reason (the wheel build refuses it the same way)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible.module_utils.revive_kv import kv_cache_plan
from ansible.module_utils.revive_model import inspect_model, model_from_config
from ansible.module_utils.revive_plan import Overrides, PackageSource, Serve, Workload, plan_release
from ansible.module_utils.revive_releases import load_release_file
from fixtures.gpus import lab_facts, lab_ram_bytes

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))

import build_wheelhouse  # noqa: E402
import harness  # noqa: E402

RELEASES = ("0.6.6.post1", "0.7.3", "0.9.2")
V100 = "v100-pcie-8x"
CUDA_TOTAL_V100 = 34089730048  # what CUDA reports for a V100-32GB (the twin derives it from NVML)
DATA = REPO / "data" / "vllm-releases.yml"
PARSE = """
import json, sys
from vllm.entrypoints.openai.cli_args import build_parser
print(json.dumps(vars(build_parser().parse_args(json.loads(sys.argv[1]))), default=str))
"""
# What each release says where they differ (the switches of vllm/_twin/release.py, with their sources there).
# CacheConfig's attributes, the labels of vllm:cache_config_info (v0.6.6.post1:vllm/config.py:981-997,
# v0.7.3 :1059-1075, v0.9.2 :1483-1566)
CACHE_066 = ["block_size", "gpu_memory_utilization", "swap_space_bytes", "num_gpu_blocks_override", "cache_dtype",
             "is_attention_free", "sliding_window", "enable_prefix_caching", "cpu_offload_gb", "num_gpu_blocks",
             "num_cpu_blocks"]
CACHE_092 = ["block_size", "gpu_memory_utilization", "swap_space", "cache_dtype", "is_attention_free",
             "num_gpu_blocks_override", "sliding_window", "enable_prefix_caching", "prefix_caching_hash_algo",
             "cpu_offload_gb", "calculate_kv_scales", "cpu_kvcache_space_bytes", "num_gpu_blocks", "num_cpu_blocks",
             "swap_space_bytes"]
# kv_at / concurrency_at: (one GPU, several GPUs).
EXPECTED = {
    "0.6.6.post1": {"brackets": False, "version": "api_server.py:712", "kv": "# GPU blocks:",
                    "kv_at": ("gpu_executor.py:76", "distributed_gpu_executor.py:57"),
                    "concurrency_at": ("gpu_executor.py:80", "distributed_gpu_executor.py:61"),
                    "profiling_at": "worker.py:241", "args": "args: Namespace(", "start": None, "uvicorn": True,
                    "v1_fallback": None, "engine_first": True, "e2e_top": 60.0, "ttft_top": 10.0,
                    "message": ["role", "content", "tool_calls"], "kv_transfer_params": False,
                    "service": {"/ping": 404, "/load": 404}, "engine_init": ("llm_engine.py:234", "an LLM engine"),
                    "cache_config": CACHE_066},
    "0.7.3": {"brackets": False, "version": "api_server.py:912", "kv": "# cuda blocks:",
              "kv_at": ("executor_base.py:111",) * 2, "concurrency_at": ("executor_base.py:116",) * 2,
              "profiling_at": "worker.py:267", "args": "args: Namespace(", "start": "Starting vLLM API server on http://",
              "uvicorn": False, "v1_fallback": None, "engine_first": True, "e2e_top": 60.0, "ttft_top": 10.0,
              "message": ["role", "reasoning_content", "content", "tool_calls"], "kv_transfer_params": False,
              "service": {"/ping": 200, "/load": 404}, "engine_init": ("llm_engine.py:234", "a V0 LLM engine"),
              "cache_config": CACHE_066 + ["calculate_kv_scales"]},
    "0.9.2": {"brackets": True, "version": "api_server.py:1395", "kv": "# cuda blocks:",
              "kv_at": ("executor_base.py:113",) * 2, "concurrency_at": ("executor_base.py:118",) * 2,
              "profiling_at": "worker.py:294", "args": "non-default args: {", "start": "Starting vLLM API server 0 on http://",
              "uvicorn": False, "v1_fallback": "arg_utils.py:1735", "engine_first": False, "e2e_top": 7680.0,
              "ttft_top": 2560.0, "message": ["role", "reasoning_content", "content", "tool_calls"],
              "kv_transfer_params": True, "service": {"/ping": 200, "/load": 200},
              "engine_init": ("llm_engine.py:230", "a V0 LLM engine"), "cache_config": CACHE_092},
}


def missing_data(entry) -> str:
    if not entry.raw.get("cli", {}).get("arguments"):
        return "no CLI table"
    if not entry.metrics:
        return "no metrics list"
    return ""


@pytest.fixture(scope="module")
def data():
    return load_release_file(str(DATA))


@pytest.fixture(scope="module", params=RELEASES)
def release(request, data):
    assert request.param in data.versions(), f"data/vllm-releases.yml has no entry for {request.param}"
    entry = data.release(request.param)
    missing = missing_data(entry)
    assert not missing, f"data/vllm-releases.yml: {request.param} has {missing}: the twin cannot be built for it"
    return entry


@pytest.fixture(scope="module")
def src(release, tmp_path_factory):
    return harness.release_src(release.version, tmp_path_factory.mktemp(f"twin-{release.version}"))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"20b": harness.write_model("internlm2-chat-20b", root / "chat-20b-fp16", dtype="F16"),
            "7b": harness.write_model("llama-2-7b-chat", root / "llama-2-7b", dtype="F16"),
            "7b-bf16": harness.write_model("llama-2-7b-chat", root / "llama-2-7b-bf16", dtype="BF16")}


def python(src: Path, code: str, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(src))
    return subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=60)


def run(src, model, args, tmp_path, extra_env=None, timeout=90):
    env = harness.twin_env(tmp_path, time_scale=0.0001, extra=extra_env, src=src)
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--host", "127.0.0.1", "--port", str(harness.free_port()), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def strip_serve_flags(args):
    return [a for i, a in enumerate(args) if a not in ("--model", "--host", "--port")
            and (i == 0 or args[i - 1] not in ("--model", "--host", "--port"))]


@pytest.fixture(scope="module")
def served(release, src, models, data, tmp_path_factory):
    """The planner's argv for the 20B on v100-pcie-8x pinned to the release, run on its twin: the log, /version,
    /metrics after one completion, and a chat answer."""
    tmp = tmp_path_factory.mktemp(f"served-{release.version}")
    model = models["20b"]
    plan = plan_release(lab_facts(V100), model_from_config(json.loads((model / "config.json").read_text()), str(model)),
                        data, Workload(), Overrides(vllm_version=release.version),
                        Serve(model_path=str(model), host="127.0.0.1"), lab_ram_bytes(V100),
                        PackageSource("mirror", "https://pypi.internal.example/simple"))
    assert plan["vllm_version"] == release.version
    args = strip_serve_flags(plan["args"])
    twin = harness.start(model, args, harness.twin_env(tmp, time_scale=0.0001, extra=plan["env"], src=src),
                         tmp / "twin.log", timeout=120)
    name = args[args.index("--served-model-name") + 1]
    ready = time.monotonic()
    try:
        completion = harness.request(twin, "POST", "/v1/completions", {"model": name, "prompt": "hi", "max_tokens": 4})
        if any(metric.startswith("vllm:avg_") for metric in release.metrics):
            # the avg_* gauges are set at the first stats log after the 5-second local interval (v0.6.6.post1:
            # vllm/engine/metrics.py:637-649), as the throughput line is
            time.sleep(max(0.0, ready + 5.2 - time.monotonic()))
            harness.request(twin, "POST", "/v1/completions", {"model": name, "prompt": "hi", "max_tokens": 4})
        chat = harness.request(twin, "POST", "/v1/chat/completions",
                               {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        version = harness.request(twin, "GET", "/version")
        service = {path: harness.request(twin, "GET", path)[0] for path in ("/ping", "/load")}
        metrics = harness.request(twin, "GET", "/metrics")
        log = twin.log()
    finally:
        code = twin.stop()
    assert code == 0 and completion[0] == 200 and chat[0] == 200, log
    return SimpleNamespace(args=args, env=plan["env"], log=log, version=json.loads(version[2]),
                           metrics=metrics[2].decode(), chat=json.loads(chat[2]), model=model,
                           completion=json.loads(completion[2]), service=service)


def at(release: str, where: str) -> str:
    """`[file.py:N] ` (0.8 on) or `file.py:N] ` (0.5.4-0.7.x) as the release's logger formats it."""
    return f"[{where}] " if EXPECTED[release]["brackets"] else f"{where}] "


# ------------------------------------------------------------------------- the release, in its own words

def test_version_says_the_release_and_simulated(release, src, served):
    assert served.version["version"] == f"{release.version}+sim"
    assert (served.version["simulated"], served.version["simulates"]) == (True, release.version)
    done = python(src, "import vllm; print(vllm.__version__, vllm.__commit__)")
    assert done.stdout.split() == [f"{release.version}+sim", "None"]  # the wheels carry no commit id
    assert f"{at(release.version, EXPECTED[release.version]['version'])}vLLM API server version " \
           f"{release.version}+sim" in served.log


def test_parser_accepts_its_own_flags_and_refuses_another_releases(release, src, data):
    own = {flag for argument in release.arguments for flag in argument.flags}
    others = [flag for version in data.versions() if data.release(version).raw.get("cli", {}).get("arguments")
              for argument in data.release(version).arguments for flag in argument.flags]
    foreign = next(flag for flag in others if flag not in own and flag.startswith("--"))
    mine = next(a for a in release.arguments if a.action == "store_true" and a.flags[0] not in
                {f for arg in data.release("0.5.4").arguments for f in arg.flags})
    defaults = json.loads(python(src, PARSE, "[]").stdout)
    accepted = python(src, PARSE, json.dumps([mine.flags[0]]))
    assert accepted.returncode == 0, accepted.stderr
    changed = {k: v for k, v in json.loads(accepted.stdout).items() if defaults[k] != v}
    assert list(changed.values()) == [True], (mine.flags, changed)
    refused = python(src, PARSE, json.dumps([foreign, "1"]))
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1].endswith(f"unrecognized arguments: {foreign} 1"), refused.stderr


def test_metric_names_served_in_the_default_mode_are_the_datas(release, served):
    assert "--disable-frontend-multiprocessing" not in served.args
    families = [line.split()[2] for line in served.metrics.splitlines() if line.startswith("# TYPE ")]
    assert sorted(families) == sorted(release.metrics)
    assert not any(line.startswith(("python_", "process_")) for line in served.metrics.splitlines())


def test_metric_buckets_are_the_releases(release, served):
    top = {}
    for name, labels, _ in harness.iter_metrics(served.metrics):
        if name.endswith("_bucket") and labels["le"] != "+Inf":
            top[name] = max(top.get(name, 0.0), float(labels["le"]))
    assert top["vllm:e2e_request_latency_seconds_bucket"] == EXPECTED[release.version]["e2e_top"]
    assert top["vllm:time_to_first_token_seconds_bucket"] == EXPECTED[release.version]["ttft_top"]


def test_the_kv_lines_are_the_releases_and_the_planners_estimate(release, served):
    expected = EXPECTED[release.version]
    value = {flag: served.args[served.args.index(flag) + 1] for flag in (
        "--tensor-parallel-size", "--gpu-memory-utilization", "--swap-space", "--max-num-batched-tokens",
        "--max-num-seqs", "--max-model-len")}
    tp = int(value["--tensor-parallel-size"])
    estimate = kv_cache_plan(inspect_model(str(served.model)), tp, CUDA_TOTAL_V100,
                             float(value["--gpu-memory-utilization"]), float(value["--swap-space"]),
                             max_num_batched_tokens=int(value["--max-num-batched-tokens"]),
                             max_num_seqs=int(value["--max-num-seqs"]), max_model_len=int(value["--max-model-len"]),
                             sizing=release.kv_sizing_by_engine["V0"])
    several = int(tp > 1)
    assert f"{at(release.version, expected['kv_at'][several])}{expected['kv']} {estimate.num_gpu_blocks}, # CPU blocks: " \
           f"{estimate.num_cpu_blocks}" in served.log
    concurrency = estimate.num_gpu_blocks * 16 / int(value["--max-model-len"])
    assert f"{at(release.version, expected['concurrency_at'][several])}Maximum concurrency for {value['--max-model-len']} " \
           f"tokens per request: {concurrency:.2f}x" in served.log
    assert served.log.count(f"{at(release.version, expected['profiling_at'])}Memory profiling takes") == tp


def test_start_up_lines_are_the_releases(release, served):
    expected = EXPECTED[release.version]
    where, words = expected["engine_init"]
    assert f"{at(release.version, where)}Initializing {words} (v{release.version}+sim) with config: " in served.log
    assert expected["args"] in served.log
    start = re.search(r"Starting vLLM API server( 0)? on http://", served.log)
    if expected["start"] is None:
        assert start is None
    else:
        assert start is not None and start.group(0) == expected["start"]
    assert ("Uvicorn running on http://" in served.log) == expected["uvicorn"]
    assert served.chat["id"].startswith("chatcmpl-")
    if release.version == "0.9.2":
        assert re.search(r"^INFO \d\d-\d\d [\d:]+ \[api_server\.py:1395\] ", served.log, re.M)
    else:
        assert re.search(r"^INFO \d\d-\d\d [\d:]+ api_server\.py:\d+\] vLLM API server version", served.log, re.M)


def test_v1_is_opt_in_before_0_8_and_falls_back_on_volta_from_0_8(release, src, models, tmp_path):
    """VLLM_USE_V1 unset: 0.6.6.post1/0.7.3 run V0 without a word (the env's default is 0), 0.9.2 tries V1 and
    falls back on CC < 8.0 with its warning. VLLM_USE_V1=1 is refused in every release (the twin simulates V0;
    0.9.2 raises as vLLM does)."""
    fallback = EXPECTED[release.version]["v1_fallback"]
    unset = run(src, models["7b"], ["--dtype", "half", "--max-model-len", "16", "--max-num-seqs", "1",
                                    "--gpu-memory-utilization", "1.5"], tmp_path)
    assert unset.returncode == 1
    falls_back = "Compute Capability < 8.0 is not supported by the V1 Engine. Falling back to V0." in unset.stdout
    assert falls_back == (fallback is not None)
    if fallback:
        assert f"[{fallback}] Compute Capability < 8.0" in unset.stdout
        # 0.9.2 no longer falls back for tensorizer loads (0.8.5.post1 warns about the load format first)
        tensorizer = run(src, models["7b"], ["--dtype", "half", "--load-format", "tensorizer",
                                             "--gpu-memory-utilization", "1.5"], tmp_path)
        assert tensorizer.returncode == 1
        assert f"[{fallback}] Compute Capability < 8.0 is not supported" in tensorizer.stdout
        assert "--load_format tensorizer" not in tensorizer.stdout
    asked = run(src, models["7b"], ["--dtype", "half"], tmp_path, {"VLLM_USE_V1": "1"})
    assert asked.returncode == 1
    last = asked.stderr.rstrip().splitlines()[-1]
    if fallback:
        assert last == "NotImplementedError: VLLM_USE_V1=1 is not supported with Compute Capability < 8.0."
    else:
        assert last.startswith(f"NotImplementedError: [twin] VLLM_USE_V1=1 runs vLLM {release.version}'s V1 engine")


def test_a_configuration_error_comes_after_the_engine_process_started_before_0_8(release, src, models, tmp_path):
    """0.6.6.post1/0.7.3 start the engine process before the API process builds the configuration; 0.9.2 builds
    it first. Either way the API process ends with the error at once (exit 1, no RPC poll)."""
    started = time.monotonic()
    done = run(src, models["20b"], ["-tp", "5", "--dtype", "half"], tmp_path, {"VLLM_RPC_TIMEOUT": "30000000"})
    assert time.monotonic() - started < 3.0  # the poll would take 3 s at this time scale
    assert done.returncode == 1
    assert done.stderr.rstrip().splitlines()[-1] == ("ValueError: Total number of attention heads (48) must be "
                                                     "divisible by tensor parallel size (5).")
    assert "SpawnProcess" not in done.stderr
    assert ("Started engine process with PID" in done.stdout) == EXPECTED[release.version]["engine_first"]


def test_response_shapes_and_routes_are_the_releases(release, served):
    expected = EXPECTED[release.version]
    assert list(served.chat["choices"][0]["message"]) == expected["message"]
    for body in (served.chat, served.completion):
        assert ("kv_transfer_params" in body) == expected["kv_transfer_params"]
        assert body.get("kv_transfer_params") is None
    assert served.service == expected["service"]
    info = next(labels for name, labels, _ in harness.iter_metrics(served.metrics) if name == "vllm:cache_config_info")
    assert sorted(info) == sorted(expected["cache_config"])
    listed = {path for path in ("/ping", "/load") if f"Route: {path}, Methods:" in served.log}
    assert listed == {path for path, status in expected["service"].items() if status == 200}


def test_a_dead_engine_stops_the_server_by_watchdog_from_0_8_and_at_the_next_request_before(release, src, models,
                                                                                            tmp_path):
    """0.6.6.post1/0.7.3 have no launcher watchdog: a dead engine (a worker killed) leaves the server up until a
    request fails with the empty 500, which stops it (exit 0). 0.9.2 has 0.8.5.post1's 5-second watchdog
    (test_twin_085.py has its stream side): the server stops by itself, no request needed."""
    twin = harness.start(models["7b"], ["-tp", "2", "--dtype", "half", "--max-model-len", "2048", "--enforce-eager"],
                         harness.twin_env(tmp_path, time_scale=0.0001, src=src), tmp_path / "twin.log")
    try:
        worker = int(re.findall(r"VllmWorkerProcess pid=(\d+)", twin.log())[0])
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while "died, exit code: -9" not in twin.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        if EXPECTED[release.version]["brackets"]:
            assert twin.process.wait(timeout=20) == 0   # the watchdog, without any request
            return
        with pytest.raises(subprocess.TimeoutExpired):
            twin.process.wait(timeout=6.0)  # past 0.8.5.post1's 5-second watchdog
        status, _, body = harness.request(twin, "POST", "/v1/completions",
                                          {"model": twin.model, "prompt": "hi", "max_tokens": 4})
        assert (status, body) == (500, b"")
        assert twin.process.wait(timeout=20) == 0
    finally:
        twin.stop(signal.SIGKILL)


def test_dtype_auto_on_volta_follows_the_datas_bf16_fallback(release, src, models, tmp_path):
    """`--dtype auto` with a BF16 checkpoint on a V100: where the data says bf16_auto_fallback (0.9.2) the config
    falls back to float16 with vLLM's warning; before, the worker refuses BF16 at start."""
    done = run(src, models["7b-bf16"], ["--max-model-len", "2048"], tmp_path,
               {"VLLM_SIM_FAULT_FAIL_AFTER_LOAD": "stop here"})
    assert done.returncode == 1
    if release.raw["bf16_auto_fallback"]:
        assert "Your device 'Tesla V100-PCIE-32GB' (with compute capability 7.0) doesn't support torch.bfloat16. " \
               "Falling back to torch.float16 for compatibility." in done.stdout
        assert "dtype=torch.float16" in done.stdout
        assert "[twin fault VLLM_SIM_FAULT_FAIL_AFTER_LOAD] stop here" in done.stderr
    else:
        assert "Falling back to torch.float16" not in done.stdout and "dtype=torch.bfloat16" in done.stdout
        assert "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0." in done.stderr


# --------------------------------------------------------------------------- the wheel build's checks

def test_the_build_refuses_a_metric_the_twin_cannot_simulate_for_the_release(data):
    entry = data.release("0.8.5.post1")
    for version, name in (("0.9.2", "vllm:num_requests_swapped"), ("0.7.3", "vllm:avg_prompt_throughput_toks_per_s"),
                          ("0.8.5.post1", "vllm:kv_cache_usage_perc")):
        fake = SimpleNamespace(raw=entry.raw, metrics=list(entry.metrics) + [name])
        with pytest.raises(SystemExit, match=f"the twin cannot simulate {name} for vLLM {version}"):
            build_wheelhouse.check_behaviour(version, fake)
    with pytest.raises(SystemExit, match="the twin has no behaviour for vLLM 0.10.1.1"):
        build_wheelhouse.check_behaviour("0.10.1.1", data.release("0.10.1.1"))
