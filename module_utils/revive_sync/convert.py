"""BF16 → FP16, streamed shard by shard in bounded chunks (numpy, imported when it runs; no torch)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from ansible.module_utils.revive_sync.dtype import safetensors_dtypes
from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.manifest import SAFETENSORS_SUFFIX, Manifest, ManifestFile
from ansible.module_utils.revive_sync.verify import mark_verified

FP16_MAX = 65504.0
# Values per chunk: 2 MiB of BF16 in, 4 MiB of float32 and 2 MiB of float16 working memory, whatever the shard size.
CONVERT_CHUNK_VALUES = 1 << 20
OVERFLOW_POLICIES = ("fail", "clamp", "inf")


@dataclass
class ShardConversion:
    file: str
    converted_tensors: int = 0
    copied_tensors: int = 0
    converted_values: int = 0
    overflow: Dict[str, int] = field(default_factory=dict)  # tensor → values beyond ±65504 (inf in FP16)
    underflow_values: int = 0  # non-zero BF16 values too small for FP16 (they become ±0)
    sha256: str = ""
    size: int = 0

    def to_dict(self) -> dict:
        return {"file": self.file, "converted_tensors": self.converted_tensors,
                "copied_tensors": self.copied_tensors, "converted_values": self.converted_values,
                "overflow_values": sum(self.overflow.values()), "overflow": self.overflow,
                "underflow_values": self.underflow_values}


class _HashingWriter:
    """A file written once, front to back, hashed as it is written (no second read to make the manifest)."""

    def __init__(self, path: str):
        self.handle = open(path, "wb")
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data) -> None:
        self.handle.write(data)
        self.digest.update(data)
        self.size += len(data)

    def close(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()


def _raw_header(path: str, header_bytes: int) -> dict:
    # revive_model has validated this header; only its raw key order and __metadata__ are wanted here.
    with open(path, "rb") as handle:
        handle.seek(8)
        return json.loads(handle.read(header_bytes).decode("utf-8"))


def encode_safetensors_header(header: dict) -> bytes:
    """8-byte little-endian length + JSON, space-padded to a multiple of 8 as the safetensors writer does."""
    body = json.dumps(header, separators=(",", ":")).encode("utf-8")
    body += b" " * (-len(body) % 8)
    return len(body).to_bytes(8, "little") + body


def convert_shard_bf16_to_fp16(source_path: str, output_path: str, *, overflow_policy: str,
                               chunk_values: int = CONVERT_CHUNK_VALUES) -> ShardConversion:
    """Write `output_path` as `source_path` with every BF16 tensor in FP16; other tensors are copied as they are.

    numpy has no bfloat16: a BF16 value is the top half of a float32, so uint16 << 16 viewed as float32 is
    exact, and float32 → float16 rounds to nearest. Values past ±65504 become ±inf in FP16: they are counted
    per tensor, and with overflow_policy 'clamp' saturated to ±65504 instead. Offsets do not move (both dtypes
    are 2 bytes), so only the header's dtype strings change.
    """
    import numpy as np
    from ansible.module_utils.revive_model import read_safetensors_header

    shard = read_safetensors_header(source_path)
    header = _raw_header(source_path, shard.header_bytes)
    for name, entry in header.items():
        if name != "__metadata__" and entry.get("dtype") == "BF16":
            entry["dtype"] = "F16"
    report = ShardConversion(file=os.path.basename(output_path))
    data_start = 8 + shard.header_bytes
    raw = np.empty(chunk_values, dtype="<u2")
    widened = np.empty(chunk_values, dtype=np.uint32)
    narrowed = np.empty(chunk_values, dtype="<f2")
    copy_chunk_bytes = chunk_values * 4  # non-BF16 tensors are copied through a buffer of the same order
    copy_buffer = bytearray(copy_chunk_bytes)
    writer = _HashingWriter(output_path)
    try:
        writer.write(encode_safetensors_header(header))
        with open(source_path, "rb", buffering=0) as source:
            position = 0
            for tensor in sorted(shard.tensors, key=lambda item: item.begin):
                if tensor.begin != position:
                    raise SyncError(f"{source_path}: tensor data is not contiguous at byte {position} "
                                    f"(next tensor {tensor.name!r} starts at {tensor.begin}); re-download the shard")
                source.seek(data_start + tensor.begin)
                if tensor.dtype != "BF16":
                    remaining = tensor.nbytes
                    while remaining:
                        view = memoryview(copy_buffer)[:min(remaining, copy_chunk_bytes)]
                        count = source.readinto(view)
                        if not count:
                            raise SyncError(f"{source_path}: ends inside tensor {tensor.name!r}; re-sync the shard")
                        writer.write(view[:count])
                        remaining -= count
                    report.copied_tensors += 1
                else:
                    overflow = 0
                    remaining_values = tensor.nbytes // 2
                    while remaining_values:
                        count = min(remaining_values, chunk_values)
                        target = memoryview(raw[:count].view(np.uint8))
                        if source.readinto(target) != count * 2:
                            raise SyncError(f"{source_path}: ends inside tensor {tensor.name!r}; re-sync the shard")
                        np.left_shift(raw[:count], 16, out=widened[:count], dtype=np.uint32)
                        as_float32 = widened[:count].view(np.float32)
                        with np.errstate(over="ignore"):
                            np.copyto(narrowed[:count], as_float32, casting="unsafe")
                        overflowed = np.isinf(narrowed[:count]) & np.isfinite(as_float32)
                        chunk_overflow = int(np.count_nonzero(overflowed))
                        if chunk_overflow and overflow_policy == "clamp":
                            narrowed[:count][overflowed] = np.copysign(FP16_MAX, as_float32[overflowed])
                        overflow += chunk_overflow
                        report.underflow_values += int(np.count_nonzero((narrowed[:count] == 0) & (as_float32 != 0)))
                        writer.write(memoryview(narrowed[:count].view(np.uint8)))
                        remaining_values -= count
                    report.converted_tensors += 1
                    report.converted_values += tensor.nbytes // 2
                    if overflow:
                        report.overflow[tensor.name] = overflow
                position = tensor.end
    except BaseException:
        writer.handle.close()
        os.unlink(output_path)
        raise
    writer.close()
    report.sha256 = writer.digest.hexdigest()
    report.size = writer.size
    return report


def _rewrite_dtype_keys(value, changed: List[str], path: str = ""):
    """config.json: torch_dtype (and the newer `dtype` key) "bfloat16" → "float16", nested configs included."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in ("torch_dtype", "dtype") and item == "bfloat16":
                out[key] = "float16"
                changed.append(f"{path}{key}")
            else:
                out[key] = _rewrite_dtype_keys(item, changed, f"{path}{key}.")
        return out
    return value


