"""Shard dtypes and the BF16 policy: BF16 on GPUs without BF16 (Volta) is refused or converted."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple


# Safetensors headers are parsed by revive_model (module_utils/revive_model.py), never here.
def safetensors_dtypes(path: str) -> Tuple[str, ...]:
    """The dtypes of one shard's tensors, from its header (revive_model validates offsets against the size)."""
    from ansible.module_utils.revive_model import read_safetensors_header

    return tuple(sorted({tensor.dtype for tensor in read_safetensors_header(path).tensors}))


@dataclass(frozen=True)
class DtypeDecision:
    convert_bf16: bool
    bf16_files: Tuple[str, ...]
    dtypes: Tuple[str, ...]
    error: Optional[str] = None


def decide_dtypes(dtypes_by_file: Dict[str, Tuple[str, ...]], *, gpu_bf16: bool, convert_bf16: bool,
                  allowed_dtypes: Sequence[str], where: str) -> DtypeDecision:
    found = tuple(sorted({dtype for dtypes in dtypes_by_file.values() for dtype in dtypes}))
    bf16_files = tuple(sorted(path for path, dtypes in dtypes_by_file.items() if "BF16" in dtypes))
    convert = bool(bf16_files) and not gpu_bf16 and convert_bf16
    if bf16_files and not gpu_bf16 and not convert_bf16:
        shown = ", ".join(bf16_files[:4]) + (f" and {len(bf16_files) - 4} more" if len(bf16_files) > 4 else "")
        return DtypeDecision(False, bf16_files, found, error=(
            f"the model has BF16 weights ({shown}) but the GPUs of {where} have no BF16 (compute capability "
            f"below 8.0, e.g. V100); vLLM 0.5.4 refuses them with 'Bfloat16 is only supported on GPUs with "
            f"compute capability of at least 8.0' (docs/facts/vllm-volta.md §1.4). Sync an FP16 "
            f"revision of the model, or set model_sync_convert_bf16: true to convert it to FP16 on the node "
            f"(values beyond FP16's ±65504 are counted and reported)."))
    effective = {"F16" if dtype == "BF16" and convert else dtype for dtype in found}
    if allowed_dtypes:
        unwanted = sorted(effective - set(allowed_dtypes))
        if unwanted:
            files = sorted(path for path, dtypes in dtypes_by_file.items()
                           if {"F16" if d == "BF16" and convert else d for d in dtypes} & set(unwanted))
            return DtypeDecision(convert, bf16_files, found, error=(
                f"the model has tensors of dtype {', '.join(unwanted)} (in {', '.join(files)}) but the plan for "
                f"{where} allows only {', '.join(allowed_dtypes)}. Sync a revision in an allowed dtype, or "
                f"change model_sync_allowed_dtypes to what the plan's --dtype can load."))
    return DtypeDecision(convert, bf16_files, found)


@dataclass(frozen=True)
class DtypePolicy:
    gpu_bf16: bool
    convert_bf16: bool
    allowed_dtypes: Tuple[str, ...]
