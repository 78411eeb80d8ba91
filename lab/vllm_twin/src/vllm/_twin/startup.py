"""Start-up of the twin: vLLM 0.5.4's configuration checks, worker start, model load, KV sizing and
CUDA-graph capture, in 0.5.4's order, with its messages and exception types.

Sources (sections of docs/facts/vllm-volta.md, and the 0.5.4 code they cite):
* EngineArgs.create_engine_config: ModelConfig (dtype §1.4, max_model_len §2.1, quantization §7.3),
  CacheConfig (`GPU memory utilization must be less than 1.0`), ParallelConfig (mp backend; more GPUs
  than visible: Ray, if it imports), SchedulerConfig (§3.5), then EngineConfig's verify_with_parallel_config
  (heads divisible by TP, swap space §3.4).
* The Ray executor (0.5.4, backend ray): a real Ray cluster, placement group and one actor per GPU
  (vllm/_twin/ray_executor.py, docs/facts/multi-node.md §1.3), between the configuration and the engine.
* Pipeline parallelism: the layers split per stage, each stage's weights, and the KV cache of the worker with
  the fewest blocks, divided among the PP virtual engines (module_utils/revive_kv.py's stage split, the planner's;
  docs/facts/multi-node.md §1.4).
* Worker.init_device: the BF16 check (§1.4). load_model: quantization capability (§7.3), xFormers'
  head sizes and logit soft-capping (§1.3), then the weights (torch's OOM message when they do not fit).
* determine_num_available_blocks: module_utils/revive_kv.py (0.5.4's algorithm, §3.1-§3.4), logged as
  `# GPU blocks: N, # CPU blocks: M`; raise_if_cache_size_invalid (§3.1 step 5).
* capture_model (§1.5, §7.2): decode CUDA graphs after the KV cache, outside the utilisation budget;
  no room left means torch's OOM, as in the field notes' first attempt.
Times (process start, NCCL, weight load proportional to bytes, profiling, capture) come from perf.py
and pass through `wait`, which applies the time scale.

0.8.5.post1 (vllm/_twin/release.py) keeps the same checks with its own messages and source locations
(cited at each), builds the configuration in the API process (its failures end that process; the V0/V1
choice of arg_utils.py happens there), and sizes the KV cache with revive_kv's `v0-per-instance` family
(PR #10511), logging the worker's memory-profiling summary, `# cuda blocks` and the maximum concurrency.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from vllm._revive import module_utils
from vllm._twin import gpus as gpu_mod
from vllm._twin import perf, vlog
from vllm._twin.engine import EngineConfig
from vllm._twin.release import current, pick
from vllm._twin.settings import Settings

GiB = 1 << 30
MiB = 1 << 20

OPTIMIZED_QUANTIZATION = ("fp8", "marlin", "gptq_marlin_24", "gptq_marlin", "awq_marlin", "fbgemm_fp8",
                          "compressed_tensors", "compressed-tensors")
# config.py:32 _PP_SUPPORTED_MODELS in 0.5.4
PP_SUPPORTED_ARCHITECTURES = ["AquilaModel", "AquilaForCausalLM", "DeepseekV2ForCausalLM", "InternLMForCausalLM",
                              "LlamaForCausalLM", "LLaMAForCausalLM", "MistralForCausalLM", "Phi3ForCausalLM",
                              "GPT2LMHeadModel", "MixtralForCausalLM", "NemotronForCausalLM", "Qwen2ForCausalLM",
                              "Qwen2MoeForCausalLM"]
MAX_LEN_KEYS = ["max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_sequence_length", "max_seq_length", "seq_len"]
TORCH_DTYPES = {"float16": "torch.float16", "bfloat16": "torch.bfloat16", "float32": "torch.float32"}
ARG_DTYPES = {"half": "float16", "float16": "float16", "float": "float32", "float32": "float32",
              "bfloat16": "bfloat16"}
KV_SIZING_DTYPE = {"float16": "half", "bfloat16": "bfloat16", "float32": "float32"}
V085_DEFAULT_BATCHED_TOKENS = 2048  # v0.8.5.post1:vllm/config.py:68 _DEFAULT_MAX_NUM_BATCHED_TOKENS
PG_WAIT_TIMEOUT_SECONDS = 1800      # v0.8.5.post1:vllm/executor/ray_utils.py:24
# _set_default_args_v0's warnings: chunked prefill turned on above 32K, a long context without it
# (v0.6.6.post1:vllm/engine/arg_utils.py:1103-1117 and v0.7.3 :1187-1201; v0.8.5.post1 :1525-1539, v0.9.2 :1531-1546)
LONG_CONTEXT_WORDS = {
    "0.6": ("Chunked prefill is enabled by default for models with max_model_len > 32K. Currently, chunked prefill "
            "might not work with some features or models. If you encounter any issues, please disable chunked "
            "prefill by setting --enable-chunked-prefill=False.",
            "The model has a long context length ({}). This may cause OOM errors during the initial memory profiling "
            "phase, or result in low performance due to small KV cache space. Consider setting --max-model-len to a "
            "smaller value."),
    "0.8": ("Chunked prefill is enabled by default for models with max_model_len > 32K. Chunked prefill might not "
            "work with some features or models. If you encounter any issues, please disable by launching with "
            "--enable-chunked-prefill=False.",
            "The model has a long context length ({}). This may causeOOM during the initial memory profiling phase, "
            "or result in low performance due to small KV cache size. Consider setting --max-model-len to a smaller "
            "value."),
}


class StartupFailure(Exception):
    """A start-up error as 0.5.4 raises it: `exc_type: message` is the last line of its traceback.

    `in_engine` is True for errors raised while building the engine (in the RPC engine process in
    0.5.4's default mode), False for errors of the API process itself.
    """

    def __init__(self, exc_type: str, message: str, in_engine: bool = True):
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message
        self.in_engine = in_engine


@dataclass
class EngineSetup:
    model_path: str
    served_model_names: List[str]
    facts: Dict[str, Any]
    dtype: str                      # float16 / bfloat16 / float32
    max_model_len: int
    engine_config: EngineConfig                 # one virtual engine's
    perf_model: perf.StepModel
    group: List[gpu_mod.Gpu]
    transport: perf.Transport
    kv: Any
    cache_config_info: Dict[str, object]
    block_bytes: int
    worker_count: int
    timings: Dict[str, float] = field(default_factory=dict)
    virtual_engines: int = 1                    # one scheduler per pipeline stage, each with 1/PP of the blocks
    cache_blocks: Optional[Tuple[int, int]] = None  # the whole cache's (GPU, CPU) blocks, as 0.5.4 logs them
    ray_executor: Any = None                    # vllm/_twin/ray_executor.RayExecutor on the Ray path


def oom_message(tried_bytes: int, gpu_index: int, total: int, free: int, process_used: int,
                torch_allocated: int) -> str:
    """torch 2.4's CUDA OOM text (torch/csrc/cuda/CUDACachingAllocator.cpp)."""
    return (f"CUDA out of memory. Tried to allocate {_mem(tried_bytes)}. GPU {gpu_index} has a total capacity of "
            f"{_mem(total)} of which {_mem(free)} is free. Including non-PyTorch memory, this process has "
            f"{_mem(process_used)} memory in use. Of the allocated memory {_mem(torch_allocated)} is allocated by "
            f"PyTorch, and {_mem(2 * MiB)} is reserved by PyTorch but unallocated. If reserved but unallocated "
            "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
            "See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def _mem(value: int) -> str:
    """torch's format_size (CUDACachingAllocator.cpp): GiB above 1 GiB, else MiB, two decimals."""
    if value > GiB:
        return f"{value / GiB:.2f} GiB"
    return f"{value / MiB:.2f} MiB"


def inspect_model_dir(model: str) -> Dict[str, Any]:
    """Model facts (module_utils/revive_model.py). The API process reads the config first (0.5.4:
    model_is_embedding; 0.8.5.post1: create_model_config), so a path that does not exist fails there, as
    transformers (0.5.4) or vLLM's get_config (0.8.5.post1) words it."""
    revive_model = module_utils("revive_model")
    if not current().legacy and not os.path.isfile(os.path.join(model, "config.json")):
        # get_config (v0.8.5.post1:vllm/transformers_utils/config.py:273-300), in create_model_config
        raise StartupFailure(
            "ValueError", f"Invalid repository ID or local directory specified: '{model}'.\nPlease verify the "
            "following requirements:\n1. Provide a valid Hugging Face repository ID.\n2. Specify a local directory "
            "that contains a recognized configuration file.\n   - For Hugging Face models: ensure the presence of a "
            "'config.json'.\n   - For Mistral models: ensure the presence of a 'params.json'.\n", in_engine=False)
    if not os.path.exists(model):
        raise StartupFailure(
            "OSError", f"Incorrect path_or_model_id: '{model}'. Please provide either the path to a local folder "
            "or the repo_id of a model on the Hub.", in_engine=False)
    try:
        return revive_model.inspect_model(model)
    except revive_model.ModelInspectError as exc:
        raise StartupFailure("OSError", str(exc), in_engine=False) from None


def resolve_dtype(facts: Dict[str, Any], requested: str, gpu: Optional[gpu_mod.Gpu] = None) -> str:
    """_get_and_verify_dtype (config.py:1407): `auto` keeps the checkpoint dtype (fp32 -> fp16); where the release
    data says `bf16_auto_fallback` (0.9 on), `auto` takes the first dtype the GPU supports instead of one it
    does not (v0.9.2:vllm/config.py:3285-3328, platforms/cuda.py:62-72: no bfloat16 below CC 8.0)."""
    release = current()
    config_dtype = facts.get("torch_dtype") or "float32"
    config_dtype = ARG_DTYPES.get(config_dtype, config_dtype)
    requested = requested.lower()
    if requested == "auto" and release.data.bf16_auto_fallback and gpu is not None:
        supported = ["bfloat16", "float16", "float32"] if gpu.compute_capability[0] >= 8 else ["float16", "float32"]
        chosen = supported[0] if config_dtype == "float32" else config_dtype
        if chosen not in supported:
            major, minor = gpu.compute_capability
            vlog.warning("config.py:3320", f"Your device '{gpu.name}' (with compute capability {major}.{minor}) "
                         f"doesn't support {TORCH_DTYPES[chosen]}. Falling back to {TORCH_DTYPES[supported[0]]} "
                         "for compatibility.")
            chosen = supported[0]
    elif requested == "auto":
        if config_dtype == "float32":
            # 0.5.4 keeps Gemma-2 in bfloat16; 0.8.5.post1 takes float16 for every float32 checkpoint
            # (v0.8.5.post1:vllm/config.py:2903-2906)
            return "bfloat16" if facts.get("model_type") == "gemma2" and current().legacy else "float16"
        chosen = config_dtype
    else:
        chosen = ARG_DTYPES[requested]
    if chosen != config_dtype:
        if chosen == "float32":
            vlog.info(release.source("upcasting", pick("config.py:1446", "config.py:2964")),
                      f"Upcasting {TORCH_DTYPES[config_dtype]} to {TORCH_DTYPES[chosen]}.")
        elif config_dtype == "float32":
            vlog.info(release.source("downcasting", pick("config.py:1450", "config.py:2968")),
                      f"Downcasting {TORCH_DTYPES[config_dtype]} to {TORCH_DTYPES[chosen]}.")
        else:
            vlog.warning(release.source("casting", pick("config.py:1454", "config.py:2972")),
                         f"Casting {TORCH_DTYPES[config_dtype]} to {TORCH_DTYPES[chosen]}.")
    return chosen


def resolve_max_model_len(facts: Dict[str, Any], requested: Optional[int], environ: Dict[str, str]) -> int:
    """_get_and_verify_max_len (config.py:1459), the number from revive_model.derived_max_model_len."""
    revive_model = module_utils("revive_model")
    config = revive_model.load_json_file(facts["config_file"], "config")
    derived = revive_model.derived_max_model_len(config)
    key = None
    smallest = float("inf")
    for name in MAX_LEN_KEYS:
        value = config.get(name)
        if isinstance(value, (int, float)) and value < smallest:
            smallest, key = value, name
    if derived is None:
        if requested is not None:
            return requested
        vlog.warning(pick("config.py:1507", "config.py:3041"), "The model's config.json does not contain any of the "
                     "following keys to "
                     f"determine the original maximum length of the model: {MAX_LEN_KEYS}. Assuming the model's "
                     "maximum length is 2048.")
        derived = 2048
    if requested is None:
        return int(derived)
    if requested > derived:
        model_max_length = config.get("model_max_length")
        if model_max_length is not None and requested <= model_max_length:
            return requested
        derived_text = float(derived) if isinstance(derived, float) else derived
        msg = (f"User-specified max_model_len ({requested}) is greater than the derived max_model_len "
               f"({key}={derived_text} or model_max_length={model_max_length} in model's config.json). This may "
               "lead to incorrect model outputs or CUDA errors.")
        if environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").lower() in ("1", "true"):
            vlog.warning(pick("config.py:1567", "config.py:3102"),
                         f"{msg} Make sure the value is correct and within the model context size.")
        else:
            raise StartupFailure("ValueError", f"{msg} To allow overriding this maximum, set the env var "
                                 "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    return int(requested)


def resolve_quantization(facts: Dict[str, Any], requested: Optional[str]) -> Optional[str]:
    """ModelConfig._verify_quantization (config.py:207)."""
    requested = requested.lower() if requested else None
    checkpoint = facts.get("quantization")
    method = checkpoint.get("method") if isinstance(checkpoint, dict) else None
    if method:
        method = str(method).lower()
        if requested is None:
            requested = method
        elif requested != method:
            raise StartupFailure(
                "ValueError", f"Quantization method specified in the model config ({method}) does not match the "
                f"quantization method specified in the `quantization` argument ({requested}).")
    if requested is not None:
        # the release's methods and their minimum capability (vllm/_twin/release.py quantization_min_cc)
        methods = current().data.quantization_min_cc
        if requested not in methods:
            raise StartupFailure("ValueError", f"Unknown quantization method: {requested}. Must be one of "
                                 f"{list(methods)}.")
        if requested not in OPTIMIZED_QUANTIZATION:
            vlog.warning(pick("config.py:254", "config.py:830"),
                         f"{requested} quantization is not fully optimized yet. The speed can be slower than "
                         "non-quantized models.")
    return requested


def build_engine(args, facts: Dict[str, Any], environ: Dict[str, str], settings: Settings,
                 wait: Callable[[float], None], worker_prefixes: Callable[[int], List[str]],
                 engine_started: Optional[Callable[[], None]] = None) -> EngineSetup:
    """Everything between the engine's creation and a ready engine.

    0.5.4 runs all of it in the engine (its RPC process in the default mode). 0.8.5.post1 builds the
    configuration in the API process (`create_engine_config`, v0.8.5.post1:vllm/entrypoints/openai/
    api_server.py:164-166) and starts the engine process afterwards (:228-246): `engine_started` is called
    at that point, and a failure before it is the API process's own (`in_engine` False).
    """
    release = current()
    engine_first = release.behaviour.config_order == "engine-first"
    if engine_first and engine_started is not None:
        # 0.6.6.post1/0.7.3 start the engine process, then build the same configuration in the API process,
        # which fails there first (v0.7.3:vllm/entrypoints/openai/api_server.py:202-221)
        engine_started()
    try:
        config = _configure(args, facts, environ)
    except StartupFailure as failure:
        failure.in_engine = release.legacy
        raise
    if not engine_first and engine_started is not None:
        engine_started()
    ray_sessions: List[Any] = []
    try:
        return _start_engine(args, facts, environ, settings, wait, worker_prefixes, config, ray_sessions)
    except StartupFailure:
        # 0.5.4's engine process ends with its error: Ray frees its actors and placement group, a private
        # instance stops (the twin's API process may stay up: #7213)
        for session in ray_sessions:
            session.shutdown()
        raise


@dataclass
class _Config:
    """What create_engine_config decided (the engine process's input)."""

    served: List[str]
    dtype: str
    max_model_len: int
    quantization: Optional[str]
    visible: List[gpu_mod.Gpu]
    pynvml: Any
    world: int
    backend: Optional[str]
    chunked: bool
    max_num_batched_tokens: int
    max_num_seqs: int


def _configure(args, facts: Dict[str, Any], environ: Dict[str, str]) -> _Config:
    """create_engine_config: ModelConfig, the V0/V1 choice, CacheConfig, ParallelConfig, SchedulerConfig,
    then the checks across them (heads divisible by TP, swap space, quantization capability)."""
    release = current()
    revive_kv = module_utils("revive_kv")
    served = list(args.served_model_name) if args.served_model_name else [args.model]
    visible: List[gpu_mod.Gpu] = []
    pynvml: Any = None
    if not release.legacy:
        # DeviceConfig comes first in 0.8.5.post1 (arg_utils.py:1098, config.py:2117-2122)
        visible, pynvml = discover_gpus(environ)
    dtype = resolve_dtype(facts, args.dtype, visible[0] if visible else None)
    if not release.legacy:
        vlog.info("config.py:717", "This model supports multiple tasks: {'reward', 'embed', 'classify', "
                  "'generate', 'score'}. Defaulting to 'generate'.")
    max_model_len = resolve_max_model_len(facts, args.max_model_len, environ)
    quantization = resolve_quantization(facts, args.quantization)
    max_num_seqs = args.max_num_seqs
    chunked = args.enable_chunked_prefill
    if release.behaviour.engine_oracle == "opt-in":
        opt_in_v1(environ)
    elif not release.legacy:
        engine_choice(args, visible, environ)
    if not release.legacy:
        # _set_default_args_v0 (v0.8.5.post1:vllm/engine/arg_utils.py:1501-1563; the same defaults in
        # v0.6.6.post1 :1090-1117 and v0.7.3 :1173-1201, worded as 0.6 words them)
        words = LONG_CONTEXT_WORDS["0.6" if release.behaviour.engine_oracle == "opt-in" else "0.8"]
        if chunked is None and max_model_len > release.data.chunked_prefill_auto_above and \
                not facts.get("sliding_window"):
            chunked = True
            vlog.warning(release.source("chunked_auto", "arg_utils.py:1525"), words[0])
        chunked = bool(chunked)
        if not chunked and max_model_len > release.data.chunked_prefill_auto_above:
            vlog.warning(release.source("long_context", "arg_utils.py:1536"), words[1].format(max_model_len))
        if max_num_seqs is None:
            max_num_seqs = 256  # V0's default (arg_utils.py:1561-1563; v0.7.3 :224)
    if args.gpu_memory_utilization > 1.0:
        raise StartupFailure("ValueError", "GPU memory utilization must be less than 1.0. Got "
                             f"{args.gpu_memory_utilization}.")
    if release.legacy:
        visible, pynvml = discover_gpus(environ)
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    backend = args.distributed_executor_backend
    if backend is None and world > 1:
        backend = "mp"
        if len(visible) < world:
            if release.legacy:
                from vllm._twin import ray_executor
                ray_executor.import_ray(defaulted=True)  # v0.5.4 vllm/config.py:706-716
            # 0.8.5.post1's twin keeps its simulated Ray path (Requires-Dist ray[cgraph] brings Ray)
            backend = "ray"
        vlog.info(pick("config.py:729", "config.py:1770"), f"Defaulting to use {backend} for distributed inference")
    elif release.legacy and backend == "ray":
        from vllm._twin import ray_executor
        ray_executor.import_ray(defaulted=False)  # ParallelConfig._verify_args (v0.5.4 vllm/config.py:753-755)
    if chunked is None:
        chunked = max_model_len > release.data.chunked_prefill_auto_above
    max_num_batched_tokens = args.max_num_batched_tokens
    if max_num_batched_tokens is None:
        if release.legacy:
            max_num_batched_tokens = revive_kv.default_max_num_batched_tokens(max_model_len, "v0-mem-get-info",
                                                                              chunked)
        else:
            # SchedulerConfig.__post_init__ (v0.8.5.post1:vllm/config.py:68, 1967-1984): 2048 with chunked prefill
            max_num_batched_tokens = V085_DEFAULT_BATCHED_TOKENS if chunked else max(max_model_len,
                                                                                     V085_DEFAULT_BATCHED_TOKENS)
    if chunked:
        vlog.info(pick("config.py:820", "config.py:2003"),
                  f"Chunked prefill is enabled with max_num_batched_tokens={max_num_batched_tokens}.")
    if max_num_batched_tokens < max_model_len and not chunked:
        raise StartupFailure(
            "ValueError", f"max_num_batched_tokens ({max_num_batched_tokens}) is smaller than max_model_len "
            f"({max_model_len}). This effectively limits the maximum sequence length to max_num_batched_tokens "
            "and makes vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease "
            "max_model_len.")
    if max_num_batched_tokens < max_num_seqs:
        raise StartupFailure("ValueError", f"max_num_batched_tokens ({max_num_batched_tokens}) must be greater "
                             f"than or equal to max_num_seqs ({max_num_seqs}).")
    heads = int(facts["num_attention_heads"])
    if heads % args.tensor_parallel_size != 0:
        raise StartupFailure("ValueError", f"Total number of attention heads ({heads}) must be divisible by "
                             f"tensor parallel size ({args.tensor_parallel_size}).")
    if args.pipeline_parallel_size > 1 and facts.get("architecture") not in PP_SUPPORTED_ARCHITECTURES:
        raise StartupFailure("NotImplementedError", pick(
            "Pipeline parallelism is only supported for the following  "
            f"architectures: {PP_SUPPORTED_ARCHITECTURES}.",
            "Pipeline parallelism is not supported for this model. Supported models implement the `SupportsPP` "
            "interface."))
    ram, ram_source = gpu_mod.host_ram_bytes(environ)
    limits = release.data.swap_space_limits
    level, message = revive_kv.swap_space_check(args.swap_space, args.tensor_parallel_size, ram,
                                                limits["error_fraction"], limits["warn_fraction"])
    if level == "error":
        raise StartupFailure("ValueError", message)
    if level == "warn":
        vlog.warning(pick("config.py:521", "config.py:1443"), message)
    vlog.sim(f"host RAM for the swap-space check: {ram / GiB:.0f} GiB ({ram_source})")
    if not release.legacy and visible:
        # VllmConfig._get_quantization_config runs in the API process here (v0.8.5.post1:vllm/config.py:3791-3809)
        check_quantization_capability(quantization, visible[0])
    return _Config(served=served, dtype=dtype, max_model_len=max_model_len, quantization=quantization,
                   visible=visible, pynvml=pynvml, world=world, backend=backend, chunked=bool(chunked),
                   max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)


def discover_gpus(environ: Dict[str, str]):
    if not current().legacy and environ.get("CUDA_VISIBLE_DEVICES") == "":
        # the platform maps device 0 through CUDA_VISIBLE_DEVICES (v0.8.5.post1:vllm/platforms/cuda.py:37-48)
        raise StartupFailure("RuntimeError", "CUDA_VISIBLE_DEVICES is set to empty string, which means GPU support "
                             "is disabled. If you are using ray, please unset the environment variable "
                             "`CUDA_VISIBLE_DEVICES` inside the worker/actor. Check "
                             "https://github.com/vllm-project/vllm/issues/8402 for more information.")
    try:
        visible, pynvml = gpu_mod.discover(environ)
    except gpu_mod.NoGpuError as exc:
        raise StartupFailure("RuntimeError", pick(
            str(exc), "Failed to infer device type, please set the environment variable `VLLM_LOGGING_LEVEL=DEBUG` "
            "to turn on verbose logging to help debug the issue.")) from None
    if not visible and not current().legacy:
        raise StartupFailure("RuntimeError", "No CUDA GPUs are available")
    return visible, pynvml


def opt_in_v1(environ: Dict[str, str]) -> str:
    """0.6.6.post1/0.7.3: V0 unless VLLM_USE_V1=1 (bool(int(...)), v0.7.3:vllm/envs.py:503-504); V1 is refused,
    since the twin simulates the V0 engine only."""
    raw = environ.get("VLLM_USE_V1", "0")
    if raw.strip() == "":
        raise StartupFailure("ValueError", "invalid literal for int() with base 10: ''", in_engine=False)
    if int(raw) == 0:
        return "V0"
    raise StartupFailure("NotImplementedError", f"[twin] VLLM_USE_V1={raw} runs vLLM {current().release}'s V1 "
                         "engine, which the twin does not simulate (it simulates V0, the default of this release); "
                         "unset VLLM_USE_V1", in_engine=False)


def engine_choice(args, visible: List[gpu_mod.Gpu], environ: Dict[str, str]) -> str:
    """0.8.5.post1's V0/V1 choice (v0.8.5.post1:vllm/engine/arg_utils.py:1106-1116): VLLM_USE_V1 unset tries V1
    and falls back to V0 on the first unsupported feature with a warning; VLLM_USE_V1=1 raises
    NotImplementedError there instead (_raise_or_fallback, :1649-1658); VLLM_USE_V1=0 takes V0 silently.

    The twin checks the oracle's features in its order (:1292-1499) as far as the twin's arguments reach;
    a configuration that would run V1 is refused, since the twin simulates the V0 engine only.
    """
    raw = environ.get("VLLM_USE_V1")
    if raw is not None and raw.strip() == "":
        raise StartupFailure("ValueError", "invalid literal for int() with base 10: ''", in_engine=False)
    if raw is not None and int(raw) == 0:
        return "V0"
    explicit = raw is not None
    reason = v1_unsupported_feature(args, visible, environ)
    if reason is None:
        raise StartupFailure("NotImplementedError", f"[twin] this configuration runs vLLM {current().release}'s V1 "
                             "engine, which the twin does not simulate (it simulates V0, what GPUs of compute "
                             "capability < 8.0 run); set VLLM_USE_V1=0 to simulate V0", in_engine=False)
    feature, recommend = reason
    if explicit:
        raise StartupFailure("NotImplementedError", f"VLLM_USE_V1=1 is not supported with {feature}.")
    message = f"{feature} is not supported by the V1 Engine. Falling back to V0. "
    if recommend:
        message += f"We recommend to remove {feature} from your config in favor of the V1 Engine."
    vlog.warning(current().source("v1_fallback", "arg_utils.py:1658"), message)
    return "V0"


def v1_unsupported_feature(args, visible: List[gpu_mod.Gpu], environ: Dict[str, str]):
    """(feature_name, recommend_to_remove) of the oracle's first V1-unsupported feature, or None."""
    # 0.9.2 loads tensorizer checkpoints in V1 (v0.9.2:vllm/engine/arg_utils.py:1312-1316)
    fallback_formats = ("sharded_state",) if current().behaviour.engine_oracle == "0.9" else ("tensorizer",
                                                                                              "sharded_state")
    if args.load_format in fallback_formats:
        return f"--load_format {args.load_format}", False
    if getattr(args, "preemption_mode", None) is not None:
        return "--preemption-mode", True
    if getattr(args, "scheduler_delay_factor", 0.0) != 0.0:
        return "--scheduler-delay-factor", True
    if visible and visible[0].compute_capability[0] < 8:
        return "Compute Capability < 8.0", False
    if args.kv_cache_dtype != "auto":
        return "--kv-cache-dtype", False
    if getattr(args, "enable_prompt_adapter", False):
        return "--enable-prompt-adapter", False
    return None


def check_quantization_capability(quantization: Optional[str], gpu: gpu_mod.Gpu) -> None:
    table = current().data.quantization_min_cc
    capability = gpu.compute_capability[0] * 10 + gpu.compute_capability[1]
    if quantization and capability < table[quantization]:
        raise StartupFailure(
            "ValueError", f"The quantization method {quantization} is not supported for the current GPU. Minimum "
            f"capability: {table[quantization]}. Current capability: {capability}.")


def _start_engine(args, facts: Dict[str, Any], environ: Dict[str, str], settings: Settings,
                  wait: Callable[[float], None], worker_prefixes: Callable[[int], List[str]],
                  config: _Config, ray_sessions: List[Any]) -> EngineSetup:
    """The engine: executor and workers, model load, KV sizing, CUDA graphs. A Ray executor it starts is appended
    to `ray_sessions` at once, so that a later failure leaves the cluster."""
    release = current()
    behaviour = release.behaviour
    revive_kv = module_utils("revive_kv")
    served, dtype, max_model_len, quantization = config.served, config.dtype, config.max_model_len, config.quantization
    visible, pynvml, world = config.visible, config.pynvml, config.world
    max_num_batched_tokens, chunked, max_num_seqs = config.max_num_batched_tokens, config.chunked, config.max_num_seqs
    kv_dtype = dtype if args.kv_cache_dtype == "auto" else args.kv_cache_dtype
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    ray_cluster = None
    if release.legacy and config.backend == "ray":
        # initialize_ray_cluster runs before the engine is built (v0.5.4 vllm/engine/async_llm_engine.py:438-442)
        from vllm._twin import ray_executor
        ray_cluster = ray_executor.RayExecutor(ray_executor.import_ray(defaulted=False))
        ray_sessions.append(ray_cluster)
        ray_cluster.initialize_cluster(world, settings.time_scale)
    if release.legacy:
        vlog.info("llm_engine.py:174", (
            f"Initializing an LLM engine (v{_version()}) with config: model={args.model!r}, speculative_config=None, "
            f"tokenizer={(args.tokenizer or args.model)!r}, skip_tokenizer_init={args.skip_tokenizer_init}, "
            f"tokenizer_mode={args.tokenizer_mode}, revision={args.revision}, rope_scaling={args.rope_scaling!r}, "
            f"rope_theta={args.rope_theta!r}, tokenizer_revision={args.tokenizer_revision}, "
            f"trust_remote_code={args.trust_remote_code}, dtype={TORCH_DTYPES[dtype]}, max_seq_len={max_model_len}, "
            f"download_dir={args.download_dir!r}, load_format=LoadFormat.{args.load_format.upper()}, "
            f"tensor_parallel_size={args.tensor_parallel_size}, pipeline_parallel_size={args.pipeline_parallel_size}, "
            f"disable_custom_all_reduce={args.disable_custom_all_reduce}, quantization={quantization}, "
            f"enforce_eager={args.enforce_eager}, kv_cache_dtype={args.kv_cache_dtype}, "
            f"quantization_param_path={args.quantization_param_path}, device_config=cuda, "
            "decoding_config=DecodingConfig(guided_decoding_backend='outlines'), "
            "observability_config=ObservabilityConfig(otlp_traces_endpoint=None), "
            f"seed={args.seed}, served_model_name={served[0]}, use_v2_block_manager={args.use_v2_block_manager}, "
            f"enable_prefix_caching={args.enable_prefix_caching})"))
    else:
        # llm_engine.py:240-246 with VllmConfig.__str__ (config.py:4052-4085); the twin abbreviates
        # compilation_config to the fields it knows.
        vlog.info(release.source("engine_init", "llm_engine.py:240"), (
            f"Initializing {behaviour.engine_init_words} (v{_version()}) with config: model={args.model!r}, "
            f"speculative_config=None, tokenizer={(args.tokenizer or args.model)!r}, "
            f"skip_tokenizer_init={args.skip_tokenizer_init}, tokenizer_mode={args.tokenizer_mode}, "
            f"revision={args.revision}, override_neuron_config=None, tokenizer_revision={args.tokenizer_revision}, "
            f"trust_remote_code={args.trust_remote_code}, dtype={TORCH_DTYPES[dtype]}, max_seq_len={max_model_len}, "
            f"download_dir={args.download_dir!r}, load_format={args.load_format}, "
            f"tensor_parallel_size={args.tensor_parallel_size}, pipeline_parallel_size={args.pipeline_parallel_size}, "
            f"disable_custom_all_reduce={args.disable_custom_all_reduce}, quantization={quantization}, "
            f"enforce_eager={args.enforce_eager}, kv_cache_dtype={args.kv_cache_dtype},  device_config=cuda, "
            f"decoding_config=DecodingConfig(guided_decoding_backend='{args.guided_decoding_backend}', "
            "reasoning_backend=None), observability_config=ObservabilityConfig(show_hidden_metrics=False, "
            "otlp_traces_endpoint=None, collect_model_forward_time=False, collect_model_execute_time=False), "
            f"seed={args.seed}, served_model_name={served[0]}, num_scheduler_steps=1, "
            f"multi_step_stream_outputs=True, enable_prefix_caching={bool(args.enable_prefix_caching)}, "
            f"chunked_prefill_enabled={chunked}, use_async_output_proc={not args.enforce_eager}, "
            "disable_mm_preprocessor_cache=False, mm_processor_kwargs=None, pooler_config=None, "
            f"compilation_config={{\"level\":0,\"max_capture_size\":{0 if args.enforce_eager else max_num_seqs}}}, "
            "use_cached_outputs=True, "))

    # --- executor and workers ---------------------------------------------------------------------
    if not release.legacy and config.backend == "ray" and world > len(visible):
        wait_for_placement_group(world, wait)
    if ray_cluster is not None:
        ray_cluster.start_workers(tp, pp, args.gpu_memory_utilization)
        # the driver's GPUs are the ones Ray gave its node: 0.5.4 sets CUDA_VISIBLE_DEVICES to them in every
        # process of the node, the driver's too (v0.5.4 vllm/executor/ray_gpu_executor.py:186-214)
        node_gpus = ",".join(str(g) for g in ray_cluster.driver_node_gpus())
        visible, pynvml = discover_gpus(dict(environ, CUDA_VISIBLE_DEVICES=node_gpus))
        group = visible
        topo = gpu_mod.topology(pynvml, group[:tp])
        prefixes = ray_cluster.worker_prefixes()
        vlog.sim(f"Ray workers: {world} actors of the real cluster stand for vLLM's workers (nothing runs on them); "
                 "their log lines below are printed by the twin with Ray's prefix")
    else:
        group = visible[:world]
        topo = gpu_mod.topology(pynvml, group)
        prefixes = worker_prefixes(world)
    wait(perf.init_seconds(world))
    all_reduce = release.data.custom_all_reduce
    # one custom all-reduce per tensor-parallel group (v0.5.4 vllm/distributed/parallel_state.py:161-169, 931-950)
    if tp > 1 and not args.disable_custom_all_reduce:
        for prefix in [""] + prefixes:
            if tp not in all_reduce["world_sizes"]:
                vlog.warning(pick("custom_all_reduce.py:81", "custom_all_reduce.py:97"), "Custom allreduce is "
                             f"disabled due to an unsupported world size: {tp}. Supported world sizes: "
                             f"{all_reduce['world_sizes']}. To silence this warning, specify "
                             "disable_custom_all_reduce=True explicitly.", prefix)
            elif tp > all_reduce["pcie_only_max_world_size"] and not topo.all_nvlink:
                vlog.warning(pick("custom_all_reduce.py:118", "custom_all_reduce.py:136"), "Custom allreduce is "
                             "disabled because it's not supported on more than two PCIe-only GPUs. To silence this "
                             "warning, specify disable_custom_all_reduce=True explicitly.", prefix)
            elif not topo.all_p2p and not topo.all_nvlink:
                vlog.warning(pick("custom_all_reduce.py:127", "custom_all_reduce.py:146"), "Custom allreduce is "
                             "disabled because your platform lacks GPU P2P capability or P2P test failed. To silence "
                             "this warning, specify disable_custom_all_reduce=True explicitly.", prefix)
    forced_xformers = not release.legacy and environ.get("VLLM_ATTENTION_BACKEND") == "XFORMERS"
    # the driver's node is the only one whose GPUs the twin reads (a serving group's nodes are identical)
    rank_gpus = [group[rank] if rank < len(group) else group[0] for rank in range(world)]
    for rank, gpu in enumerate(rank_gpus):
        prefix = "" if rank == 0 else prefixes[rank - 1]
        if forced_xformers:  # the selected backend is taken as it is (v0.8.5.post1:vllm/platforms/cuda.py:227-229)
            vlog.info("cuda.py:228", "Using XFormers backend.", prefix)
            continue
        if gpu.compute_capability[0] < 8:
            vlog.info(pick("selector.py:151", "cuda.py:240"), "Cannot use FlashAttention-2 backend for Volta and "
                      "Turing GPUs.", prefix)
        vlog.info(pick("selector.py:54", "cuda.py:289" if gpu.compute_capability[0] < 8 else "cuda.py:292"),
                  "Using XFormers backend." if gpu.compute_capability[0] < 8
                  else pick("Using FlashAttention-2 backend.", "Using Flash Attention backend."), prefix)
    for gpu in group:  # Worker.init_device -> _check_if_gpu_supports_dtype (0.5.4 worker.py:352, 0.8.5 worker.py:533)
        if dtype == "bfloat16" and gpu.compute_capability[0] < 8:
            major, minor = gpu.compute_capability
            raise StartupFailure(
                "ValueError", "Bfloat16 is only supported on GPUs with compute capability of at least 8.0. "
                f"Your {gpu.name} GPU has compute capability {major}.{minor}. You can use float16 instead by "
                + pick("explicitly setting the`dtype` flag in CLI, for example: --dtype=half.",
                       "explicitly setting the `dtype` flag in CLI, for example: --dtype=half."))

    # --- load_model ---------------------------------------------------------------------------
    if release.legacy:
        check_quantization_capability(quantization, group[0])
    if facts.get("attn_logit_softcapping") and group[0].compute_capability[0] < 8:
        if release.legacy:
            raise StartupFailure("ValueError", "XFormers does not support attention logits soft capping.")
        for prefix in [""] + prefixes:  # xformers.py:398, a warning from 0.6 on
            vlog.warning("xformers.py:398", "XFormers does not support logits soft cap. Outputs may be slightly "
                         "off.", prefix)
    head_size = int(facts["head_dim"])
    supported = list(release.data.paged_attention_head_sizes)
    if group[0].compute_capability[0] < 8 and head_size not in supported:
        raise StartupFailure("ValueError", f"Head size {head_size} is not supported by PagedAttention. Supported "
                             f"head sizes are: {supported}.")
    context = revive_kv.CUDA_CONTEXT_BYTES
    layers = revive_kv.pipeline_stage_layers(int(facts["num_hidden_layers"]), pp)
    if pp > 1:
        stage_bytes = revive_kv.pipeline_stage_weight_bytes(facts, layers,
                                                              revive_kv.DTYPE_BYTES[KV_SIZING_DTYPE[dtype]])
        rank_weights = [math.ceil(stage_bytes[rank // tp] / tp) for rank in range(world)]
    else:
        rank_weights = [revive_kv.weights_per_gpu_bytes(facts, world, KV_SIZING_DTYPE[dtype])] * world
    # every node loads its own ranks' weights from its own disk, the nodes at once
    rank_nodes = [w.node_id for w in ray_cluster.workers] if ray_cluster is not None else [""] * world
    node_bytes: Dict[str, int] = {}
    for node, size in zip(rank_nodes, rank_weights):
        node_bytes[node] = node_bytes.get(node, 0) + size
    load_time = perf.load_seconds(int(facts["weight_bytes"] * max(node_bytes.values()) / sum(rank_weights)))
    for prefix in [""] + prefixes:
        vlog.info(pick("model_runner.py:720", "model_runner.py:1108"), f"Starting to load model {args.model}...",
                  prefix)
    for rank, gpu in enumerate(group):
        weights = rank_weights[rank]
        free = gpu.cuda_total_bytes - gpu.used_bytes - context
        if weights > free:
            wait(load_time * max(free, 0) / weights)
            allocated = max(free - 2 * MiB, 0)
            raise StartupFailure("torch.OutOfMemoryError", oom_message(
                min(weights - allocated, 1024 * MiB), rank, gpu.cuda_total_bytes, 2 * MiB,
                context + allocated, allocated))
    wait(load_time)
    for prefix, weights in zip([""] + prefixes, rank_weights):
        if release.legacy:
            vlog.info("model_runner.py:732", f"Loading model weights took {weights / GiB:.4f} GB", prefix)
        else:
            scaled = load_time * settings.time_scale
            vlog.info("loader.py:458", f"Loading weights took {scaled:.2f} seconds", prefix)
            vlog.info("model_runner.py:1140", f"Model loading took {weights / GiB:.4f} GiB and {scaled:.6f} "
                      "seconds", prefix)
    if settings.fail_after_load:
        raise StartupFailure("RuntimeError", f"[twin fault VLLM_SIM_FAULT_FAIL_AFTER_LOAD] {settings.fail_after_load}")

    # --- determine_num_available_blocks (revive_kv: the planner's code) -----------------------------
    wait(perf.PROFILE_RUN_SECONDS)
    total = min(g.cuda_total_bytes for g in group)

    def worker_kv(stage: Optional[int]) -> Any:
        """One worker's estimate: the whole model's share at PP 1, else the stage's layers and weights (undivided:
        the engine divides the blocks among its virtual engines after logging them)."""
        stage_args: Dict[str, Any] = {}
        if stage is not None:
            stage_args = {"weights_bytes_per_gpu": rank_weights[stage * tp], "stage_layers": layers[stage]}
        return revive_kv.kv_cache_plan(
            facts, tp, total, args.gpu_memory_utilization,
            args.swap_space, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
            max_model_len=max_model_len, block_size=args.block_size or 16, dtype=KV_SIZING_DTYPE[dtype],
            release=release.release, sizing=release.data.kv_sizing, enable_chunked_prefill=chunked,
            kv_cache_dtype=args.kv_cache_dtype, **stage_args)

    # the executor keeps the fewest GPU and CPU blocks of any worker (v0.5.4
    # vllm/executor/distributed_gpu_executor.py:27-46): with PP the stage with the most layers and weights, the
    # last. The sampler's profile term is counted on every stage (0.5.4 samples on the last only,
    # worker/model_runner.py:1373-1375), which does not change the fewest.
    stage_kvs = [worker_kv(stage) for stage in range(pp)] if pp > 1 else [worker_kv(None)]
    kv = min(stage_kvs, key=lambda e: e.num_gpu_blocks)
    num_cpu_blocks = min(e.num_cpu_blocks for e in stage_kvs)
    block_size = kv.block_size
    if behaviour.memory_profiling_line:
        for prefix in [""] + prefixes:
            vlog.info(release.source("memory_profiling", "worker.py:287"), memory_profiling_message(
                kv, total, args.gpu_memory_utilization, perf.PROFILE_RUN_SECONDS * settings.time_scale), prefix)
    num_gpu_blocks = kv.num_gpu_blocks
    errors = list(kv.errors)
    if args.num_gpu_blocks_override is not None:
        vlog.info(pick("llm_engine.py:361", "llm_engine.py:426"), f"Overriding num_gpu_blocks={num_gpu_blocks} with "
                  f"num_gpu_blocks_override={args.num_gpu_blocks_override}")
        num_gpu_blocks = args.num_gpu_blocks_override
        # raise_if_cache_size_invalid (0.5.4 worker.py:366, 0.8.5 worker.py:553) on the overridden count
        errors = []
        if num_gpu_blocks <= 0:
            errors.append("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                          "initializing the engine.")
        elif max_model_len > block_size * num_gpu_blocks:
            errors.append(f"The model's max seq len ({max_model_len}) is larger than the maximum number of tokens "
                          f"that can be stored in KV cache ({block_size * num_gpu_blocks}). Try increasing "
                          "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
    for where, line in kv_lines(num_gpu_blocks, num_cpu_blocks, block_size, max_model_len, world):
        vlog.info(where, line)
    if errors:
        raise StartupFailure("ValueError", errors[0])

    # --- CUDA graphs, outside the budget (worker.py:236, model_runner.py:1010) -----------------------
    if not args.enforce_eager:
        for prefix in [""] + prefixes:
            if release.legacy:
                vlog.info("model_runner.py:1024", "Capturing the model for CUDA graphs. This may lead to unexpected "
                          "consequences if the model is not static. To run the model in eager mode, set "
                          "'enforce_eager=True' or use '--enforce-eager' in the CLI.", prefix)
                vlog.info("model_runner.py:1028", "CUDA graphs can take additional 1~3 GiB memory per GPU. If you "
                          "are running out of memory, consider decreasing `gpu_memory_utilization` or enforcing "
                          "eager mode. You can also reduce the `max_num_seqs` as needed to decrease memory usage.",
                          prefix)
            else:
                vlog.info("model_runner.py:1450", "Capturing cudagraphs for decoding. This may lead to unexpected "
                          "consequences if the model is not static. To run the model in eager mode, set "
                          "'enforce_eager=True' or use '--enforce-eager' in the CLI. If out-of-memory error occurs "
                          "during cudagraph capture, consider decreasing `gpu_memory_utilization` or switching to "
                          "eager mode. You can also reduce the `max_num_seqs` as needed to decrease memory usage.",
                          prefix)
        needed = perf.graph_memory_bytes(max_num_seqs, int(facts["num_hidden_layers"]), int(facts["hidden_size"]))
        capture_time = perf.graph_capture_seconds(max_num_seqs)
        kv_bytes = num_gpu_blocks * kv.bytes_per_block
        for rank, gpu in enumerate(group):
            in_use = context + kv.weights_per_gpu + kv.non_torch + kv_bytes
            free = gpu.cuda_total_bytes - gpu.used_bytes - in_use
            if needed > free:
                wait(capture_time * max(free, 0) / needed)
                raise StartupFailure("torch.OutOfMemoryError", oom_message(
                    min(needed - max(free, 0) + 20 * MiB, needed), rank, gpu.cuda_total_bytes, max(free, 0) // 3,
                    in_use + max(free, 0) - max(free, 0) // 3, in_use - context))
        wait(capture_time)
        for prefix in [""] + prefixes:
            if release.legacy:
                vlog.info("model_runner.py:1225", f"Graph capturing finished in "
                          f"{round(capture_time * settings.time_scale)} secs.", prefix)
            else:
                vlog.info("model_runner.py:1592", f"Graph capturing finished in "
                          f"{capture_time * settings.time_scale:.0f} secs, took {needed / GiB:.2f} GiB", prefix)
    if not release.legacy:
        init_seconds = (perf.PROFILE_RUN_SECONDS + (0 if args.enforce_eager else perf.graph_capture_seconds(
            max_num_seqs))) * settings.time_scale
        vlog.info("llm_engine.py:437", f"init engine (profile, create kv cache, warmup model) took {init_seconds:.2f} "
                  "seconds")

    transport = perf.choose_transport(
        tp, topo.nvlink_connected, topo.all_p2p, topo.slowest_path,
        environ.get("NCCL_P2P_DISABLE", "0") not in ("0", ""), environ.get("NCCL_SHM_DISABLE", "0") not in ("0", ""))
    kv_token_bytes = revive_kv.kv_bytes_per_token(facts, 1, "half" if kv_dtype in ("float16", "bfloat16") else
                                                  ("fp8" if kv_dtype.startswith("fp8") else "float32"))
    shape = perf.ModelShape(int(facts["parameter_count"]), int(facts["weight_bytes"]), int(facts["num_hidden_layers"]),
                            int(facts["hidden_size"]), kv_token_bytes)
    spec = perf.gpu_spec(group[0].name, group[0].architecture)
    max_graph = 0 if args.enforce_eager else max(perf.graph_batch_sizes(max_num_seqs) or [0])
    model: perf.StepModel = perf.PerfModel(shape, spec, tp, transport, args.enforce_eager, max_graph)
    vlog.sim(f"tensor-parallel transport: {transport.description}; GPUs (NVML index) "
             f"{[g.nvml_index for g in group]}, slowest path {topo.slowest_path}")
    if pp > 1:
        # the planner's stage (module_utils/revive_plan/pipeline.py _evaluate): the largest stage's layers, their
        # share of the parameters and KV bytes per token, its weights
        largest = max(layers)
        num_layers = int(facts["num_hidden_layers"])
        stage_shape = perf.ModelShape(int(int(facts["parameter_count"]) * largest / num_layers),
                                      max(stage_bytes), largest, int(facts["hidden_size"]),
                                      kv_token_bytes * largest // num_layers)
        if ray_cluster is not None:
            link, over = settings.node_link_bytes_per_s(), (f"the node link, {settings.node_link_gbit:g} Gbit/s "
                                                            "(VLLM_SIM_NODE_LINK_GBIT)")
        else:
            link, over = transport.bandwidth, f"the stage's NCCL transport inside the node ({transport.name})"
        model = perf.PipelineModel(perf.PerfModel(stage_shape, spec, tp, transport, args.enforce_eager, max_graph),
                                   pp, link)
        vlog.sim(f"pipeline: {pp} stages of layers {layers}, {pp} virtual engines of "
                 f"{num_gpu_blocks // pp} GPU / {num_cpu_blocks // pp} CPU blocks each; a step passes every stage "
                 f"(module_utils/revive_perf.py pipeline_loop), hidden + residual sent between stages over {over}")
    engine_config = EngineConfig(
        block_size=block_size, num_gpu_blocks=num_gpu_blocks // pp, num_cpu_blocks=num_cpu_blocks // pp,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
        chunked_prefill=bool(chunked), preemption_mode=args.preemption_mode, delay_factor=args.scheduler_delay_factor,
        seed=args.seed)
    cache_info = cache_config_info(args, facts, block_size, num_gpu_blocks, num_cpu_blocks)
    return EngineSetup(
        model_path=args.model, served_model_names=served, facts=facts, dtype=dtype, max_model_len=max_model_len,
        engine_config=engine_config, perf_model=model, group=group, transport=transport, kv=kv,
        cache_config_info=cache_info, block_bytes=kv.bytes_per_block, worker_count=world - 1,
        timings={"load_seconds": load_time}, virtual_engines=pp, cache_blocks=(num_gpu_blocks, num_cpu_blocks),
        ray_executor=ray_cluster)


def kv_lines(num_gpu_blocks: int, num_cpu_blocks: int, block_size: int, max_model_len: int,
             world: int) -> List[Any]:
    """The executor's KV start-up lines, worded as the release words them (Behaviour.kv_blocks_device,
    kv_concurrency_line): `# GPU blocks: N, # CPU blocks: M` from the GPU executors (0.5.4, 0.6.6.post1, whose
    multi-GPU executor logs from distributed_gpu_executor.py), `# cuda blocks: ...` from ExecutorBase with the
    platform's device_name (0.7 on, v0.8.5.post1:vllm/executor/executor_base.py:112-117), then the maximum
    concurrency (0.6 on)."""
    release = current()
    behaviour = release.behaviour
    suffix = "_tp" if world > 1 and "kv_blocks_tp" in behaviour.sources else ""
    device = "GPU" if behaviour.kv_blocks_device == "GPU" else "cuda"
    lines = [(release.source("kv_blocks" + suffix, "executor_base.py:112"),
              f"# {device} blocks: {num_gpu_blocks}, # CPU blocks: {num_cpu_blocks}")]
    if behaviour.kv_concurrency_line:
        lines.append((release.source("kv_concurrency" + suffix, "executor_base.py:117"),
                      f"Maximum concurrency for {max_model_len} tokens per request: "
                      f"{num_gpu_blocks * block_size / max_model_len:.2f}x"))
    return lines


def memory_profiling_message(kv: Any, total: int, utilization: float, seconds: float) -> str:
    """Worker.determine_num_available_blocks's summary (v0.8.5.post1:vllm/worker/worker.py:271-287), from
    module_utils/revive_kv.py's per-instance estimate: weights, non-torch increase, activation peak."""
    return (f"Memory profiling takes {seconds:.2f} seconds\n"
            f"the current vLLM instance can use total_gpu_memory ({total / GiB:.2f}GiB) x gpu_memory_utilization "
            f"({utilization:.2f}) = {total * utilization / GiB:.2f}GiB\n"
            f"model weights take {kv.weights_per_gpu / GiB:.2f}GiB; "
            f"non_torch_memory takes {kv.non_torch / GiB:.2f}GiB; "
            f"PyTorch activation peak memory takes {kv.peak_activation / GiB:.2f}GiB; the rest of the memory reserved "
            f"for KV Cache is {kv.kv_bytes / GiB:.2f}GiB.")


def wait_for_placement_group(world: int, wait: Callable[[float], None]) -> None:
    """More GPUs than visible with Ray on 0.8.5.post1: a warning, then the placement group that never comes
    (v0.8.5.post1:vllm/executor/ray_utils.py:337-345 and _wait_until_pg_ready :211-248, PG_WAIT_TIMEOUT 1800 s
    at :24), logged with ray.wait's doubling interval, then the ValueError."""
    vlog.warning("ray_utils.py:342", "The number of required GPUs exceeds the total number of available GPUs in the "
                 "placement group.")
    specs = [{"GPU": 1.0} for _ in range(world)]
    elapsed, interval = 0.0, 10.0
    while elapsed < PG_WAIT_TIMEOUT_SECONDS:
        wait(interval)
        elapsed += interval
        interval *= 2
        vlog.info("ray_utils.py:233", f"Waiting for creating a placement group of specs for {int(elapsed)} seconds. "
                  f"specs={specs}. Check `ray status` and `ray list nodes` to see if you have enough resources, and "
                  "make sure the IP addresses used by ray cluster are the same as VLLM_HOST_IP environment variable "
                  "specified in each node if you are running on a multi-node.")
    raise StartupFailure("ValueError", f"Cannot provide a placement group of placement_group_specs={specs} within "
                         f"{PG_WAIT_TIMEOUT_SECONDS} seconds. See `ray status` and `ray list nodes` to make sure the "
                         "cluster has enough resources.")


def cache_config_info(args, facts: Dict[str, Any], block_size: int, num_gpu_blocks: int,
                      num_cpu_blocks: int) -> Dict[str, object]:
    """The labels of vllm:cache_config_info: CacheConfig.metrics_info(), i.e. its __dict__ as strings, with the
    attributes of the release's CacheConfig (Behaviour.cache_config_fields)."""
    behaviour = current().behaviour
    prefix_caching = args.enable_prefix_caching
    if behaviour.engine_oracle == "opt-in" and prefix_caching is None:
        # EngineArgs.__post_init__: bool(VLLM_USE_V1) (v0.6.6.post1:vllm/engine/arg_utils.py:208-209, v0.7.3 :219-220)
        prefix_caching = False
    values: Dict[str, object] = {
        "block_size": block_size, "gpu_memory_utilization": args.gpu_memory_utilization,
        "swap_space": args.swap_space, "swap_space_bytes": args.swap_space * GiB,
        "num_gpu_blocks_override": args.num_gpu_blocks_override, "cache_dtype": args.kv_cache_dtype,
        "is_attention_free": False, "sliding_window": facts.get("sliding_window"),
        "enable_prefix_caching": prefix_caching, "prefix_caching_hash_algo": "builtin",
        "cpu_offload_gb": args.cpu_offload_gb, "calculate_kv_scales": False, "cpu_kvcache_space_bytes": None,
        "num_gpu_blocks": num_gpu_blocks, "num_cpu_blocks": num_cpu_blocks,
    }
    return {name: values[name] for name in behaviour.cache_config_fields}


def _version() -> str:
    from vllm.version import __version__
    return __version__


def model_summary(facts: Dict[str, Any]) -> str:
    keep = ("architecture", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
            "parameter_count", "weight_bytes", "torch_dtype", "source")
    return json.dumps({k: facts.get(k) for k in keep}, sort_keys=True)