def _write_json_hashed(path: str, data: dict) -> Tuple[int, str]:
    writer = _HashingWriter(path)
    writer.write((json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    writer.close()
    return writer.size, writer.digest.hexdigest()


INDEX_SUFFIX = ".safetensors.index.json"


def convert_model_bf16_to_fp16(staging: str, output_dir: str, manifest: Manifest, *, overflow_policy: str,
                               where: str, chunk_values: int = CONVERT_CHUNK_VALUES) -> dict:
    """Make `output_dir`: the staged model with BF16 shards in FP16, config.json and the index updated, a new
    manifest (converted_from = the source's), marked verified. Files that need no change are hard-linked."""
    if overflow_policy not in OVERFLOW_POLICIES:
        raise SyncError(f"model_sync_convert_overflow must be one of {', '.join(OVERFLOW_POLICIES)}, "
                        f"not {overflow_policy!r}")
    if os.path.exists(output_dir):
        shutil.rmtree(output_dir)
    os.makedirs(output_dir, mode=0o700)
    entries: List[ManifestFile] = []
    shards: List[ShardConversion] = []
    config_keys: List[str] = []
    index_files: List[str] = []
    for entry in manifest.files:
        source_path = os.path.join(staging, entry.path)
        output_path = os.path.join(output_dir, entry.path)
        os.makedirs(os.path.dirname(output_path), mode=0o700, exist_ok=True)
        if entry.path.endswith(SAFETENSORS_SUFFIX) and "BF16" in safetensors_dtypes(source_path):
            shard = convert_shard_bf16_to_fp16(source_path, output_path, overflow_policy=overflow_policy,
                                               chunk_values=chunk_values)
            shards.append(shard)
            entries.append(ManifestFile(entry.path, shard.size, shard.sha256, safetensors_dtypes(output_path)))
        elif os.path.basename(entry.path) == "config.json":
            with open(source_path, encoding="utf-8") as handle:
                config = _rewrite_dtype_keys(json.load(handle), config_keys)
            size, digest = _write_json_hashed(output_path, config)
            entries.append(ManifestFile(entry.path, size, digest))
        elif entry.path.endswith(INDEX_SUFFIX):
            with open(source_path, encoding="utf-8") as handle:
                index = json.load(handle)
            metadata = _rewrite_dtype_keys(dict(index.get("metadata") or {}), [])
            metadata["converted_by"] = "revive model_sync: BF16 -> F16"
            index["metadata"] = metadata
            size, digest = _write_json_hashed(output_path, index)
            entries.append(ManifestFile(entry.path, size, digest))
            index_files.append(entry.path)
        else:
            os.link(source_path, output_path)
            entries.append(entry)
    overflow = {shard.file: shard.overflow for shard in shards if shard.overflow}
    overflow_values = sum(sum(tensors.values()) for tensors in overflow.values())
    report = {
        "shards": [shard.to_dict() for shard in shards],
        "converted_values": sum(shard.converted_values for shard in shards),
        "overflow_values": overflow_values,
        "overflow": overflow,
        "underflow_values": sum(shard.underflow_values for shard in shards),
        "overflow_policy": overflow_policy,
        "config_keys_rewritten": config_keys,
        "index_files_rewritten": index_files,
    }
    if overflow_values and overflow_policy == "fail":
        shutil.rmtree(output_dir)
        worst = sorted(((count, f"{file}:{tensor}") for file, tensors in overflow.items()
                        for tensor, count in tensors.items()), reverse=True)
        shown = ", ".join(f"{name} ({count})" for count, name in worst[:5])
        raise SyncError(
            f"converting the model on {where} to FP16 would turn {overflow_values} value(s) beyond FP16's ±65504 "
            f"into inf, in {len(worst)} tensor(s): {shown}{' …' if len(worst) > 5 else ''}. Nothing was promoted. "
            f"Serve the model on GPUs with BF16, or accept saturation with model_sync_convert_overflow: clamp.")
    converted = Manifest(files=tuple(sorted(entries, key=lambda item: item.path)),
                         converted_from={"content_id": manifest.content_id, "dtype": "BF16", "to": "F16",
                                         "overflow_values": overflow_values, "overflow_policy": overflow_policy})
    mark_verified(output_dir, converted)
    report["content_id"] = converted.content_id
    return report
