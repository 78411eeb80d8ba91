"""Model facts from a model directory, without torch and without reading weights.

What is read: ``config.json``, ``generation_config.json``, the names of the tokenizer files, the
safetensors index and, for every shard, its 8-byte little-endian header length and JSON header
(tensor names, dtypes, shapes, ``data_offsets``). Tensor data is never read, so a 40 GB model is
inspected in milliseconds.

A bare ``config.json`` (the path of the file, or a directory holding no weights) is accepted for
what-if planning: the parameter count then comes from the architecture (``architecture_parameters``),
and the weight bytes from that count and the checkpoint dtype (or the quantization scheme).

Per-architecture parameter formula (``architecture_parameters``), with H = hidden_size,
I = intermediate_size, L = num_hidden_layers, V = vocab_size, d = head_dim, q = num_attention_heads,
kv = num_key_value_heads:

* llama-like decoders (llama, mistral, qwen2, internlm2, internlm, baichuan, yi, gemma, gemma2,
  deepseek, phi3, mixtral …): embeddings ``V·H``; per layer attention ``H·q·d + 2·H·kv·d + q·d·H``
  (plus ``q·d + 2·kv·d`` when the QKV projection has a bias: qwen2 always, llama/mistral with
  ``attention_bias``, internlm2 with ``bias``; plus ``H`` for an output bias); gated MLP ``3·H·I``
  (mixtral: ``E·3·H·I + H·E`` for E local experts and the router); RMSNorm weights ``2·H`` per layer
  (gemma2: ``4·H``) and ``H`` for the final norm; ``lm_head`` ``V·H`` unless the embeddings are tied.
* gpt_neox: fused QKV ``3·H·H + 3·H``, dense ``H·H + H``, MLP ``2·H·I + I + H``, two LayerNorms with
  bias ``4·H`` per layer, final LayerNorm ``2·H``, ``embed_in`` and ``embed_out`` ``V·H`` each.
* gpt2 / gpt_bigcode: learned positions ``n_positions·H`` added to the embeddings, fused attention
  with biases, non-gated MLP with biases, tied ``lm_head`` (gpt_bigcode with multi-query: kv = 1).

Checked against public parameter counts in tests/unit/test_model_inspect_formula.py (Llama-2-7B
6 738 415 616, Meta-Llama-3-8B 8 030 261 248, Mistral-7B 7 241 732 096, Qwen2-7B 7 615 616 512,
Llama-2-70B 68 976 648 192, gpt-neox-20b 20 554 567 680).

Errors are ``ModelInspectError``: the message names the file, says what is wrong and how to fix it.
"""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Older AutoGPTQ/AutoAWQ checkpoints keep the scheme beside config.json; vLLM 0.5.4 reads these too.
QUANT_CONFIG_FILES = ("quantize_config.json", "quant_config.json")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.json", "merges.txt", "vocab.txt", "added_tokens.json", "spiece.model",
    "tokenizer.tiktoken", "qwen.tiktoken",
)
# safetensors refuses headers above 100 MB; anything larger is corruption, not a model.
MAX_HEADER_BYTES = 100 * 1024 * 1024

DTYPE_BYTES: Dict[str, int] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
TORCH_DTYPE_TO_SAFETENSORS = {
    "float16": "F16", "half": "F16", "bfloat16": "BF16", "float32": "F32", "float": "F32",
    "float64": "F64",
}
# Buffers some checkpoints carry that vLLM skips when loading; they do not decide the weight dtype.
IGNORED_TENSOR_SUFFIXES = ("rotary_emb.inv_freq", "attn.masked_bias", "attn.bias")

