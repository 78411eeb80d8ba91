"""Engine arguments of vLLM 0.5.4, as its command line exposes them.

Every flag, type, default, choice and nargs below is taken from the generated table in
docs/facts/vllm-volta.md §2.1 (rows 21-98); tests/unit/test_twin_parser.py checks the parser
against that table. Help texts are the twin's own short descriptions.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, fields
from typing import List, Optional

# The quantization choices of 0.5.4's QUANTIZATION_METHODS, in its order, plus None
# (docs/facts/vllm-volta.md §2.1, row 56).
QUANTIZATION_METHODS = [
    "aqlm", "awq", "deepspeedfp", "fp8", "fbgemm_fp8", "marlin", "gptq_marlin_24", "gptq_marlin",
    "awq_marlin", "gptq", "squeezellm", "compressed-tensors", "bitsandbytes", "qqq",
]
DEVICE_OPTIONS = ["auto", "cuda", "neuron", "cpu", "openvino", "tpu", "xpu"]


def nullable_str(val: str) -> Optional[str]:
    """`""` and `"None"` mean None, as 0.5.4's nullable_str."""
    if not val or val == "None":
        return None
    return val


class StoreBoolean(argparse.Action):
    """`--enable-chunked-prefill [true|false]` (docs/facts/vllm-volta.md §2.1 row 79)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values.lower() == "true":
            setattr(namespace, self.dest, True)
        elif values.lower() == "false":
            setattr(namespace, self.dest, False)
        else:
            raise ValueError(f"Invalid boolean value: {values}. Expected 'true' or 'false'.")


@dataclass
class EngineArgs:
    """Defaults of 0.5.4's EngineArgs (docs/facts/vllm-volta.md §2.1)."""

    model: str = "facebook/opt-125m"
    served_model_name: Optional[List[str]] = None
    tokenizer: Optional[str] = None
    skip_tokenizer_init: bool = False
    tokenizer_mode: str = "auto"
    trust_remote_code: bool = False
    download_dir: Optional[str] = None
    load_format: str = "auto"
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization_param_path: Optional[str] = None
    seed: int = 0
    max_model_len: Optional[int] = None
    worker_use_ray: bool = False
    distributed_executor_backend: Optional[str] = None
    pipeline_parallel_size: int = 1
    tensor_parallel_size: int = 1
    max_parallel_loading_workers: Optional[int] = None
    block_size: int = 16
    enable_prefix_caching: bool = False
    disable_sliding_window: bool = False
    use_v2_block_manager: bool = False
    swap_space: int = 4
    cpu_offload_gb: float = 0
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: Optional[int] = None
    max_num_seqs: int = 256
    max_logprobs: int = 20
    disable_log_stats: bool = False
    revision: Optional[str] = None
    code_revision: Optional[str] = None
    rope_scaling: Optional[dict] = None
    rope_theta: Optional[float] = None
    tokenizer_revision: Optional[str] = None
    quantization: Optional[str] = None
    enforce_eager: bool = False
    max_context_len_to_capture: Optional[int] = None
    max_seq_len_to_capture: int = 8192
    disable_custom_all_reduce: bool = False
    tokenizer_pool_size: int = 0
    tokenizer_pool_type: str = "ray"
    tokenizer_pool_extra_config: Optional[str] = None
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    enable_prompt_adapter: bool = False
    max_prompt_adapters: int = 1
    max_prompt_adapter_token: int = 0
    fully_sharded_loras: bool = False
    lora_extra_vocab_size: int = 256
    long_lora_scaling_factors: Optional[str] = None
    lora_dtype: str = "auto"
    max_cpu_loras: Optional[int] = None
    device: str = "auto"
    ray_workers_use_nsight: bool = False
    num_gpu_blocks_override: Optional[int] = None
    num_lookahead_slots: int = 0
    model_loader_extra_config: Optional[str] = None
    ignore_patterns: List[str] = field(default_factory=list)
    preemption_mode: Optional[str] = None
    scheduler_delay_factor: float = 0.0
    enable_chunked_prefill: Optional[bool] = None
    guided_decoding_backend: str = "outlines"
    speculative_model: Optional[str] = None
    speculative_draft_tensor_parallel_size: Optional[int] = None
    num_speculative_tokens: Optional[int] = None
    speculative_max_model_len: Optional[int] = None
    speculative_disable_by_batch_size: Optional[int] = None
    ngram_prompt_lookup_max: Optional[int] = None
    ngram_prompt_lookup_min: Optional[int] = None
    spec_decoding_acceptance_method: str = "rejection_sampler"
    typical_acceptance_sampler_posterior_threshold: Optional[float] = None
    typical_acceptance_sampler_posterior_alpha: Optional[float] = None
    qlora_adapter_name_or_path: Optional[str] = None
    disable_logprobs_during_spec_decoding: Optional[bool] = None
    otlp_traces_endpoint: Optional[str] = None

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Rows 21-96 of docs/facts/vllm-volta.md §2.1, in that order."""
        d = EngineArgs
        add = parser.add_argument
        add("--model", type=str, default=d.model, help="Name or path of the model to serve.")
        add("--tokenizer", type=nullable_str, default=d.tokenizer, help="Tokenizer name or path.")
        add("--skip-tokenizer-init", action="store_true", help="Skip tokenizer initialisation.")
        add("--revision", type=nullable_str, default=None, help="Model revision.")
        add("--code-revision", type=nullable_str, default=None, help="Model code revision.")
        add("--tokenizer-revision", type=nullable_str, default=None, help="Tokenizer revision.")
        add("--tokenizer-mode", type=str, default=d.tokenizer_mode, choices=["auto", "slow"],
            help="Tokenizer mode.")
        add("--trust-remote-code", action="store_true", help="Trust remote code from Hugging Face.")
        add("--download-dir", type=nullable_str, default=d.download_dir, help="Download directory.")
        add("--load-format", type=str, default=d.load_format,
            choices=["auto", "pt", "safetensors", "npcache", "dummy", "tensorizer", "bitsandbytes"],
            help="Format of the model weights.")
        add("--dtype", type=str, default=d.dtype,
            choices=["auto", "half", "float16", "bfloat16", "float", "float32"],
            help="Data type of weights and activations.")
        add("--kv-cache-dtype", type=str, choices=["auto", "fp8", "fp8_e5m2", "fp8_e4m3"],
            default=d.kv_cache_dtype, help="Data type of the KV cache.")
        add("--quantization-param-path", type=nullable_str, default=None,
            help="JSON file with KV cache scaling factors.")
        add("--max-model-len", type=int, default=d.max_model_len, help="Model context length.")
        add("--guided-decoding-backend", type=str, default="outlines",
            choices=["outlines", "lm-format-enforcer"], help="Guided decoding engine.")
        add("--distributed-executor-backend", choices=["ray", "mp"], default=d.distributed_executor_backend,
            help="Backend for distributed serving.")
        add("--worker-use-ray", action="store_true", help="Deprecated; use --distributed-executor-backend=ray.")
        add("--pipeline-parallel-size", "-pp", type=int, default=d.pipeline_parallel_size,
            help="Number of pipeline stages.")
        add("--tensor-parallel-size", "-tp", type=int, default=d.tensor_parallel_size,
            help="Number of tensor parallel replicas.")
        add("--max-parallel-loading-workers", type=int, default=d.max_parallel_loading_workers,
            help="Load the model sequentially in this many batches.")
        add("--ray-workers-use-nsight", action="store_true", help="Profile Ray workers with nsight.")
        add("--block-size", type=int, default=d.block_size, choices=[8, 16, 32], help="Token block size.")
        add("--enable-prefix-caching", action="store_true", help="Enable automatic prefix caching.")
        add("--disable-sliding-window", action="store_true", help="Disable sliding window.")
        add("--use-v2-block-manager", action="store_true", help="Use the BlockSpaceManagerV2.")
        add("--num-lookahead-slots", type=int, default=d.num_lookahead_slots,
            help="Experimental scheduling config for speculative decoding.")
        add("--seed", type=int, default=d.seed, help="Random seed.")
        add("--swap-space", type=int, default=d.swap_space, help="CPU swap space per GPU (GiB).")
        add("--cpu-offload-gb", type=float, default=0, help="GiB of weights to offload to CPU per GPU.")
        add("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization,
            help="Fraction of GPU memory for the model executor.")
        add("--num-gpu-blocks-override", type=int, default=None, help="Override the profiled GPU block count.")
        add("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens,
            help="Maximum number of batched tokens per iteration.")
        add("--max-num-seqs", type=int, default=d.max_num_seqs, help="Maximum number of sequences per iteration.")
        add("--max-logprobs", type=int, default=d.max_logprobs, help="Maximum number of log probabilities.")
        add("--disable-log-stats", action="store_true", help="Disable logging statistics.")
        add("--quantization", "-q", type=nullable_str, choices=[*QUANTIZATION_METHODS, None],
            default=d.quantization, help="Method used to quantize the weights.")
        add("--rope-scaling", default=None, type=json.loads, help="RoPE scaling configuration in JSON.")
        add("--rope-theta", default=None, type=float, help="RoPE theta.")
        add("--enforce-eager", action="store_true", help="Always use eager-mode PyTorch (no CUDA graphs).")
        add("--max-context-len-to-capture", type=int, default=d.max_context_len_to_capture,
            help="Deprecated; use --max-seq-len-to-capture.")
        add("--max-seq-len-to-capture", type=int, default=d.max_seq_len_to_capture,
            help="Maximum sequence length covered by CUDA graphs.")
        add("--disable-custom-all-reduce", action="store_true", default=d.disable_custom_all_reduce,
            help="See ParallelConfig.")
        add("--tokenizer-pool-size", type=int, default=d.tokenizer_pool_size, help="Size of the tokenizer pool.")
        add("--tokenizer-pool-type", type=str, default=d.tokenizer_pool_type, help="Type of the tokenizer pool.")
        add("--tokenizer-pool-extra-config", type=nullable_str, default=d.tokenizer_pool_extra_config,
            help="Extra config for the tokenizer pool (JSON).")
        add("--enable-lora", action="store_true", help="Enable LoRA adapters.")
        add("--max-loras", type=int, default=d.max_loras, help="Max number of LoRAs in a single batch.")
        add("--max-lora-rank", type=int, default=d.max_lora_rank, help="Max LoRA rank.")
        add("--lora-extra-vocab-size", type=int, default=d.lora_extra_vocab_size,
            help="Maximum size of extra vocabulary in LoRA adapters.")
        add("--lora-dtype", type=str, default=d.lora_dtype, choices=["auto", "float16", "bfloat16", "float32"],
            help="Data type for LoRA.")
        add("--long-lora-scaling-factors", type=nullable_str, default=d.long_lora_scaling_factors,
            help="Long LoRA scaling factors.")
        add("--max-cpu-loras", type=int, default=d.max_cpu_loras, help="Maximum number of LoRAs in CPU memory.")
        add("--fully-sharded-loras", action="store_true", help="Use fully sharded LoRA layers.")
        add("--enable-prompt-adapter", action="store_true", help="Enable prompt adapters.")
        add("--max-prompt-adapters", type=int, default=d.max_prompt_adapters,
            help="Max number of prompt adapters in a batch.")
        add("--max-prompt-adapter-token", type=int, default=d.max_prompt_adapter_token,
            help="Max number of prompt adapter tokens.")
        add("--device", type=str, default=d.device, choices=DEVICE_OPTIONS, help="Device type.")
        add("--scheduler-delay-factor", type=float, default=d.scheduler_delay_factor,
            help="Delay (factor x previous prompt latency) before scheduling the next prompt.")
        add("--enable-chunked-prefill", action=StoreBoolean, default=d.enable_chunked_prefill, nargs="?",
            const="True", help="Chunk prefills by max_num_batched_tokens.")
        add("--speculative-model", type=nullable_str, default=d.speculative_model,
            help="Draft model for speculative decoding.")
        add("--num-speculative-tokens", type=int, default=d.num_speculative_tokens,
            help="Number of speculative tokens.")
        add("--speculative-draft-tensor-parallel-size", "-spec-draft-tp", type=int,
            default=d.speculative_draft_tensor_parallel_size, help="TP size of the draft model.")
        add("--speculative-max-model-len", type=int, default=d.speculative_max_model_len,
            help="Maximum sequence length of the draft model.")
        add("--speculative-disable-by-batch-size", type=int, default=d.speculative_disable_by_batch_size,
            help="Disable speculation above this many enqueued requests.")
        add("--ngram-prompt-lookup-max", type=int, default=d.ngram_prompt_lookup_max,
            help="Max n-gram window for ngram prompt lookup.")
        add("--ngram-prompt-lookup-min", type=int, default=d.ngram_prompt_lookup_min,
            help="Min n-gram window for ngram prompt lookup.")
        add("--spec-decoding-acceptance-method", type=str, default=d.spec_decoding_acceptance_method,
            choices=["rejection_sampler", "typical_acceptance_sampler"],
            help="Acceptance method for draft tokens.")
        add("--typical-acceptance-sampler-posterior-threshold", type=float,
            default=d.typical_acceptance_sampler_posterior_threshold, help="Posterior probability threshold.")
        add("--typical-acceptance-sampler-posterior-alpha", type=float,
            default=d.typical_acceptance_sampler_posterior_alpha, help="Entropy scaling factor.")
        add("--disable-logprobs-during-spec-decoding", type=bool,
            default=d.disable_logprobs_during_spec_decoding, help="Skip logprobs during speculative decoding.")
        add("--model-loader-extra-config", type=nullable_str, default=d.model_loader_extra_config,
            help="Extra config for the model loader (JSON).")
        add("--ignore-patterns", action="append", type=str, default=[],
            help="Patterns to ignore when loading the model.")
        add("--preemption-mode", type=str, default=None, help="'recompute' or 'swap'.")
        add("--served-model-name", nargs="+", type=str, default=None, help="Model name(s) used in the API.")
        add("--qlora-adapter-name-or-path", type=str, default=None, help="Name or path of the QLoRA adapter.")
        add("--otlp-traces-endpoint", type=str, default=None, help="OpenTelemetry traces endpoint.")
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        names = [f.name for f in fields(cls)]
        return cls(**{name: getattr(args, name) for name in names if hasattr(args, name)})


@dataclass
class AsyncEngineArgs(EngineArgs):
    engine_use_ray: bool = False
    disable_log_requests: bool = False

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:  # type: ignore[override]
        """Rows 97-98 of docs/facts/vllm-volta.md §2.1 after the EngineArgs rows."""
        parser = EngineArgs.add_cli_args(parser)
        parser.add_argument("--engine-use-ray", action="store_true", help="Run the engine in a Ray actor.")
        parser.add_argument("--disable-log-requests", action="store_true", help="Disable logging requests.")
        return parser
