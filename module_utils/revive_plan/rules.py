"""The planner's rules: which release, dtype, quantization, context length, engine flags and swap space a
model gets on a GPU set, and the combinations that will not run (each refusal says why and what to change).

Sources: docs/field-report.md (the field report), docs/facts/vllm-volta.md (vLLM on Volta), "data" =
data/vllm-releases.yml. Each rule has a test in tests/unit/test_plan.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ansible.module_utils.revive_kv import GiB
from ansible.module_utils.revive_plan.gpus import GpuSet
from ansible.module_utils.revive_plan.inputs import (
    Decisions,
    Overrides,
    PackageSource,
    PlanRefusal,
    PlanRequest,
    Workload,
)
from ansible.module_utils.revive_releases import Release, ReleaseData, ReleaseDataError, parse_cc

# docs/field-report.md ('Launch command')
NOTES_MAX_MODEL_LEN = 4096
NOTES_SWAP_SPACE_GIB = 16
NOTES_BATCHED_TOKENS = 8192
VOLTA_GPU_MEMORY_UTILIZATION = 0.92
HOST_SWAP_FRACTION = 0.4           # vLLM warns above 40 % (docs/facts/vllm-volta.md §3.4); bounded host-wide here


@dataclass(frozen=True)
class EngineSettings:
    """What the rules decided before the layout: the release and the server settings every replica shares."""

    release: Release
    engine: str
    attention_backend: str
    dtype: str
    conversion: Optional[Dict[str, str]]
    quantization: Optional[str]
    max_model_len: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    enforce_eager: bool
    kv_sizing: str
    typical_sequence_tokens: int   # typical prompt + output tokens of one request
    volta: bool                    # CC < 8.0
    long_max_model_len: bool = False  # max_model_len above the model's derived length (VLLM_ALLOW_LONG_MAX_MODEL_LEN)


def release_for(gpus: GpuSet, releases: ReleaseData, overrides: Overrides, decisions: Decisions,
                source: PackageSource) -> Release:
    cc_text = f"{gpus.cc[0]}.{gpus.cc[1]}"
    if overrides.vllm_version:
        version = overrides.vllm_version
        why = "pinned by the operator"
        source_text = "operator override"
    else:
        try:
            version, why = releases.default_release(gpus.cc)
        except ReleaseDataError as exc:
            raise PlanRefusal(f"{gpus.name} (CC {cc_text}): {exc}. No vLLM release in the data runs on it.",
                              "data default_release_by_cc") from None
        source_text = "data default_release_by_cc; docs/runtime-install.md"
    if gpus.cc < (8, 0):
        status = releases.volta_status(version, gpus.cc)
        if status["status"] == "refused":
            raise PlanRefusal(f"vLLM {version} cannot run on {gpus.name} (CC {cc_text}): {status['reason']}. "
                              "Use the Volta default (no pin) or 0.5.4 from a mirror that supplies it.",
                              "data volta_support")
        if status["status"] == "experimental":
            decisions.warnings.append(f"vLLM {version} on CC {cc_text} is experimental: {status['reason']}")
    try:
        release = releases.release(version)
    except ReleaseDataError as exc:
        raise PlanRefusal(str(exc), "data releases") from None
    if gpus.cc < release.min_compute_capability:
        low = release.min_compute_capability
        raise PlanRefusal(f"vLLM {version} ships no kernels for {gpus.name} (CC {cc_text}); it needs CC "
                          f"{low[0]}.{low[1]} or newer.",
                          "data min_compute_capability; docs/facts/vllm-volta.md §1.1")
    engine = release.engine_for(gpus.cc)
    if engine == "none":
        raise PlanRefusal(f"vLLM {version} has no engine for CC {cc_text}.", "data engine_by_cc")
    branch = gpus.facts.get("driver_branch")
    need = int(release.driver["min_branch"])
    if branch is not None and int(branch) < need:
        raise PlanRefusal(f"driver {gpus.facts.get('driver_version')} (R{branch}) is older than R{need}, which "
                          f"vLLM {version} (CUDA {release.pins.get('cuda')}) needs. Upgrade the driver or pin an "
                          "older release.", "data driver.min_branch")
    cuda_min = release.driver.get("cuda_driver_min")
    cuda_have = gpus.facts.get("cuda_driver_version")
    if cuda_min and cuda_have and parse_cc(str(cuda_have)) < parse_cc(str(cuda_min)):
        raise PlanRefusal(f"the driver supports CUDA {cuda_have}; vLLM {version} needs CUDA {cuda_min} or newer.",
                          "data driver.cuda_driver_min")
    gaps = release.kernel_gaps(gpus.cc)
    if gaps:
        raise PlanRefusal(f"vLLM {version} cannot run on {gpus.name} (CC {cc_text}): its compiled dependencies "
                          f"{'; '.join(gaps)} carry no code for sm_{gpus.cc[0]}{gpus.cc[1]}. Pin a release whose "
                          "wheels have it (bin/revive plan lists the default).", "data kernels (wheel fatbin scan)")
    installability = release.installability
    if installability is not None and not installability.pypi and source.is_public_index:
        raise PlanRefusal(f"vLLM {version} cannot be installed from PyPI: {installability.reason}. What you can do: "
                          f"{installability.remedy}.", "data installability; docs/runtime-install.md")
    if version == "0.5.4":
        why += ("; the field notes' measured release (their table was taken on it), installed from "
                f"{source.describe()}, which must supply its whole lock")
    decisions.add("vllm_version", version, f"{why}", source_text)
    return release


def dtype_for(model: Dict[str, Any], gpus: GpuSet, release: Release, overrides: Overrides,
              decisions: Decisions) -> Tuple[str, Optional[Dict[str, str]]]:
    weights = str(model.get("weights_dtype") or "F16")
    quantized = bool(model.get("quantization"))
    if gpus.cc < (8, 0):
        conversion = None
        if weights == "BF16" and not quantized:
            if not overrides.allow_bf16_conversion:
                raise PlanRefusal(
                    f"{model.get('path')}: the weights are BF16 and {gpus.name} (CC {gpus.cc[0]}.{gpus.cc[1]}) has "
                    "no BF16; conversion to FP16 is disabled. Convert the checkpoint (the model sync role does) "
                    "or allow conversion.",
                    "docs/facts/vllm-volta.md §1.4; docs/field-report.md ('The hardware') (no BF16)")
            conversion = {"from": "BF16", "to": "F16"}
            decisions.warnings.append(
                f"{model.get('path')}: BF16 weights on a GPU without BF16: the sync role must convert them to FP16 "
                "(values beyond FP16's range overflow; vLLM would cast at load with --dtype half)")
        fallback = "0.9.0+ would fall back to fp16 with a warning" if release.get("bf16_auto_fallback") else \
            "0.5.4 never falls back: `auto` with BF16 weights dies at worker start"
        decisions.add("dtype", "half", f"CC {gpus.cc[0]}.{gpus.cc[1]} has no BF16; {fallback}. Explicit half "
                      "is right for FP16, BF16 (converted) and FP32 checkpoints alike.",
                      "docs/facts/vllm-volta.md §1.4; docs/field-report.md ('Launch command') (--dtype float16)")
        return "half", conversion
    dtype = "bfloat16" if weights == "BF16" else "float16"
    decisions.add("dtype", dtype, f"CC {gpus.cc[0]}.{gpus.cc[1]} runs {weights} natively: the checkpoint's dtype "
                  "is kept (FP32 checkpoints are served in FP16, as vLLM's auto does).",
                  "docs/facts/vllm-volta.md §1.4")
    return dtype, None


def quantization_for(model: Dict[str, Any], gpus: GpuSet, release: Release, decisions: Decisions) -> Optional[str]:
    quant = model.get("quantization")
    if not quant:
        return None
    method = str(quant.get("method") or "")
    minimum = release.quantization_min_cc.get(method)
    cc10 = gpus.cc[0] * 10 + gpus.cc[1]
    if minimum is None:
        raise PlanRefusal(f"{model.get('path')}: quantization {method!r} is not supported by vLLM "
                          f"{release.version}. Use an FP16 checkpoint or a supported scheme.",
                          "docs/facts/vllm-volta.md §7.3")
    if cc10 < minimum:
        raise PlanRefusal(
            f"{model.get('path')}: {method} checkpoints need CC {minimum // 10}.{minimum % 10}; {gpus.name} is CC "
            f"{gpus.cc[0]}.{gpus.cc[1]} (vLLM: 'The quantization method {method} is not supported for the current "
            f"GPU. Minimum capability: {minimum}. Current capability: {cc10}.'). Use FP16 or GPTQ weights.",
            "docs/facts/vllm-volta.md §7.3; data quantization_min_cc")
    if method == "gptq" and gpus.cc < (8, 0):
        decisions.warnings.append(
            "GPTQ on Volta: the notes measured ~30 % slower than FP16 with jittery P99 (exllama kernels, no "
            "Marlin below CC 8.0); prefer FP16 weights when they fit")
    decisions.add("quantization", method, f"read from the checkpoint's quantization_config; {method} needs CC "
                  f"{minimum // 10}.{minimum % 10}, this GPU is {gpus.cc[0]}.{gpus.cc[1]}",
                  "docs/facts/vllm-volta.md §7.3"
                  + ("; docs/field-report.md ('Failures met') 4" if method == "gptq" else ""))
    return method


def check_model(model: Dict[str, Any], gpus: GpuSet, release: Release, backend: str) -> None:
    head_sizes = release.get("paged_attention_head_sizes") or []
    if head_sizes and int(model["head_dim"]) not in head_sizes and release.engine_for(gpus.cc) == "V0":
        raise PlanRefusal(
            f"{model.get('path')}: head size {model['head_dim']} is not supported by PagedAttention in vLLM "
            f"{release.version} (supported: {head_sizes}).", "docs/facts/vllm-volta.md §1.3")
    if model.get("attn_logit_softcapping") and backend == "XFORMERS" and not release.get("xformers_logit_softcapping"):
        if release.get("xformers_logit_softcapping_failure") == "ignored-with-warning":
            raise PlanRefusal(
                f"{model.get('path')}: the model uses attention logit soft-capping (Gemma-2) and vLLM "
                f"{release.version} runs xFormers on CC {gpus.cc[0]}.{gpus.cc[1]}, which serves it without the "
                "soft-capping ('XFormers does not support logits soft cap. Outputs may be slightly off.'): its "
                "answers would differ from the model's. Pick another model for this GPU.",
                "docs/facts/vllm-volta.md §7.4")
        raise PlanRefusal(
            f"{model.get('path')}: the model uses attention logit soft-capping (Gemma-2) and vLLM "
            f"{release.version} runs xFormers on CC {gpus.cc[0]}.{gpus.cc[1]}: 'XFormers does not support attention "
            "logits soft capping.' Pick another model for this GPU.",
            "docs/facts/vllm-volta.md §1.3, §7.4 (#9922)")


LONG_MAX_MODEL_LEN_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def max_model_len_for(model: Dict[str, Any], workload: Workload, decisions: Decisions,
                      allow_long: bool = False) -> int:
    derived = model.get("max_position_embeddings")
    if workload.max_model_len is not None:
        value = int(workload.max_model_len)
        if derived and value > int(derived):
            if not allow_long:
                raise PlanRefusal(
                    f"max-model-len {value} is above the model's derived {derived}; vLLM refuses ('User-specified "
                    f"max_model_len ({value}) is greater than the derived max_model_len ({derived})'). Use at most "
                    f"{derived}, or set allow_long_max_model_len (--allow-long-max-model-len) if the model's "
                    "positions really reach further (a rope scaling its config.json does not declare).",
                    "docs/facts/vllm-volta.md §2.1 --max-model-len")
            decisions.add("max_model_len", value, f"set by the operator above the model's derived {derived}, with "
                          f"allow_long_max_model_len: the replicas get {LONG_MAX_MODEL_LEN_ENV}=1, which lets vLLM "
                          "accept it", "docs/facts/vllm-volta.md §2.1 --max-model-len (v0.5.4:vllm/config.py:1459)")
            decisions.warnings.append(
                f"max_model_len {value} is above the model's {derived} positions ({LONG_MAX_MODEL_LEN_ENV}=1): "
                "beyond its trained context the model's output degrades or becomes garbage unless it really "
                "supports the longer context; check the model card")
            return value
        decisions.add("max_model_len", value, "set by the workload/operator", "operator override")
        return value
    value = min(NOTES_MAX_MODEL_LEN, int(derived)) if derived else NOTES_MAX_MODEL_LEN
    decisions.add("max_model_len", value,
                  "the notes' workload: under 0.1 % of requests exceed 4096 tokens, and 8K/16K halve the "
                  "concurrency of full-length sequences and raise 0.5.4's profile peak (it runs max-model-len "
                  "tokens)" + (f"; capped by the model's {derived}" if derived and derived < NOTES_MAX_MODEL_LEN
                              else ""), "docs/field-report.md ('Launch command'); docs/facts/vllm-volta.md §3.2")
    return value


def swap_space_for(settings: EngineSettings, tensor_parallel_size: int, replicas: int, request: PlanRequest,
                   decisions: Decisions) -> Optional[float]:
    """--swap-space per GPU: the field report's 16 GiB bounded by host RAM, the operator's, or none."""
    release, engine = settings.release, settings.engine
    host_ram_bytes, overrides = request.host_ram_bytes, request.overrides
    swap_type = release.get("swap_space_type")
    if swap_type == "none" or release.argument("--swap-space") is None:
        decisions.add("swap_space", None, f"vLLM {release.version} has no --swap-space (removed in 0.18.0)",
                      "docs/facts/vllm-volta.md §2.2")
        return None
    if engine == "V1":
        decisions.add("swap_space", None, "the V1 engine preempts by recompute and allocates no CPU swap; the flag "
                      "would only be ignored", "docs/facts/vllm-volta.md §2.2, §3.6")
        return None
    workers = tensor_parallel_size * replicas
    limits = release.get("swap_space_limits") or {}
    if overrides.swap_space is not None:
        swap = float(overrides.swap_space)
        if swap_type == "int" and not swap.is_integer():
            raise PlanRefusal(f"--swap-space {swap:g}: vLLM {release.version} takes whole GiB (int).",
                              "docs/facts/vllm-volta.md §2.1")
        if host_ram_bytes:
            pinned = swap * GiB * workers
            if pinned > float(limits.get("error_fraction", 0.7)) * host_ram_bytes:
                raise PlanRefusal(
                    f"--swap-space {swap:g} pins {pinned / GiB:.0f} GiB ({workers} workers x {swap:g} GiB) of "
                    f"{host_ram_bytes / GiB:.0f} GiB host RAM; vLLM refuses above 70 % ('Too large swap space'). "
                    "Lower it (0 is allowed).", "docs/facts/vllm-volta.md §3.4")
            if pinned > HOST_SWAP_FRACTION * host_ram_bytes:
                decisions.warnings.append(f"swap space pins {pinned / GiB:.0f} GiB of {host_ram_bytes / GiB:.0f} GiB "
                                          "host RAM at start (over 40 %)")
        decisions.add("swap_space", swap, "set by the operator", "operator override")
        return swap
    if not host_ram_bytes:
        swap = float(release.defaults.get("swap_space", 4))
        decisions.warnings.append("host RAM unknown: swap space left at vLLM's default instead of the notes' 16 GiB")
        decisions.add("swap_space", swap, "host RAM unknown; vLLM's default", "docs/facts/vllm-volta.md §2.1")
        return swap
    bound = math.floor(HOST_SWAP_FRACTION * host_ram_bytes / GiB / workers)
    swap = float(min(NOTES_SWAP_SPACE_GIB, bound))
    decisions.add("swap_space", swap, f"the notes' 16 GiB per GPU, bounded so the {workers} workers pin at most 40 % "
                  f"of the {host_ram_bytes / GiB:.0f} GiB host RAM ({swap * workers:g} GiB): swap is pinned host RAM "
                  "allocated by every worker at start; plain n=1 chat traffic preempts by recompute and never uses it",
                  "docs/field-report.md ('Launch command'); docs/facts/vllm-volta.md §3.4")
    return swap


def engine_settings(model: Dict[str, Any], gpus: GpuSet, releases: ReleaseData, request: PlanRequest,
                    decisions: Decisions) -> EngineSettings:
    """Every rule that does not depend on the layout, in the order the plan's reasons list them."""
    overrides, workload = request.overrides, request.workload
    release = release_for(gpus, releases, overrides, decisions, request.source)
    engine = release.engine_for(gpus.cc)
    backend = release.attention_backend_for(gpus.cc)
    volta = gpus.cc < (8, 0)
    dtype, conversion = dtype_for(model, gpus, release, overrides, decisions)
    quant = quantization_for(model, gpus, release, decisions)
    check_model(model, gpus, release, backend)
    decisions.add("attention_backend", backend,
                  "FlashAttention-2 needs CC >= 8.0; vLLM selects xFormers on Volta and Turing" if volta
                  else "FlashAttention-2 on CC >= 8.0", "docs/facts/vllm-volta.md §1.3")
    decisions.add("engine", engine, "CC < 8.0 runs the V0 engine (V1 needs 8.0 before 0.10.2)" if volta and
                  engine == "V0" else f"the release's engine for CC {gpus.cc[0]}.{gpus.cc[1]}",
                  "docs/facts/vllm-volta.md §1.1")
    max_model_len = max_model_len_for(model, workload, decisions, request.overrides.allow_long_max_model_len)
    eager = volta
    if eager:
        decisions.add("enforce_eager", True, "CUDA graphs are captured after the KV cache is sized, outside "
                      "--gpu-memory-utilization (1-3 GiB per GPU); capture OOM'd at start on the notes' box",
                      "docs/field-report.md ('Failures met') 1; docs/facts/vllm-volta.md §1.5, §7.2")
    else:
        decisions.add("enforce_eager", False, "CUDA graphs are reliable on CC >= 8.0; their 1-3 GiB fit in the "
                      "headroom the release's default utilisation leaves", "docs/facts/vllm-volta.md §1.5")
    if overrides.gpu_memory_utilization is not None:
        utilization = float(overrides.gpu_memory_utilization)
        decisions.add("gpu_memory_utilization", utilization, "set by the operator", "operator override")
    elif volta:
        utilization = VOLTA_GPU_MEMORY_UTILIZATION
        decisions.add("gpu_memory_utilization", utilization, "0.95 OOM'd at start; 0.92 leaves 8 % per card for "
                      "what vLLM does not budget (CUDA context, fragmentation)",
                      "docs/field-report.md ('Launch command'), ('Failures met') 1")
    else:
        utilization = float(release.defaults["gpu_memory_utilization"])
        decisions.add("gpu_memory_utilization", utilization, "the release default: leaves room for CUDA graphs, "
                      "which are captured outside the budget", "docs/facts/vllm-volta.md §1.5, §7.2")
    if not 0 < utilization <= 1:
        raise PlanRefusal(f"gpu-memory-utilization {utilization} must be in (0, 1] ('GPU memory utilization must "
                          "be less than 1.0').", "docs/facts/vllm-volta.md §2.2")
    batched = int(overrides.max_num_batched_tokens) if overrides.max_num_batched_tokens else \
        max(max_model_len, NOTES_BATCHED_TOKENS)
    if batched < max_model_len:
        raise PlanRefusal(
            f"max_num_batched_tokens ({batched}) is smaller than max_model_len ({max_model_len}): vLLM refuses to "
            "start without chunked prefill. Raise --max-num-batched-tokens or lower --max-model-len.",
            "docs/facts/vllm-volta.md §3.5")
    return EngineSettings(
        release=release, engine=engine, attention_backend=backend, dtype=dtype, conversion=conversion,
        quantization=quant, max_model_len=max_model_len, max_num_batched_tokens=batched,
        gpu_memory_utilization=utilization, enforce_eager=eager, kv_sizing=release.kv_sizing_for(engine),
        typical_sequence_tokens=workload.typical_prompt_tokens + workload.slo_output_tokens, volta=volta,
        long_max_model_len=bool(model.get("max_position_embeddings"))
        and max_model_len > int(model["max_position_embeddings"]))