# HF defaults for tie_word_embeddings when config.json omits it (PretrainedConfig defaults to True;
# these model classes override it).
UNTIED_BY_DEFAULT = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "internlm2", "internlm", "baichuan",
    "gpt_neox", "deepseek", "deepseek_v2", "phi3", "yi", "falcon",
}
LLAMA_LIKE = {
    "llama", "mistral", "mixtral", "qwen2", "internlm2", "internlm", "baichuan", "yi", "gemma",
    "gemma2", "deepseek", "phi3", "olmo", "stablelm", "exaone", "granite", "cohere", "aquila",
    "xverse", "minicpm", "starcoder2", "qwen",
}


class ModelInspectError(Exception):
    """A model directory or file that cannot be used; the message says where and how to fix it."""


@dataclass
class TensorInfo:
    name: str
    dtype: str
    shape: List[int]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass
class ShardInfo:
    file: str
    bytes: int
    header_bytes: int
    tensors: List[TensorInfo] = field(default_factory=list)


def read_safetensors_header(path: str) -> ShardInfo:
    """Read one shard's header and check it against the file size; never reads tensor data."""
    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise ModelInspectError(
                    f"{path}: corrupt safetensors header: the file is {size} bytes, shorter than the "
                    f"8-byte header length. Re-download or re-sync {name}.")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len == 0 or header_len > MAX_HEADER_BYTES or header_len > size - 8:
                raise ModelInspectError(
                    f"{path}: corrupt safetensors header: it declares a {header_len}-byte JSON header "
                    f"but the file has {size - 8} bytes after the length field. The file is truncated "
                    f"or not safetensors; re-download or re-sync {name}.")
            raw = handle.read(header_len)
    except OSError as exc:
        raise ModelInspectError(f"{path}: cannot read the shard ({exc.strerror}). "
                                "Check that the file exists and is readable by this user.") from exc
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelInspectError(
            f"{path}: corrupt safetensors header: the {header_len}-byte header is not JSON ({exc}). "
            f"Re-download or re-sync {name}.") from exc
    if not isinstance(header, dict):
        raise ModelInspectError(f"{path}: corrupt safetensors header: expected a JSON object. "
                                f"Re-download or re-sync {name}.")
    data_bytes = size - 8 - header_len
    shard = ShardInfo(file=name, bytes=size, header_bytes=header_len)
    for tensor_name, entry in header.items():
        if tensor_name == "__metadata__":
            continue
        shard.tensors.append(_parse_tensor_entry(path, name, tensor_name, entry, data_bytes))
    return shard


