"""vLLM's KV-cache sizing as pure functions (the KV estimate): the planner's estimate and the lab twin's
start-up line ``# GPU blocks: N, # CPU blocks: M`` come from this one code.

Main entry point::

    kv_cache_plan(model, tensor_parallel_size, gpu_total_bytes, gpu_memory_utilization, swap_space_gib,
                  max_num_batched_tokens=None, max_num_seqs=256, max_model_len=None, block_size=16,
                  dtype="half", release="0.5.4") -> KvEstimate

``model`` is a model-facts dict (``revive_model.inspect_model``); only its architecture
numbers and ``weight_bytes``/``parameter_count``/``quantization`` are read.

The algorithm of 0.5.4 (docs/facts/vllm-volta.md §3.1-§3.4), per GPU worker:

1. ``bytes_per_block = block_size x max(1, kv_heads // TP) x head_dim x layers x 2 (K and V) x dtype
   bytes`` (``CacheEngine.get_cache_block_size``, §3.3).
2. A profile run pushes ``max_num_batched_tokens`` tokens (default ``max(max_model_len, 2048)``; 512
   with chunked prefill, which turns itself on above 32768, 2048 from 0.6.5 on) in ``max_num_seqs`` dummy
   prompts through the model and samples one token per prompt with top-k = vocab - 1 and top-p 0.99 (§3.2).
3. ``peak = free_at_init - free_after_profile``: weights + the caching allocator's peak + memory
   allocated outside torch (NCCL buffers, cuBLAS workspaces). The CUDA context predates the snapshot
   and is not counted (§3.1).
4. ``num_gpu_blocks = (total x gpu_memory_utilization - peak) // bytes_per_block``; with TP the executor
   takes the minimum over workers, which is rank 0 (it alone gathers the full logits and samples).
5. ``num_cpu_blocks = swap_space_gib x 2**30 // bytes_per_block``, per worker; the swap space is pinned
   host RAM allocated at start-up (§3.4). Pipeline parallelism divides both counts (§3.1 step 6).

What the estimator cannot read from vLLM is the peak of step 3; it is modelled as

    peak = weights_per_gpu + max(forward_activation, sampler) + non_torch

* ``forward_activation = tokens x dtype_bytes x (h H + k I / TP)``: the tensors alive at the MLP's peak in
  vLLM's decoder layers - the layer input the model's loop still holds, the residual and the MLP input, the
  gate/up output and the activation (k = 3 for gated MLPs, 2 otherwise; ``I`` times the routed experts for
  MoE). h = 3 where the MLP frees gate_up before down_proj (Llama, Mistral, Phi-3) and in the 0.5.4 family;
  h = 4 where it keeps it (Qwen2/3, InternLM2, Gemma, ...: ``GATE_UP_KEPT_MLP_TYPES``) in the families that
  measure torch's allocated peak. Checked against logged activation peaks: Llama-3.1-8B at 20 000 and
  29 000 tokens (#10517, within 0.3 %); Qwen2.5-1.5B / -7B at 32 768 and Qwen3-4B at 10 000 tokens
  (within 0.5 % with h = 4, 5 % low with 3).
* ``sampler = max_num_seqs x vocab x 36 bytes``: the float32 logits (4), their sorted copy (4) and sort
  indices (8), the softmax (4) and cumulative sum (4) of the top-p mask, the inverse permutation (8) and
  the gathered logits (4) of ``_apply_top_k_top_p`` (0.5.4 ``layers/sampler.py``), alive together; plus
  the model-dtype logits that ``execute_model`` keeps referenced (2 for fp16) in the allocated-peak
  families, where five logs give 38.4-39.9 bytes per logit (``sampler_bytes_per_logit``). With
  chunked prefill the logged peaks show no sampler term (#10517 at 35k: 0.06 GiB; an A10G 131k log:
  0.22 GiB), so none is modelled there - although 0.7.3's ``_dummy_run`` samples ``max_num_seqs`` prompts
  either way (``worker/model_runner.py:1237-1300``), and a 0.8.5 MoE log with ``--enable-chunked-prefill``
  does show it (1.40 GiB; docs/facts/vllm-volta.md §3.7, an open question).
* ``non_torch``: 0.10 GiB on one GPU (cuBLAS workspaces and allocator slack counted by the
  ``mem_get_info`` difference), plus 0.25 GiB + 0.05 GiB per rank with tensor parallelism (NCCL
  buffers of the torch and pynccl communicators; #7593: Gemma-2-9B at TP 8 needs ~0.7 GiB beyond the
  sampler). The 0.6.4 family also counts the CUDA context (0.27 GiB, #10517's ``non_torch_memory=0.35GiB``).

Later releases (§3.6) change step 3-4, selected by ``sizing`` (or derived from ``release``/``engine``):

* ``v0-mem-get-info``      <= 0.6.3.post1: as above.
* ``v0-torch-peak-global`` 0.6.4.x: ``total x util - (weights + activation peak) - non_torch``, where
  non_torch includes the CUDA context and other processes (a global cap).
* ``v0-per-instance``      0.6.5-0.10.x on the V0 engine: ``total x util - (weights + activation peak +
  non_torch increase)``; other processes are excluded again.
* ``v1``                   V1 engine (Ampere on 0.8+, every GPU from 0.10.2): the per-instance budget,
  no CPU swap blocks; its profile batch is ``max_num_batched_tokens`` (default 2048 on GPUs under
  70 GiB, 8192 above, chunked prefill always on), so it no longer grows with max-model-len.

Validation against vLLM's own start-up logs: tests/data/kv_observations.yml (sources inside) and
tests/unit/test_kv_observations.py: CPU blocks exact, GPU blocks within a few percent, reported per sizing
family and per in-sample / out-of-sample point (docs/facts/vllm-volta.md §3.7).
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

GiB = 1 << 30
MiB = 1 << 20

DTYPE_BYTES = {"half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1}
SIZING_FAMILIES = ("v0-mem-get-info", "v0-torch-peak-global", "v0-per-instance", "v1")

# Calibrated constants (derivations in the module docstring).
SAMPLER_BYTES_PER_LOGIT = 36
NON_TORCH_SINGLE_GPU = int(0.10 * GiB)
NON_TORCH_PER_INSTANCE_SINGLE_GPU = int(0.08 * GiB)
NCCL_BASE_BYTES = int(0.25 * GiB)
NCCL_PER_RANK_BYTES = int(0.05 * GiB)
CUDA_CONTEXT_BYTES = int(0.27 * GiB)
NON_GATED_MLP_TYPES = ("gpt_neox", "gpt2", "gpt_bigcode", "falcon", "phi", "opt", "bloom", "starcoder2")
# Gated MLPs whose vLLM forward keeps the gate/up output referenced while down_proj allocates its output
# (`gate_up, _ = ...; x = self.act_fn(gate_up)`, v0.7.3:vllm/model_executor/models/qwen2.py:95-97, the same in
# internlm2.py:71-73, gemma2.py:81-83 and the other files listed in docs/facts/vllm-volta.md §3.7); Llama's MLP
# rebinds `x` and frees it first (llama.py:90-92; Mistral and Phi-3 run on it).
GATE_UP_KEPT_MLP_TYPES = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "qwen", "internlm2", "gemma", "gemma2",
                          "gemma3", "gemma3_text", "deepseek_v2", "deepseek_v3", "cohere", "baichuan", "granite",
                          "olmo", "olmo2", "stablelm", "minicpm", "exaone", "solar", "orion")
# Families whose activation peak is torch's allocated peak (v0.6.4.post1 worker.py; v0.7.3:vllm/utils.py:2036),
# where every live tensor counts exactly: the two refinements below apply to them, not to 0.5.4's mem_get_info.
ALLOCATED_PEAK_SIZINGS = ("v0-torch-peak-global", "v0-per-instance")
DEFAULT_CHUNKED_PREFILL_TOKENS = 512      # docs/facts/vllm-volta.md §2.1 --max-num-batched-tokens with chunked prefill
# ... 2048 in the per-instance releases (v0.6.6.post1:vllm/config.py:1427-1438, v0.7.3:vllm/config.py:1522-1532,
# v0.9.2:vllm/config.py:2242-2253); 0.6.4.post1 still profiled 512 tokens (#10517 at 35k: 0.06 GiB).
DEFAULT_CHUNKED_PREFILL_TOKENS_PER_INSTANCE = 2048
CHUNKED_PREFILL_AUTO_ABOVE = 32768        # docs/facts/vllm-volta.md §2.1 --enable-chunked-prefill
V1_LARGE_GPU_BYTES = 70 * GiB             # docs/facts/vllm-volta.md §2.2: V1 defaults switch at 70 GiB


@dataclass(frozen=True)
class KvEstimate:
    """One worker's KV sizing, as vLLM would compute it at start-up."""

    sizing: str                   # which formula family (see module docstring)
    block_size: int
    bytes_per_block: int
    num_gpu_blocks: int
    num_cpu_blocks: int
    tokens: int                   # num_gpu_blocks x block_size
    max_model_len: int
    max_concurrency_at_max_model_len: float  # tokens / max_model_len, as vLLM 0.6+ logs it
    budget_bytes: int             # total x gpu_memory_utilization
    weights_per_gpu: int
    peak_activation: int          # max(forward, sampler) of the profile run
    forward_activation: int
    sampler_activation: int
    non_torch: int
    kv_bytes: int                 # budget - peak, what the blocks are carved from
    profile_tokens: int           # max_num_batched_tokens the profile run used
    chunked_prefill: bool
    swap_space_bytes: int
    errors: List[str] = field(default_factory=list)  # what vLLM would raise at start-up
    # With pipeline stages the blocks above are one virtual engine's; the worker's whole cache is what vLLM logs.
    whole_gpu_blocks: Optional[int] = None
    whole_cpu_blocks: Optional[int] = None

    def log_line(self) -> str:
        """The start-up line of the 0.5.x executors (gpu_executor.py:102 / distributed_gpu_executor.py:56): the
        worker's whole cache, before the PP virtual engines divide it (v0.5.4 vllm/core/scheduler.py:287-293)."""
        gpu = self.num_gpu_blocks if self.whole_gpu_blocks is None else self.whole_gpu_blocks
        cpu = self.num_cpu_blocks if self.whole_cpu_blocks is None else self.whole_cpu_blocks
        return f"# GPU blocks: {gpu}, # CPU blocks: {cpu}"

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


