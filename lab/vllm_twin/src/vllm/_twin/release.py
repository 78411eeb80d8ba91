"""Which vLLM release the twin simulates, fixed when its wheel is built.

lab/vllm_twin/build_wheelhouse.py builds one wheel per release from this one code base and writes
`vllm/_twin/release.json` into it: the release, the wheel's version (`<release>+sim`), the upstream commit
id, the behaviour switches below, the release's data and, for releases whose parser is table-driven, the CLI
table of data/vllm-releases.yml. A source checkout has no release.json and simulates 0.5.4 (what the twin was
first written for; tests/unit/test_twin_*.py run it from lab/vllm_twin/src). Nothing at run time (no
environment variable, no flag) changes the release.

Two parts: `Behaviour`, one row per release, is what the data cannot say (wording, order, source locations:
code, each switch with its upstream source); `ReleaseData` is copied from the release's entry of
data/vllm-releases.yml when the wheel is built (metric names, KV sizing family, head sizes, quantization
minimums, swap-space limits, ...), so no per-release table here repeats the data; only the checkout's
release has a hand-written copy (CHECKOUT_DATA), which the build checks against the data.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, TypeVar

RELEASE_FILE = Path(__file__).resolve().with_name("release.json")
CHECKOUT_RELEASE = "0.5.4"
T = TypeVar("T")


@dataclass(frozen=True)
class Behaviour:
    """How one release behaves where the lab can see it and data/vllm-releases.yml cannot say it: code, one row
    per release. Each field names its upstream source; `sources` holds the `[file.py:N]` of the log lines
    whose location moved between releases (the others keep 0.8.5.post1's, README.md 'APPROXIMATIONS')."""

    # The parser: "handwritten" (vllm/engine/arg_utils.py + cli_args.py of the twin, 0.5.4) or "table"
    # (argparse calls made from release.json's CLI table, vllm/_twin/cli_table.py).
    parser: str
    # Log lines `LEVEL MM-DD HH:MM:SS [file.py:N] msg` (v0.8.5.post1:vllm/logger.py:22-23) instead of
    # `LEVEL MM-DD HH:MM:SS file.py:N] msg` (v0.5.4, v0.6.6.post1:vllm/logger.py:20-21, v0.7.3:vllm/logger.py:22-23).
    log_brackets: bool
    # The metric families the release's vllm/engine/metrics.py defines and their buckets (vllm/_twin/metrics.py
    # ERAS, bucket_bounds): "0.5.4", "0.6" (0.6.6.post1), "0.7" (0.7.3: 0.6's without the avg_* gauges) or "0.8"
    # (0.8.5.post1, 0.9.2). Which of them are served is the data's `metrics:` list.
    metrics_era: str
    # Engine start-up failure in the default mode: "hang" (0.5.4, #7213) or "exit" (PR #7217: the API
    # process gives up at its next RPC poll, v0.8.5.post1:vllm/entrypoints/openai/api_server.py:262-271).
    engine_start_failure: str
    # Where the configuration is built in the default mode: "engine" (0.5.4: only in the engine's RPC
    # process), "api-first" (create_engine_config in the API process before the engine process starts,
    # v0.8.5.post1:vllm/entrypoints/openai/api_server.py:164-166, v0.9.2:...:179-180) or "engine-first" (the
    # engine process is started, then the API process builds the same configuration and fails with it,
    # v0.7.3:vllm/entrypoints/openai/api_server.py:202-221, v0.6.6.post1:...:192-211).
    config_order: str
    # V0/V1 choice: "" (0.5.4 has V0 only), "opt-in" (VLLM_USE_V1 defaults to 0: V1 only when asked,
    # v0.6.6.post1:vllm/envs.py:460-461, v0.7.3:vllm/envs.py:503-504), "0.8" (VLLM_USE_V1 unset tries V1 and
    # falls back, v0.8.5.post1:vllm/engine/arg_utils.py:1106-1116, oracle :1292-1499, _raise_or_fallback
    # :1649-1658) or "0.9" (the same, but tensorizer loads no longer fall back, v0.9.2:vllm/engine/
    # arg_utils.py:1074-1080, oracle :1306-1499, _raise_or_fallback :1726-1735).
    engine_oracle: str
    # SIGTERM in the default mode: "cut" (0.5.4: the engine process is terminated first, streams are cut)
    # or "stall" (0.6 on: the engine is stopped, open requests get nothing more and uvicorn waits for their
    # connections, v0.8.5.post1:vllm/entrypoints/launcher.py:60-79, api_server.py:278-292 and 1112-1115;
    # the same launcher in v0.6.6.post1:vllm/entrypoints/launcher.py:37-58 and v0.9.2:...:66-80).
    sigterm_default_mode: str
    # The launcher's 5-second watchdog that stops the server once the engine is dead (v0.8.5.post1:vllm/
    # entrypoints/launcher.py:82-107, v0.9.2 the same); 0.6.6.post1 and 0.7.3 stop only at the next failing
    # request (v0.7.3:vllm/entrypoints/launcher.py:66-107).
    engine_watchdog: bool
    # Prefix of chat completion ids: "chat-" (0.5.4) or "chatcmpl-" (v0.6.6.post1:vllm/entrypoints/openai/
    # serving_chat.py:184, v0.7.3 :200, v0.8.5.post1 :203-204, v0.9.2 :225).
    chat_id_prefix: str
    # The KV start-up line: "GPU" (`# GPU blocks: N, # CPU blocks: M`, v0.6.6.post1:vllm/executor/
    # gpu_executor.py:76 and distributed_gpu_executor.py:57) or "platform" (`# cuda blocks: ...`, the
    # platform's device_name, v0.7.3:vllm/executor/executor_base.py:111-113, v0.7.3:vllm/platforms/cuda.py:72).
    kv_blocks_device: str
    # `Maximum concurrency for L tokens per request: C.CCx` after the KV line (0.6.x on).
    kv_concurrency_line: bool
    # Worker memory profiling summary before the KV line (PR #10511, 0.6.5 on; the same words in
    # v0.6.6.post1, v0.7.3, v0.8.5.post1 and v0.9.2:vllm/worker/worker.py determine_num_available_blocks).
    memory_profiling_line: bool
    # The arguments line after `vLLM API server version`: "namespace" (`args: Namespace(...)`) or
    # "non-default" (`non-default args: {...}`, v0.9.2:vllm/entrypoints/openai/cli_args.py:319-325).
    args_line: str
    # The server's start line: "" (none, 0.5.4 and v0.6.6.post1:vllm/entrypoints/openai/api_server.py:711-762),
    # "on" (`Starting vLLM API server on URL`, v0.7.3 :958, v0.8.5.post1 :1090) or "indexed" (`Starting vLLM
    # API server 0 on URL`, v0.9.2:vllm/entrypoints/openai/api_server.py:1423, 1457).
    server_start_line: str
    # uvicorn binds and logs `Uvicorn running on ...` itself: serve_http gets no socket (v0.5.4,
    # v0.6.6.post1:vllm/entrypoints/launcher.py:18-35); from 0.7 the pre-bound socket is passed.
    uvicorn_running_line: bool
    # ChatMessage has `reasoning_content` (v0.7.3:vllm/entrypoints/openai/protocol.py:1211-1215; not in
    # v0.6.6.post1 :1131-1134).
    reasoning_content: bool
    # Chat and completion responses end with `kv_transfer_params: null` (v0.9.2:vllm/entrypoints/openai/
    # protocol.py:1242-1243, 1433-1434).
    kv_transfer_params: bool
    # Routes besides 0.5.4's: `/ping` (v0.7.3:vllm/entrypoints/openai/api_server.py:350) and `/load`
    # (v0.8.5.post1 :398).
    service_routes: Tuple[str, ...]
    # The engine's first line: `Initializing an LLM engine (vX) with config: ...` (v0.6.6.post1:vllm/engine/
    # llm_engine.py:234-235) or `Initializing a V0 LLM engine ...` (v0.7.3 :234-235, v0.9.2 :230-231).
    engine_init_words: str = "a V0 LLM engine"
    # CacheConfig's attributes in order: the labels of vllm:cache_config_info (metrics_info() is its __dict__).
    cache_config_fields: Tuple[str, ...] = ()
    sources: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ReleaseData:
    """The fields of the release's entry in data/vllm-releases.yml the twin follows. A wheel gets them from the
    data when it is built (build_wheelhouse.release_json); a checkout (0.5.4, no release.json) uses
    CHECKOUT_DATA, which the build checks against the data."""

    # vllm:* series in the default frontend-multiprocessing mode only from 0.5.5 on (#7188)
    metrics_need_disable_frontend_multiprocessing: bool
    kv_sizing: str                               # kv_sizing_by_engine.V0: module_utils/revive_kv.py's family
    paged_attention_head_sizes: Tuple[int, ...]  # PagedAttention head sizes of the xFormers backend on CC < 8.0
    quantization_min_cc: Dict[str, int]          # get_min_capability() x 10 per quantization method
    metrics: Tuple[str, ...]                     # the names /metrics serves (vllm/_twin/metrics.py FAMILIES)
    swap_space_limits: Dict[str, float]          # error_fraction / warn_fraction of host RAM (CacheConfig)
    chunked_prefill_auto_above: int              # V0 turns chunked prefill on above this max_model_len
    custom_all_reduce: Dict[str, Any]            # world_sizes, pcie_only_max_world_size
    bf16_auto_fallback: bool                     # `--dtype auto` takes float16 for a BF16 checkpoint on CC < 8.0


BEHAVIOURS: Dict[str, Behaviour] = {
    "0.5.4": Behaviour(
        parser="handwritten", log_brackets=False, metrics_era="0.5.4", engine_start_failure="hang",
        config_order="engine", engine_oracle="", sigterm_default_mode="cut", engine_watchdog=False,
        chat_id_prefix="chat-", kv_blocks_device="GPU", kv_concurrency_line=False, memory_profiling_line=False,
        args_line="namespace", server_start_line="", uvicorn_running_line=True, reasoning_content=False,
        kv_transfer_params=False, service_routes=(),
        # docs/facts/vllm-volta.md §4.1
        cache_config_fields=("block_size", "gpu_memory_utilization", "swap_space_bytes", "num_gpu_blocks_override",
                             "cache_dtype", "sliding_window", "enable_prefix_caching", "cpu_offload_gb",
                             "num_gpu_blocks", "num_cpu_blocks"),
        sources={"version": "api_server.py:339", "args": "api_server.py:340", "kv_blocks": "gpu_executor.py:102",
                 "kv_blocks_tp": "distributed_gpu_executor.py:56"}),
    "0.6.6.post1": Behaviour(
        parser="table", log_brackets=False, metrics_era="0.6", engine_start_failure="exit",
        config_order="engine-first", engine_oracle="opt-in", sigterm_default_mode="stall", engine_watchdog=False,
        chat_id_prefix="chatcmpl-", kv_blocks_device="GPU", kv_concurrency_line=True, memory_profiling_line=True,
        args_line="namespace", server_start_line="", uvicorn_running_line=True, reasoning_content=False,
        kv_transfer_params=False, service_routes=(), engine_init_words="an LLM engine",
        # v0.6.6.post1:vllm/config.py:981-997
        cache_config_fields=("block_size", "gpu_memory_utilization", "swap_space_bytes", "num_gpu_blocks_override",
                             "cache_dtype", "is_attention_free", "sliding_window", "enable_prefix_caching",
                             "cpu_offload_gb", "num_gpu_blocks", "num_cpu_blocks"),
        # v0.6.6.post1:vllm/entrypoints/openai/api_server.py:712-713, 199; worker/worker.py:241; engine/multiprocessing/
        # engine.py:267, 285, 366; entrypoints/logger.py:37; engine/arg_utils.py:1103, 1113;
        # executor/gpu_executor.py:76, 80; executor/distributed_gpu_executor.py:57, 61; entrypoints/launcher.py:19, 27
        sources={"engine_init": "llm_engine.py:234", "version": "api_server.py:712", "args": "api_server.py:713",
                 "engine_pid": "api_server.py:199", "upcasting": "config.py:2268", "downcasting": "config.py:2272",
                 "casting": "config.py:2276", "engine_exception": "engine.py:366",
                 "added_request": "engine.py:267", "aborted_request": "engine.py:285",
                 "received_request": "logger.py:37", "memory_profiling": "worker.py:241",
                 "chunked_auto": "arg_utils.py:1103", "long_context": "arg_utils.py:1113",
                 "kv_blocks": "gpu_executor.py:76", "kv_concurrency": "gpu_executor.py:80",
                 "kv_blocks_tp": "distributed_gpu_executor.py:57",
                 "kv_concurrency_tp": "distributed_gpu_executor.py:61", "routes": "launcher.py:19",
                 "route": "launcher.py:27"}),
    "0.7.3": Behaviour(
        parser="table", log_brackets=False, metrics_era="0.7", engine_start_failure="exit",
        config_order="engine-first", engine_oracle="opt-in", sigterm_default_mode="stall", engine_watchdog=False,
        chat_id_prefix="chatcmpl-", kv_blocks_device="platform", kv_concurrency_line=True,
        memory_profiling_line=True, args_line="namespace", server_start_line="on", uvicorn_running_line=False,
        reasoning_content=True, kv_transfer_params=False, service_routes=("/ping",),
        # v0.7.3:vllm/config.py:1059-1075
        cache_config_fields=("block_size", "gpu_memory_utilization", "swap_space_bytes", "num_gpu_blocks_override",
                             "cache_dtype", "is_attention_free", "sliding_window", "enable_prefix_caching",
                             "cpu_offload_gb", "calculate_kv_scales", "num_gpu_blocks", "num_cpu_blocks"),
        # v0.7.3:vllm/entrypoints/openai/api_server.py:912-913, 209, 958; worker/worker.py:267; engine/multiprocessing/
        # engine.py:280, 298, 400; entrypoints/logger.py:39; engine/arg_utils.py:1187, 1197;
        # executor/executor_base.py:111, 116; entrypoints/launcher.py:23, 31
        sources={"engine_init": "llm_engine.py:234", "version": "api_server.py:912", "args": "api_server.py:913",
                 "engine_pid": "api_server.py:209", "server_start": "api_server.py:958",
                 "upcasting": "config.py:2440", "downcasting": "config.py:2444", "casting": "config.py:2448",
                 "engine_exception": "engine.py:400", "added_request": "engine.py:280",
                 "aborted_request": "engine.py:298", "received_request": "logger.py:39",
                 "memory_profiling": "worker.py:267", "chunked_auto": "arg_utils.py:1187",
                 "long_context": "arg_utils.py:1197", "kv_blocks": "executor_base.py:111",
                 "kv_concurrency": "executor_base.py:116", "routes": "launcher.py:23", "route": "launcher.py:31"}),
    "0.8.5.post1": Behaviour(
        parser="table", log_brackets=True, metrics_era="0.8", engine_start_failure="exit",
        config_order="api-first", engine_oracle="0.8", sigterm_default_mode="stall", engine_watchdog=True,
        chat_id_prefix="chatcmpl-", kv_blocks_device="platform", kv_concurrency_line=True,
        memory_profiling_line=True, args_line="namespace", server_start_line="on", uvicorn_running_line=False,
        reasoning_content=True, kv_transfer_params=False, service_routes=("/ping", "/load"),
        # v0.8.5.post1:vllm/config.py:1297-1386: the dataclass fields in order, then swap_space_bytes (__post_init__)
        cache_config_fields=("block_size", "gpu_memory_utilization", "swap_space", "cache_dtype", "is_attention_free",
                             "num_gpu_blocks_override", "sliding_window", "enable_prefix_caching",
                             "prefix_caching_hash_algo", "cpu_offload_gb", "calculate_kv_scales", "num_gpu_blocks",
                             "num_cpu_blocks", "swap_space_bytes"),
        # v0.8.5.post1:vllm/entrypoints/openai/api_server.py:1043-1044, 246, 1090; worker/worker.py:287;
        # engine/multiprocessing/engine.py:330;
        # executor/executor_base.py:112, 117; engine/arg_utils.py:1658
        sources={"version": "api_server.py:1043", "args": "api_server.py:1044", "engine_pid": "api_server.py:246",
                 "server_start": "api_server.py:1090", "aborted_request": "engine.py:330",
                 "memory_profiling": "worker.py:287", "kv_blocks": "executor_base.py:112",
                 "kv_concurrency": "executor_base.py:117", "v1_fallback": "arg_utils.py:1658"}),
    "0.9.2": Behaviour(
        parser="table", log_brackets=True, metrics_era="0.8", engine_start_failure="exit",
        config_order="api-first", engine_oracle="0.9", sigterm_default_mode="stall", engine_watchdog=True,
        chat_id_prefix="chatcmpl-", kv_blocks_device="platform", kv_concurrency_line=True,
        memory_profiling_line=True, args_line="non-default", server_start_line="indexed",
        uvicorn_running_line=False, reasoning_content=True, kv_transfer_params=True,
        service_routes=("/ping", "/load"),
        # v0.9.2:vllm/config.py:1483-1566: 0.8.5.post1's and cpu_kvcache_space_bytes
        cache_config_fields=("block_size", "gpu_memory_utilization", "swap_space", "cache_dtype", "is_attention_free",
                             "num_gpu_blocks_override", "sliding_window", "enable_prefix_caching",
                             "prefix_caching_hash_algo", "cpu_offload_gb", "calculate_kv_scales",
                             "cpu_kvcache_space_bytes", "num_gpu_blocks", "num_cpu_blocks", "swap_space_bytes"),
        # v0.9.2:vllm/entrypoints/openai/api_server.py:1395, 268, 1457; entrypoints/openai/cli_args.py:325;
        # engine/multiprocessing/engine.py:317, 337, 458; entrypoints/logger.py:43; engine/arg_utils.py:1531, 1542;
        # worker/worker.py:294; executor/executor_base.py:113, 118; engine/arg_utils.py:1735; launcher.py:29, 37
        sources={"engine_init": "llm_engine.py:230", "version": "api_server.py:1395", "args": "cli_args.py:325",
                 "engine_pid": "api_server.py:268", "server_start": "api_server.py:1457",
                 "upcasting": "config.py:3365", "downcasting": "config.py:3368", "casting": "config.py:3371",
                 "engine_exception": "engine.py:458", "added_request": "engine.py:317",
                 "aborted_request": "engine.py:337", "received_request": "logger.py:43",
                 "memory_profiling": "worker.py:294", "chunked_auto": "arg_utils.py:1531",
                 "long_context": "arg_utils.py:1542", "kv_blocks": "executor_base.py:113",
                 "kv_concurrency": "executor_base.py:118", "v1_fallback": "arg_utils.py:1735",
                 "routes": "launcher.py:29", "route": "launcher.py:37"}),
}

# The checkout's release data (0.5.4 runs from lab/vllm_twin/src without a release.json); the wheel build
# checks it equals data/vllm-releases.yml (build_wheelhouse.check_behaviour).
CHECKOUT_DATA = ReleaseData(
    metrics_need_disable_frontend_multiprocessing=True, kv_sizing="v0-mem-get-info",
    paged_attention_head_sizes=(64, 80, 96, 112, 120, 128, 192, 256),
    quantization_min_cc={
        "gptq": 60, "awq": 75, "gptq_marlin": 80, "awq_marlin": 80, "marlin": 80, "gptq_marlin_24": 80,
        "fp8": 80, "fbgemm_fp8": 80, "qqq": 80, "bitsandbytes": 70, "squeezellm": 70,
        "compressed-tensors": 70, "aqlm": 60, "deepspeedfp": 60},
    metrics=(
        "vllm:cache_config_info", "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:num_requests_swapped", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc",
        "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
        "vllm:request_params_best_of", "vllm:request_params_n", "vllm:request_success_total",
        "vllm:spec_decode_draft_acceptance_rate", "vllm:spec_decode_efficiency",
        "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_emitted_tokens_total", "vllm:avg_prompt_throughput_toks_per_s",
        "vllm:avg_generation_throughput_toks_per_s"),
    swap_space_limits={"error_fraction": 0.7, "warn_fraction": 0.4}, chunked_prefill_auto_above=32768,
    custom_all_reduce={"world_sizes": [2, 4, 6, 8], "pcie_only_max_world_size": 2}, bf16_auto_fallback=False)

# The upstream commit each release was built from (what `vllm.__commit__` says). 0.5.4: its wheel's
# vllm/commit_id.py. The later wheels carry no commit id (vllm/version.py reads setuptools-scm's _version.py
# only: v0.6.6.post1:vllm/version.py:1-11, v0.7.3, v0.8.5.post1, v0.9.2 the same), so none is claimed.
COMMITS: Dict[str, Optional[str]] = {"0.5.4": "4db5176d9758b720b05460c50ace3c01026eb158"}


@dataclass(frozen=True)
class Release:
    release: str                      # the vLLM release simulated, e.g. "0.8.5.post1"
    version: str                      # vllm.__version__ of the twin: "<release>+sim"
    commit: Optional[str]
    behaviour: Behaviour
    data: ReleaseData
    arguments: List[Dict[str, Any]]   # the CLI table (release.json "cli"), empty for the handwritten parser
    cli_complete: bool

    @property
    def legacy(self) -> bool:
        """0.5.4 (the release the twin started from) rather than a later one."""
        return self.release == "0.5.4"

    @property
    def metrics(self) -> List[str]:
        return list(self.data.metrics)

    def source(self, key: str, default: str) -> str:
        """The `file.py:N` of a log line in this release (Behaviour.sources), else `default` (0.8.5.post1's)."""
        return self.behaviour.sources.get(key, default)

    def as_json(self) -> Dict[str, Any]:
        data = asdict(self.data)
        data["paged_attention_head_sizes"] = list(self.data.paged_attention_head_sizes)
        data["metrics"] = list(self.data.metrics)
        return {"release": self.release, "version": self.version, "commit": self.commit,
                "behaviour": asdict(self.behaviour), "data": data,
                "cli": {"complete": self.cli_complete, "arguments": self.arguments}}


def make(release: str, arguments: Optional[List[Dict[str, Any]]] = None, cli_complete: bool = False,
         data: Optional[ReleaseData] = None) -> Release:
    if release not in BEHAVIOURS:
        raise ValueError(f"the twin simulates {', '.join(BEHAVIOURS)}, not {release}")
    behaviour = BEHAVIOURS[release]
    if data is None:
        if release != CHECKOUT_RELEASE:
            raise ValueError(f"{release}: its release data comes from data/vllm-releases.yml, and none was given")
        data = CHECKOUT_DATA
    if behaviour.parser == "table" and not arguments:
        raise ValueError(f"{release}: its parser is built from the CLI table, and none was given")
    return Release(release=release, version=f"{release}+sim", commit=COMMITS.get(release), behaviour=behaviour,
                   data=data, arguments=list(arguments or []), cli_complete=cli_complete)


def data_from(raw: Dict[str, Any]) -> ReleaseData:
    return ReleaseData(
        metrics_need_disable_frontend_multiprocessing=bool(raw["metrics_need_disable_frontend_multiprocessing"]),
        kv_sizing=str(raw["kv_sizing"]), paged_attention_head_sizes=tuple(raw["paged_attention_head_sizes"]),
        quantization_min_cc=dict(raw["quantization_min_cc"]), metrics=tuple(raw["metrics"]),
        swap_space_limits={k: float(v) for k, v in raw["swap_space_limits"].items()},
        chunked_prefill_auto_above=int(raw["chunked_prefill_auto_above"]),
        custom_all_reduce={"world_sizes": list(raw["custom_all_reduce"]["world_sizes"]),
                           "pcie_only_max_world_size": int(raw["custom_all_reduce"]["pcie_only_max_world_size"])},
        bf16_auto_fallback=bool(raw["bf16_auto_fallback"]))


def from_json(data: Dict[str, Any]) -> Release:
    behaviour = dict(data["behaviour"], service_routes=tuple(data["behaviour"]["service_routes"]),
                     cache_config_fields=tuple(data["behaviour"]["cache_config_fields"]))
    return Release(release=data["release"], version=data["version"], commit=data["commit"],
                   behaviour=Behaviour(**behaviour), data=data_from(data["data"]),
                   arguments=list(data["cli"]["arguments"]), cli_complete=bool(data["cli"]["complete"]))


_current: Optional[Release] = None


def current() -> Release:
    """The release of this installation: release.json inside a built wheel, else 0.5.4 (a checkout)."""
    global _current
    if _current is None:
        if RELEASE_FILE.is_file():
            _current = from_json(json.loads(RELEASE_FILE.read_text(encoding="utf-8")))
        else:
            _current = make(CHECKOUT_RELEASE)
    return _current


def pick(v054: T, v085: T) -> T:
    """The 0.5.4 or the later releases' variant of a message, source location or value (0.8.5.post1's where
    a later release differs and Behaviour does not say so)."""
    return v054 if current().legacy else v085