def _parse_tensor_entry(path: str, name: str, tensor_name: str, entry: Any, data_bytes: int) -> TensorInfo:
    fix = f"Re-download or re-sync {name}."
    try:
        dtype = str(entry["dtype"])
        shape = [int(dim) for dim in entry["shape"]]
        begin, end = (int(offset) for offset in entry["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelInspectError(
            f"{path}: corrupt safetensors header: tensor {tensor_name!r} lacks dtype, shape or "
            f"data_offsets. {fix}") from exc
    if begin < 0 or end < begin:
        raise ModelInspectError(
            f"{path}: corrupt safetensors header: tensor {tensor_name!r} has data_offsets "
            f"[{begin}, {end}]. {fix}")
    tensor = TensorInfo(tensor_name, dtype, shape, begin, end)
    if dtype in DTYPE_BYTES and tensor.nbytes != tensor.numel * DTYPE_BYTES[dtype]:
        raise ModelInspectError(
            f"{path}: corrupt safetensors header: tensor {tensor_name!r} ({dtype} {shape}) needs "
            f"{tensor.numel * DTYPE_BYTES[dtype]} bytes but its data_offsets span {tensor.nbytes}. {fix}")
    if end > data_bytes:
        raise ModelInspectError(
            f"{path}: header offsets beyond file size: tensor {tensor_name!r} ends at byte {end} of the "
            f"data section, which has only {data_bytes} bytes (the file is truncated). {fix}")
    return tensor


def load_json_file(path: str, what: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise ModelInspectError(f"{path}: cannot read the {what} ({exc.strerror}). "
                                "Check the path and the file's permissions.") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelInspectError(f"{path}: unreadable {what}: not valid JSON ({exc}). "
                                "Restore the file from the model's source repository.") from exc
    if not isinstance(data, dict):
        raise ModelInspectError(f"{path}: unreadable {what}: expected a JSON object. "
                                "Restore the file from the model's source repository.")
    return data


def _first(config: Dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


def total_kv_heads(config: Dict[str, Any], num_attention_heads: int) -> int:
    """KV heads in vLLM 0.5.4's order of lookup (docs/facts/vllm-volta.md §3.3)."""
    model_type = config.get("model_type", "")
    new_decoder = config.get("new_decoder_architecture", False)
    if config.get("multi_query") and not (model_type == "falcon" and new_decoder):
        return 1
    attn_config = config.get("attn_config")
    if model_type in ("mpt", "dbrx") and isinstance(attn_config, dict):
        if model_type == "mpt":
            return int(attn_config.get("kv_n_heads", num_attention_heads))
        return int(attn_config["kv_n_heads"])
    value = _first(config, "n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
    return int(value) if value is not None else num_attention_heads


def derived_max_model_len(config: Dict[str, Any]) -> Optional[int]:
    """vLLM's derived max_model_len: the smallest length key, scaled by rope_scaling (config.py)."""
    keys = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
            "max_sequence_length", "max_seq_length", "seq_len")
    lengths = [int(config[key]) for key in keys if isinstance(config.get(key), (int, float))]
    if not lengths:
        return None
    length = min(lengths)
    rope = config.get("rope_scaling")
    if isinstance(rope, dict):
        rope_type = rope.get("type", rope.get("rope_type"))
        if rope_type not in ("su", "longrope", "llama3", "default", None):
            factor = float(rope.get("factor", 1.0))
            if rope_type == "yarn" and rope.get("original_max_position_embeddings"):
                length = int(rope["original_max_position_embeddings"])
            length = int(length * factor)
    return length


@dataclass
class Architecture:
    """The numbers the planner and the KV sizing need, normalised across config.json dialects."""
    architecture: str
    model_type: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int
    max_position_embeddings: Optional[int]
    tie_word_embeddings: bool
    num_experts: int
    num_experts_per_tok: int
    qkv_bias: bool
    o_bias: bool


def parse_architecture(config: Dict[str, Any], source: str) -> Architecture:
    """Normalise config.json into `Architecture`; `source` (a path) names the file in errors."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    model_type = str(config.get("model_type") or text.get("model_type") or "")
    architectures = config.get("architectures") or text.get("architectures") or []
    layers = _first(text, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = _first(text, "hidden_size", "n_embd", "d_model")
    heads = _first(text, "num_attention_heads", "n_head", "n_heads", "num_heads")
    missing = [name for name, value in (("num_hidden_layers", layers), ("hidden_size", hidden),
                                        ("num_attention_heads", heads)) if value is None]
    if missing:
        raise ModelInspectError(
            f"{source}: unreadable config: it has no {', '.join(missing)} (nor an alias such as n_layer, "
            "n_embd, n_head). Use the config.json of the model's Hugging Face repository.")
    layers, hidden, heads = int(layers), int(hidden), int(heads)
    if layers <= 0 or hidden <= 0 or heads <= 0 or (hidden % heads and text.get("head_dim") is None):
        raise ModelInspectError(
            f"{source}: unreadable config: num_hidden_layers={layers}, hidden_size={hidden}, "
            f"num_attention_heads={heads} do not describe a transformer. Check the file.")
    kv_heads = total_kv_heads(text, heads)
    if model_type == "deepseek_v2":
        head_dim = 256  # vLLM 0.5.4 hard-codes it (docs/facts/vllm-volta.md §3.3)
    else:
        head_dim = int(text.get("head_dim") or hidden // heads)
    vocab = _first(text, "padded_vocab_size", "vocab_size")
    if vocab is None:
        raise ModelInspectError(f"{source}: unreadable config: no vocab_size. "
                                "Use the config.json of the model's Hugging Face repository.")
    intermediate = _first(text, "intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim")
    if intermediate is None:
        intermediate = 4 * hidden  # gpt2 / gpt_neox convention when the key is absent or null
    tie = text.get("tie_word_embeddings")
    if tie is None:
        tie = model_type not in UNTIED_BY_DEFAULT
    experts = int(_first(text, "num_local_experts", "num_experts", "n_routed_experts") or 0)
    experts_per_tok = int(_first(text, "num_experts_per_tok", "moe_topk") or (2 if experts else 0))
    if model_type == "qwen2":
        qkv_bias = True
        o_bias = False
    elif model_type in ("internlm2", "internlm"):
        qkv_bias = o_bias = bool(text.get("bias", model_type == "internlm"))
    else:
        qkv_bias = o_bias = bool(text.get("attention_bias", False))
    return Architecture(
        architecture=str(architectures[0]) if architectures else "",
        model_type=model_type,
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=int(vocab),
        intermediate_size=int(intermediate),
        max_position_embeddings=derived_max_model_len(text),
        tie_word_embeddings=bool(tie),
        num_experts=experts,
        num_experts_per_tok=experts_per_tok,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
    )


def architecture_parameters(arch: Architecture, config: Dict[str, Any]) -> Tuple[int, str]:
    """Parameter count from the architecture (formulas in the module docstring); returns (count, family)."""
    h, i, layers, v = arch.hidden_size, arch.intermediate_size, arch.num_hidden_layers, arch.vocab_size
    q_width = arch.num_attention_heads * arch.head_dim
    kv_width = arch.num_key_value_heads * arch.head_dim
    lm_head = 0 if arch.tie_word_embeddings else v * h
    if arch.model_type == "gpt_neox":
        per_layer = (3 * h * h + 3 * h) + (h * h + h) + (2 * h * i + i + h) + 4 * h
        return v * h + layers * per_layer + 2 * h + v * h, "gpt_neox"
    if arch.model_type in ("gpt2", "gpt_bigcode"):
        positions = int(_first(config, "n_positions", "max_position_embeddings") or 0)
        attn = h * (q_width + 2 * kv_width) + (q_width + 2 * kv_width) + h * h + h
        per_layer = attn + (2 * h * i + i + h) + 4 * h
        return v * h + positions * h + layers * per_layer + 2 * h, arch.model_type
    attention = h * q_width + 2 * h * kv_width + q_width * h
    if arch.qkv_bias:
        attention += q_width + 2 * kv_width
    if arch.o_bias:
        attention += h
    if arch.num_experts:
        mlp = arch.num_experts * 3 * h * i + h * arch.num_experts
    else:
        mlp = 3 * h * i
    norms = (4 if arch.model_type == "gemma2" else 2) * h
    family = "llama-like" if arch.model_type in LLAMA_LIKE else "llama-like (assumed)"
    return v * h + layers * (attention + mlp + norms) + h + lm_head, family


def parse_quantization(config: Dict[str, Any], quant_file_config: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """{method, bits, group_size, ...} from quantization_config (or quantize_config.json), else None."""
    qcfg = config.get("quantization_config")
    if not isinstance(qcfg, dict):
        qcfg = quant_file_config
    if not isinstance(qcfg, dict):
        return None
    method = str(qcfg.get("quant_method") or qcfg.get("quant_type") or "").lower()
    if not method:
        if "w_bit" in qcfg or qcfg.get("version") in ("gemm", "gemv"):
            method = "awq"
        elif "bits" in qcfg:
            method = "gptq"
    if qcfg.get("is_marlin_format") or qcfg.get("checkpoint_format") == "marlin":
        method = "marlin" if method == "gptq" else method
    bits = _first(qcfg, "bits", "w_bit", "weight_bits")
    if method == "bitsandbytes":
        bits = 4 if qcfg.get("load_in_4bit") else 8 if qcfg.get("load_in_8bit") else bits
    if method == "fp8":
        bits = 8
    result: Dict[str, Any] = {"method": method, "bits": int(bits) if bits is not None else None}
    group = _first(qcfg, "group_size", "q_group_size")
    if group is not None:
        result["group_size"] = int(group)
    for key in ("desc_act", "sym", "zero_point", "version", "activation_scheme", "checkpoint_format"):
        if key in qcfg:
            result[key] = qcfg[key]
    return result


def quantized_weight_bytes(parameters: int, arch: Architecture, quantization: Dict[str, Any]) -> int:
    """Bytes of a quantized checkpoint: packed linear weights plus FP16 scales; embeddings stay FP16."""
    bits = quantization.get("bits") or 16
    group = quantization.get("group_size") or 128
    if group <= 0:
        group = arch.hidden_size  # per-channel (group_size -1): one scale per output row
    embedding_params = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    linear_params = max(parameters - embedding_params, 0)
    # scales (16 bit) and packed zeros (bits) per group of `group` weights
    per_weight_bits = bits + (16 + bits) / group
    return int(linear_params * per_weight_bits / 8) + embedding_params * 2


def find_shards(directory: str) -> Tuple[Optional[str], List[str]]:
    """(index path or None, shard file names) for a model directory."""
    index = os.path.join(directory, INDEX_FILE)
    if os.path.isfile(index):
        data = load_json_file(index, "safetensors index")
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelInspectError(f"{index}: the safetensors index has no weight_map. "
                                    "Restore the index from the model's source repository.")
        return index, sorted(set(str(name) for name in weight_map.values()))
    names = sorted(name for name in os.listdir(directory) if name.endswith(".safetensors"))
    return None, names


def _check_dtypes(tensors: List[Tuple[str, TensorInfo]],
                  quantization: Optional[Dict[str, Any]]) -> Tuple[List[str], Optional[str]]:
    """(dtypes found, the weights' float dtype); raises on mixed float dtypes in a plain checkpoint."""
    dtypes = sorted({tensor.dtype for _, tensor in tensors})
    by_dtype: Dict[str, List[str]] = {}
    for file, tensor in tensors:
        if not tensor.name.endswith(IGNORED_TENSOR_SUFFIXES):
            by_dtype.setdefault(tensor.dtype, []).append(f"{file}:{tensor.name}")
    floats = {dtype: names for dtype, names in by_dtype.items() if dtype in FLOAT_DTYPES}
    if not floats:
        return dtypes, None
    main = max(floats, key=lambda dtype: len(floats[dtype]))
    others = {dtype: names for dtype, names in floats.items() if dtype != main}
    if quantization is not None:
        # Quantized checkpoints keep scales in F32 (fp8, compressed-tensors) beside F16/BF16 weights.
        others = {dtype: [n for n in names if not _is_scale_tensor(n)] for dtype, names in others.items()}
        others = {dtype: names for dtype, names in others.items() if names}
    if others:
        detail = "; ".join(f"{dtype}: {', '.join(names[:5])}{' …' if len(names) > 5 else ''} "
                           f"({len(names)} tensors)" for dtype, names in sorted(others.items()))
        raise ModelInspectError(
            f"mixed dtypes: most tensors are {main} ({len(floats[main])}) but {detail}. vLLM loads "
            f"every weight in one dtype; convert the checkpoint to a single dtype (e.g. all {main}) "
            "before syncing it.")
    return dtypes, main


def _is_scale_tensor(name: str) -> bool:
    return name.endswith(("scale", "scales", "_scale_inv", "zero_point", "zeros", "g_idx"))


def _checkpoint_dtype(torch_dtype: Optional[str]) -> str:
    return TORCH_DTYPE_TO_SAFETENSORS.get(str(torch_dtype or "float16").replace("torch.", ""), "F16")


def inspect_model(path: str) -> Dict[str, Any]:
    """Model facts for a model directory or a bare config.json (listed in library/model_inspect.py's RETURN)."""
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isfile(path):
        directory, config_path = os.path.dirname(path), path
        config_only = True
    elif os.path.isdir(path):
        directory, config_path = path, os.path.join(path, CONFIG_FILE)
        config_only = False
        if not os.path.isfile(config_path):
            raise ModelInspectError(
                f"{config_path}: missing. A model directory needs the config.json of its Hugging Face "
                "repository; copy it (and the weights) into the directory.")
    else:
        raise ModelInspectError(f"{path}: no such file or directory. Give a model directory or the "
                                "path of a config.json.")
    config = load_json_file(config_path, "config")
    arch = parse_architecture(config, config_path)
    warnings: List[str] = []
    generation_config = None
    generation_path = os.path.join(directory, GENERATION_CONFIG_FILE)
    if os.path.isfile(generation_path):
        generation_config = load_json_file(generation_path, "generation config")
    quant_file_config = None
    for name in QUANT_CONFIG_FILES:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and not isinstance(config.get("quantization_config"), dict):
            quant_file_config = load_json_file(candidate, "quantization config")
            break
    quantization = parse_quantization(config, quant_file_config)
    tokenizer_files = sorted(name for name in TOKENIZER_FILES if os.path.isfile(os.path.join(directory, name)))
    formula_params, family = architecture_parameters(arch, config)

    index_path, shard_names = (None, []) if config_only else find_shards(directory)
    if not config_only and not shard_names:
        bins = [name for name in os.listdir(directory) if name.endswith(".bin") and "pytorch_model" in name]
        if bins:
            warnings.append(f"{directory}: weights are PyTorch .bin files ({len(bins)}); sizes come from the "
                            "architecture and cannot be verified. Convert to safetensors for verified syncs.")
        else:
            warnings.append(f"{directory}: no weights found; sizes come from the architecture (what-if plan).")
    shards: List[ShardInfo] = []
    for name in shard_names:
        shard_path = os.path.join(directory, name)
        if not os.path.isfile(shard_path):
            listed = f"listed in {index_path}" if index_path else "expected"
            raise ModelInspectError(
                f"{shard_path}: missing shard {listed}. Re-run the model download or sync; a partial copy "
                "must not be served.")
        shards.append(read_safetensors_header(shard_path))
    if index_path:
        _check_index(index_path, shards)

    result: Dict[str, Any] = {
        "path": path,
        "config_file": config_path,
        "architecture": arch.architecture,
        "model_type": arch.model_type,
        "num_hidden_layers": arch.num_hidden_layers,
        "hidden_size": arch.hidden_size,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim,
        "vocab_size": arch.vocab_size,
        "intermediate_size": arch.intermediate_size,
        "max_position_embeddings": arch.max_position_embeddings,
        "rope_scaling": config.get("rope_scaling"),
        "sliding_window": config.get("sliding_window") if config.get("use_sliding_window", True) else None,
        "attn_logit_softcapping": config.get("attn_logit_softcapping"),
        "tie_word_embeddings": arch.tie_word_embeddings,
        "num_experts": arch.num_experts,
        "num_experts_per_tok": arch.num_experts_per_tok,
        "requires_trust_remote_code": isinstance(config.get("auto_map"), dict),
        "torch_dtype": config.get("torch_dtype"),
        "quantization": quantization,
        "generation_config": generation_config,
        "tokenizer_files": tokenizer_files,
        "index_file": os.path.basename(index_path) if index_path else None,
        "architecture_family": family,
        "warnings": warnings,
    }
    if shards:
        tensors = [(shard.file, tensor) for shard in shards for tensor in shard.tensors]
        try:
            dtypes, weights_dtype = _check_dtypes(tensors, quantization)
        except ModelInspectError as exc:
            raise ModelInspectError(f"{directory}: {exc}") from None
        counted = sum(t.numel for _, t in tensors if not t.name.endswith(IGNORED_TENSOR_SUFFIXES))
        result.update({
            "source": "safetensors",
            "dtypes": dtypes,
            "weights_dtype": weights_dtype,
            "weight_bytes": sum(t.nbytes for _, t in tensors),
            "parameter_count": formula_params if quantization else counted,
            "parameter_count_source": "architecture" if quantization else "safetensors",
            "shards": [{"file": s.file, "bytes": s.bytes, "tensors": len(s.tensors)} for s in shards],
            "total_tensors": len(tensors),
        })
    else:
        weights_dtype = _checkpoint_dtype(config.get("torch_dtype"))
        if quantization:
            weight_bytes = quantized_weight_bytes(formula_params, arch, quantization)
            dtypes = sorted({"I32", "F16"})
        else:
            weight_bytes = formula_params * DTYPE_BYTES[weights_dtype]
            dtypes = [weights_dtype]
        result.update({
            "source": "config-only",
            "dtypes": dtypes,
            "weights_dtype": weights_dtype,
            "weight_bytes": weight_bytes,
            "parameter_count": formula_params,
            "parameter_count_source": "architecture",
            "shards": [],
            "total_tensors": 0,
        })
    return result


def _check_index(index_path: str, shards: List[ShardInfo]) -> None:
    data = load_json_file(index_path, "safetensors index")
    present = {shard.file: {tensor.name for tensor in shard.tensors} for shard in shards}
    for tensor_name, shard_file in data["weight_map"].items():
        if tensor_name not in present.get(shard_file, set()):
            raise ModelInspectError(
                f"{os.path.join(os.path.dirname(index_path), shard_file)}: tensor {tensor_name!r} is listed "
                f"in {os.path.basename(index_path)} but absent from the shard's header. The shard and the "
                "index come from different revisions; re-download or re-sync the model.")


def model_from_config(config: Dict[str, Any], name: str = "config.json") -> Dict[str, Any]:
    """Model facts from an in-memory config dict (as a bare config.json would give); for what-ifs and tests."""
    arch = parse_architecture(config, name)
    quantization = parse_quantization(config, None)
    params, family = architecture_parameters(arch, config)
    weights_dtype = _checkpoint_dtype(config.get("torch_dtype"))
    weight_bytes = (quantized_weight_bytes(params, arch, quantization) if quantization
                    else params * DTYPE_BYTES[weights_dtype])
    return {
        "path": name, "config_file": name, "architecture": arch.architecture, "model_type": arch.model_type,
        "num_hidden_layers": arch.num_hidden_layers, "hidden_size": arch.hidden_size,
        "num_attention_heads": arch.num_attention_heads, "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim, "vocab_size": arch.vocab_size, "intermediate_size": arch.intermediate_size,
        "max_position_embeddings": arch.max_position_embeddings, "rope_scaling": config.get("rope_scaling"),
        "sliding_window": config.get("sliding_window") if config.get("use_sliding_window", True) else None,
        "attn_logit_softcapping": config.get("attn_logit_softcapping"),
        "tie_word_embeddings": arch.tie_word_embeddings, "num_experts": arch.num_experts,
        "num_experts_per_tok": arch.num_experts_per_tok,
        "requires_trust_remote_code": isinstance(config.get("auto_map"), dict),
        "torch_dtype": config.get("torch_dtype"),
        "quantization": quantization, "generation_config": None, "tokenizer_files": [], "index_file": None,
        "architecture_family": family, "warnings": [], "source": "config-only",
        "dtypes": sorted({"I32", "F16"}) if quantization else [weights_dtype], "weights_dtype": weights_dtype,
        "weight_bytes": weight_bytes, "parameter_count": params, "parameter_count_source": "architecture",
        "shards": [], "total_tensors": 0,
    }