def release_version(release: str) -> Tuple[int, ...]:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)(?:\.(\d+))?(?:\.post(\d+))?", str(release))
    if not match:
        raise ValueError(f"release {release!r} is not a vLLM version like 0.5.4")
    return tuple(int(part or 0) for part in match.groups())


def sizing_for_release(release: str, engine: Optional[str] = None) -> str:
    """Formula family of a release (docs/facts/vllm-volta.md §3.6); `engine` "V0"/"V1" where the release has both."""
    version = release_version(release)
    if engine is None:
        engine = "V0" if version[:4] <= (0, 10, 1, 1) else "V1"
    if engine == "V1":
        return "v1"
    if version[:3] <= (0, 6, 3):
        return "v0-mem-get-info"
    if version[:3] == (0, 6, 4):
        return "v0-torch-peak-global"
    return "v0-per-instance"


def kv_heads_per_gpu(model: Dict[str, Any], tensor_parallel_size: int) -> int:
    """max(1, total_kv_heads // TP): replicated when TP exceeds the KV heads (docs/facts/vllm-volta.md §3.3)."""
    return max(1, int(model["num_key_value_heads"]) // tensor_parallel_size)


def cache_block_size_bytes(model: Dict[str, Any], tensor_parallel_size: int = 1, block_size: int = 16,
                           cache_dtype: str = "half", pipeline_parallel_size: int = 1,
                           stage_layers: Optional[int] = None) -> int:
    """`CacheEngine.get_cache_block_size` (docs/facts/vllm-volta.md §3.3): bytes of one block on one GPU; the
    layers are the stage's (`stage_layers`, else an even share; 0.5.4 puts the remainder on the last stage)."""
    layers = stage_layers if stage_layers is not None else int(model["num_hidden_layers"]) // pipeline_parallel_size
    heads = kv_heads_per_gpu(model, tensor_parallel_size)
    return block_size * heads * int(model["head_dim"]) * layers * 2 * DTYPE_BYTES[cache_dtype]


def pipeline_stage_layers(num_layers: int, stages: int) -> List[int]:
    """0.5.4's split of the layers among pipeline stages (get_pp_indices, v0.5.4 vllm/distributed/utils.py:56-86,
    without VLLM_PP_LAYER_PARTITION): `layers // stages` each, the remainder on the last stage. The planner
    (module_utils/revive_plan/pipeline.py) sizes a group with it, the twin serves with it."""
    if stages < 1 or stages > num_layers:
        raise ValueError(f"{stages} pipeline stages for {num_layers} layers: every stage needs a layer")
    share = num_layers // stages
    return [share] * (stages - 1) + [share + num_layers % stages]


def pipeline_stage_weight_bytes(model: Dict[str, Any], layers: List[int], dtype_bytes: float) -> List[int]:
    """Weight bytes of each stage (all its TP ranks together): its layers' share of the parameters outside the
    embedding and the LM head, plus the embedding (first stage) and the LM head (last; the same matrix when the
    embeddings are tied, loaded on both). `dtype_bytes`: bytes per parameter once loaded (a quantized checkpoint
    keeps its packed size)."""
    if model.get("quantization"):
        dtype_bytes = int(model["weight_bytes"]) / max(int(model["parameter_count"]), 1)
    if len(layers) == 1:
        return [int(model["weight_bytes"]) if model.get("quantization")
                else int(int(model["parameter_count"]) * dtype_bytes)]
    vocab_matrix = int(model.get("vocab_size") or 0) * int(model["hidden_size"])
    head = vocab_matrix
    outside = int(model["parameter_count"]) - vocab_matrix - (0 if model.get("tie_word_embeddings") else head)
    per_layer = max(outside, 0) / sum(layers)
    last = len(layers) - 1
    return [int(math.ceil((count * per_layer + (vocab_matrix if index == 0 else 0) + (head if index == last else 0))
                          * dtype_bytes)) for index, count in enumerate(layers)]


def kv_bytes_per_token(model: Dict[str, Any], tensor_parallel_size: int = 1, cache_dtype: str = "half") -> int:
    return cache_block_size_bytes(model, tensor_parallel_size, 1, cache_dtype)


def weights_per_gpu_bytes(model: Dict[str, Any], tensor_parallel_size: int, dtype: str = "half") -> int:
    """Weight bytes on one GPU once loaded in `dtype` (quantized checkpoints keep their packed size)."""
    if model.get("quantization"):
        total = int(model["weight_bytes"])
    else:
        total = int(model["parameter_count"]) * DTYPE_BYTES[dtype]
    return math.ceil(total / tensor_parallel_size)


def hidden_sized_tensors_at_peak(model: Dict[str, Any], sizing: str = "v0-mem-get-info") -> int:
    """H-wide tensors alive at the MLP peak: 3, or 4 where the MLP keeps gate_up (allocated-peak families only).

    The fourth: while a layer runs, the model's layer loop still holds the layer's input
    (v0.7.3:vllm/model_executor/models/qwen2.py:348), so at the down projection the input, the residual, the
    MLP input and the MLP output are alive next to gate_up (2 I) and the activation (I).
    """
    if sizing in ALLOCATED_PEAK_SIZINGS and model.get("model_type") in GATE_UP_KEPT_MLP_TYPES:
        return 4
    return 3


def forward_activation_bytes(model: Dict[str, Any], tokens: int, tensor_parallel_size: int,
                             dtype: str = "half", sizing: str = "v0-mem-get-info") -> int:
    hidden = int(model["hidden_size"])
    intermediate = int(model["intermediate_size"]) * max(1, int(model.get("num_experts_per_tok") or 0))
    k = 2 if model.get("model_type") in NON_GATED_MLP_TYPES else 3
    h = hidden_sized_tensors_at_peak(model, sizing)
    return tokens * DTYPE_BYTES[dtype] * (h * hidden + k * intermediate // tensor_parallel_size)


def sampler_bytes_per_logit(sizing: str = "v0-mem-get-info", dtype: str = "half") -> int:
    """36 (0.5.4's count), plus the logits in the model's dtype where the peak is torch's allocated peak.

    execute_model keeps the model-dtype logits referenced while the sampler works on its float32 copy and
    sorts it (v0.7.3:vllm/worker/model_runner.py:1772-1785, vllm/model_executor/layers/sampler.py:270, 392).
    """
    return SAMPLER_BYTES_PER_LOGIT + (DTYPE_BYTES[dtype] if sizing in ALLOCATED_PEAK_SIZINGS else 0)


def sampler_activation_bytes(model: Dict[str, Any], num_seqs: int, sizing: str = "v0-mem-get-info",
                             dtype: str = "half") -> int:
    return num_seqs * int(model["vocab_size"]) * sampler_bytes_per_logit(sizing, dtype)


def non_torch_bytes(tensor_parallel_size: int, sizing: str) -> int:
    base = NON_TORCH_SINGLE_GPU if sizing == "v0-mem-get-info" else NON_TORCH_PER_INSTANCE_SINGLE_GPU
    if sizing == "v0-torch-peak-global":
        base += CUDA_CONTEXT_BYTES
    if tensor_parallel_size > 1:
        base += NCCL_BASE_BYTES + NCCL_PER_RANK_BYTES * tensor_parallel_size
    return base


def chunked_prefill_enabled(max_model_len: int, sizing: str, enable_chunked_prefill: Optional[bool] = None) -> bool:
    """V0: on when asked, or automatically above 32768 tokens (docs/facts/vllm-volta.md §2.1); V1: always."""
    if sizing == "v1":
        return True
    if enable_chunked_prefill is not None:
        return enable_chunked_prefill
    return max_model_len > CHUNKED_PREFILL_AUTO_ABOVE


def default_max_num_batched_tokens(max_model_len: int, sizing: str, chunked_prefill: bool,
                                   gpu_total_bytes: int = 0) -> int:
    """vLLM's default (docs/facts/vllm-volta.md §2.1 / §3.5; V1 docs/facts/vllm-volta.md §2.2)."""
    if sizing == "v1":
        return 8192 if gpu_total_bytes >= V1_LARGE_GPU_BYTES else 2048
    if chunked_prefill:
        if sizing == "v0-per-instance":
            return DEFAULT_CHUNKED_PREFILL_TOKENS_PER_INSTANCE
        return DEFAULT_CHUNKED_PREFILL_TOKENS
    return max(max_model_len, 2048)


def swap_space_check(swap_space_gib: float, tensor_parallel_size: int, host_ram_bytes: int,
                     error_fraction: float = 0.7, warn_fraction: float = 0.4) -> Tuple[str, str]:
    """vLLM's CacheConfig.verify_with_parallel_config: ("ok"|"warn"|"error", message). docs/facts/vllm-volta.md §3.4."""
    needed = swap_space_gib * GiB * tensor_parallel_size
    message = (f"{needed / GiB:.2f} GiB out of the {host_ram_bytes / GiB:.2f} GiB total CPU memory is "
               "allocated for the swap space.")
    if needed > error_fraction * host_ram_bytes:
        return "error", "Too large swap space. " + message
    if needed > warn_fraction * host_ram_bytes:
        return "warn", "Possibly too large swap space. " + message
    return "ok", message


def kv_cache_plan(
    model: Dict[str, Any],
    tensor_parallel_size: int,
    gpu_total_bytes: int,
    gpu_memory_utilization: float,
    swap_space_gib: float,
    max_num_batched_tokens: Optional[int] = None,
    max_num_seqs: int = 256,
    max_model_len: Optional[int] = None,
    block_size: int = 16,
    dtype: str = "half",
    release: str = "0.5.4",
    engine: Optional[str] = None,
    sizing: Optional[str] = None,
    enable_chunked_prefill: Optional[bool] = None,
    kv_cache_dtype: str = "auto",
    pipeline_parallel_size: int = 1,
    weights_bytes_per_gpu: Optional[int] = None,
    gpu_used_by_others_bytes: int = 0,
    stage_layers: Optional[int] = None,
) -> KvEstimate:
    """Estimate vLLM's KV cache for one worker of a replica (see the module docstring for the model).

    gpu_total_bytes: total memory of one GPU as CUDA reports it. dtype: the serving dtype (--dtype).
    max_model_len: defaults to the model's derived length. weights_bytes_per_gpu: override the weights
    (e.g. vLLM's logged "Loading model weights took" value). gpu_used_by_others_bytes: memory other
    processes hold; only the 0.6.4 formula subtracts it (its budget is global). stage_layers: the layers of the
    pipeline stage estimated (the engine keeps the fewest blocks of any stage, so the planner passes the largest).
    """
    sizing = sizing or sizing_for_release(release, engine)
    if sizing not in SIZING_FAMILIES:
        raise ValueError(f"sizing {sizing!r} is not one of {', '.join(SIZING_FAMILIES)}")
    if max_model_len is None:
        max_model_len = int(model.get("max_position_embeddings") or 2048)
    cache_dtype = dtype if kv_cache_dtype == "auto" else kv_cache_dtype
    chunked = chunked_prefill_enabled(max_model_len, sizing, enable_chunked_prefill)
    if max_num_batched_tokens is None:
        max_num_batched_tokens = default_max_num_batched_tokens(max_model_len, sizing, chunked, gpu_total_bytes)
    bytes_per_block = cache_block_size_bytes(model, tensor_parallel_size, block_size, cache_dtype,
                                             pipeline_parallel_size, stage_layers)
    weights = (weights_bytes_per_gpu if weights_bytes_per_gpu is not None
               else weights_per_gpu_bytes(model, tensor_parallel_size * pipeline_parallel_size, dtype))
    forward = forward_activation_bytes(model, max_num_batched_tokens, tensor_parallel_size, dtype, sizing)
    sampler = 0 if chunked else sampler_activation_bytes(model, max_num_seqs, sizing, dtype)
    peak_activation = max(forward, sampler)
    non_torch = non_torch_bytes(tensor_parallel_size, sizing)
    if sizing == "v0-torch-peak-global":
        non_torch += gpu_used_by_others_bytes
    budget = int(gpu_total_bytes * gpu_memory_utilization)
    kv_bytes = budget - weights - peak_activation - non_torch
    num_gpu_blocks = max(kv_bytes // bytes_per_block, 0)
    swap_bytes = 0 if sizing == "v1" else int(swap_space_gib * GiB)
    num_cpu_blocks = swap_bytes // bytes_per_block
    whole = {}
    if pipeline_parallel_size > 1 and sizing != "v1":
        whole = {"whole_gpu_blocks": int(num_gpu_blocks), "whole_cpu_blocks": int(num_cpu_blocks)}
        num_gpu_blocks //= pipeline_parallel_size
        num_cpu_blocks //= pipeline_parallel_size
    tokens = num_gpu_blocks * block_size
    errors: List[str] = []
    # Worker.raise_if_cache_size_invalid, 0.5.4 text (docs/facts/vllm-volta.md §3.1 step 5)
    if num_gpu_blocks <= 0:
        errors.append("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                      "when initializing the engine.")
    elif max_model_len > tokens:
        errors.append(f"The model's max seq len ({max_model_len}) is larger than the maximum number of tokens "
                      f"that can be stored in KV cache ({tokens}). Try increasing `gpu_memory_utilization` or "
                      "decreasing `max_model_len` when initializing the engine.")
    return KvEstimate(
        sizing=sizing, block_size=block_size, bytes_per_block=bytes_per_block,
        num_gpu_blocks=int(num_gpu_blocks), num_cpu_blocks=int(num_cpu_blocks), tokens=int(tokens),
        max_model_len=max_model_len, max_concurrency_at_max_model_len=round(tokens / max_model_len, 2),
        budget_bytes=budget, weights_per_gpu=int(weights), peak_activation=int(peak_activation),
        forward_activation=int(forward), sampler_activation=int(sampler), non_torch=int(non_torch),
        kv_bytes=int(kv_bytes), profile_tokens=int(max_num_batched_tokens), chunked_prefill=chunked,
        swap_space_bytes=swap_bytes, errors=errors, **whole)
