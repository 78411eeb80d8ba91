"""BF16 → FP16 conversion: exact values, overflow counted per tensor, bounded memory, config/index/manifest."""
from __future__ import annotations

import json
import os
import struct
import tracemalloc

import numpy as np
import pytest
from ansible.module_utils.revive_model import read_safetensors_header
from ansible.module_utils.revive_sync.convert import (
    convert_model_bf16_to_fp16, convert_shard_bf16_to_fp16, encode_safetensors_header,
)
from ansible.module_utils.revive_sync.dtype import safetensors_dtypes
from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.manifest import MANIFEST_NAME, build_manifest, load_manifest, sha256_file
from ansible.module_utils.revive_sync.tasks import convert_task
from ansible.module_utils.revive_sync.verify import mark_verified, verified_manifest, verify_tree
from fixtures.models import write_model
from safetensors.numpy import load_file


def bf16_bits(value: float) -> int:
    """Round-to-nearest-even BF16 bits of a float, computed with struct (independent of the code under test)."""
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def bf16_value(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def write_shard(path, tensors):
    """tensors: name → (dtype, list of uint16 bits or raw bytes). Returns the path."""
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, (dtype, data) in tensors.items():
        blob = data if isinstance(data, bytes) else struct.pack(f"<{len(data)}H", *data)
        size = len(blob) // (4 if dtype == "F32" else 2)
        header[name] = {"dtype": dtype, "shape": [size], "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    with open(path, "wb") as handle:
        handle.write(encode_safetensors_header(header))
        for blob in blobs:
            handle.write(blob)
    return str(path)


FP16_MAX = 65504.0


def test_values_in_fp16_range_convert_exactly_and_overflow_is_counted_per_tensor(tmp_path):
    exact = [1.0, -2.5, 0.333984375, 1024.0, -65280.0, 3.0517578125e-05, 0.0, -0.0]
    overflow = [65536.0, -1.0e6, 3.0e38]
    special = [float("inf"), float("-inf")]
    tiny = [1.0e-10, -1.0e-12]
    tensors = {
        "a.weight": ("BF16", [bf16_bits(v) for v in exact]),
        "b.weight": ("BF16", [bf16_bits(v) for v in overflow + special + tiny] + [0x7FC0]),
        "c.bias": ("F32", struct.pack("<3f", 1.5, 70000.0, -3.25)),
    }
    source = write_shard(tmp_path / "in.safetensors", tensors)
    report = convert_shard_bf16_to_fp16(source, str(tmp_path / "out.safetensors"), overflow_policy="inf")
    assert report.overflow == {"b.weight": 3}
    assert report.underflow_values == 2
    assert (report.converted_tensors, report.copied_tensors, report.converted_values) == (2, 1, 16)
    out = load_file(str(tmp_path / "out.safetensors"))  # an independent reader of the output
    assert out["a.weight"].dtype == np.float16
    assert out["a.weight"].tolist() == [bf16_value(bf16_bits(v)) for v in exact]
    assert np.signbit(out["a.weight"][7])
    b = out["b.weight"]
    assert b[:3].tolist() == [float("inf"), float("-inf"), float("inf")]
    assert b[3:5].tolist() == special and b[5:7].tolist() == [0.0, 0.0] and np.isnan(b[7])
    assert out["c.bias"].dtype == np.float32 and out["c.bias"].tolist() == [1.5, 70000.0, -3.25]
    assert report.sha256 == sha256_file(str(tmp_path / "out.safetensors"))


def test_clamp_saturates_overflow_to_fp16_max(tmp_path):
    source = write_shard(tmp_path / "in.safetensors",
                         {"w": ("BF16", [bf16_bits(v) for v in (65536.0, -1.0e6, 2.0, float("inf"))])})
    report = convert_shard_bf16_to_fp16(source, str(tmp_path / "out.safetensors"), overflow_policy="clamp")
    assert report.overflow == {"w": 2}
    assert load_file(str(tmp_path / "out.safetensors"))["w"].tolist() == [FP16_MAX, -FP16_MAX, 2.0, float("inf")]


def test_random_bf16_values_match_an_independent_reference(tmp_path):
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 0x10000, size=50_000, dtype=np.uint32).tolist()
    source = write_shard(tmp_path / "in.safetensors", {"w": ("BF16", bits)})
    report = convert_shard_bf16_to_fp16(source, str(tmp_path / "out.safetensors"), overflow_policy="inf",
                                        chunk_values=4096)  # many chunks, one partial at the end
    converted = load_file(str(tmp_path / "out.safetensors"))["w"]
    expected_overflow = 0
    for index in range(0, len(bits), 97):
        value = bf16_value(bits[index])
        got = float(converted[index])
        if value != value:
            assert got != got
        elif abs(value) > FP16_MAX and abs(value) != float("inf"):
            assert got == (float("inf") if value > 0 else float("-inf"))
        elif abs(value) >= 6.103515625e-05 or value == 0:  # FP16 normal range: BF16 → FP16 is exact
            assert got == value
    for bit in bits:
        value = bf16_value(bit)
        if value == value and abs(value) != float("inf") and abs(value) > FP16_MAX:
            expected_overflow += 1
    assert report.overflow == {"w": expected_overflow} and expected_overflow > 1000


def test_header_keeps_offsets_and_metadata_and_only_changes_dtypes(tmp_path):
    source = write_shard(tmp_path / "in.safetensors",
                         {"x": ("BF16", [bf16_bits(1.0)] * 5), "y": ("F32", struct.pack("<2f", 1, 2))})
    convert_shard_bf16_to_fp16(source, str(tmp_path / "out.safetensors"), overflow_policy="fail")
    before, after = read_safetensors_header(source), read_safetensors_header(str(tmp_path / "out.safetensors"))
    assert [(t.name, t.dtype, t.shape, t.begin, t.end) for t in after.tensors] == [
        ("x", "F16", [5], 0, 10), ("y", "F32", [2], 10, 18)]
    assert [(t.begin, t.end) for t in before.tensors] == [(t.begin, t.end) for t in after.tensors]
    with open(tmp_path / "out.safetensors", "rb") as handle:
        length = struct.unpack("<Q", handle.read(8))[0]
        assert length % 8 == 0
        assert json.loads(handle.read(length))["__metadata__"] == {"format": "pt"}


def _peak_bytes(tmp_path, values, chunk_values):
    source = write_shard(tmp_path / f"in{values}.safetensors",
                         {"w": ("BF16", np.full(values, bf16_bits(0.5), dtype="<u2").tobytes())})
    tracemalloc.start()
    try:
        convert_shard_bf16_to_fp16(source, str(tmp_path / f"out{values}.safetensors"), overflow_policy="fail",
                                   chunk_values=chunk_values)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_stays_bounded_by_the_chunk_not_the_shard(tmp_path):
    # numpy reports its buffers to tracemalloc, so this measures the arrays as well as Python objects.
    small = _peak_bytes(tmp_path, 4 << 20, chunk_values=64 << 10)    # 8 MiB shard
    large = _peak_bytes(tmp_path, 32 << 20, chunk_values=64 << 10)   # 64 MiB shard
    assert large < 2 << 20, f"peak {large} bytes converting a 64 MiB shard"
    assert abs(large - small) < 256 << 10, "peak memory grew with the shard size"


@pytest.fixture()
def bf16_model(tmp_path):
    path = write_model(str(tmp_path / ".rev1.staging"), "qwen2-7b-instruct", dtype="BF16", shards=2)
    # Real values instead of zeros: one overflowing value in one tensor of shard 2.
    shard = os.path.join(path, "model-00002-of-00002.safetensors")
    info = read_safetensors_header(shard)
    tensor = info.tensors[0]
    with open(shard, "r+b") as handle:
        handle.seek(8 + info.header_bytes + tensor.begin)
        handle.write(struct.pack("<3H", bf16_bits(1.5), bf16_bits(70000.0), bf16_bits(-0.25)))
    manifest = build_manifest(path, read_dtypes=safetensors_dtypes, workers=1)
    mark_verified(path, manifest)
    return path, manifest, tensor.name


def test_model_conversion_rewrites_config_index_and_manifest(tmp_path, bf16_model):
    staging, manifest, tensor = bf16_model
    output = str(tmp_path / ".rev1.converting")
    report = convert_model_bf16_to_fp16(staging, output, manifest, overflow_policy="clamp", where="node1")
    assert report["overflow"] == {"model-00002-of-00002.safetensors": {tensor: 1}}
    assert report["overflow_values"] == 1 and report["config_keys_rewritten"] == ["torch_dtype"]
    with open(os.path.join(output, "config.json")) as handle:
        assert json.load(handle)["torch_dtype"] == "float16"
    with open(os.path.join(output, "model.safetensors.index.json")) as handle:
        index = json.load(handle)
    assert index["metadata"]["converted_by"] == "revive model_sync: BF16 -> F16"
    with open(os.path.join(staging, "model.safetensors.index.json")) as handle:
        assert index["weight_map"] == json.load(handle)["weight_map"]
    converted = load_manifest(os.path.join(output, MANIFEST_NAME))
    assert converted.converted_from["content_id"] == manifest.content_id
    assert converted.source_content_id == manifest.content_id
    assert {entry.path: entry.dtypes for entry in converted.files if entry.dtypes} == {
        "model-00001-of-00002.safetensors": ("F16",), "model-00002-of-00002.safetensors": ("F16",)}
    assert verify_tree(output, converted, workers=1, use_cache=False).ok
    assert verified_manifest(output).content_id == converted.content_id
    # Unchanged files are hard links to the staged copy, not second copies.
    assert os.stat(os.path.join(output, "tokenizer.json")).st_ino == os.stat(os.path.join(staging, "tokenizer.json")).st_ino
    assert load_file(os.path.join(output, "model-00002-of-00002.safetensors"))[tensor][:3].tolist() == [
        1.5, FP16_MAX, -0.25]


def test_overflow_policy_fail_lists_tensors_and_leaves_nothing(tmp_path, bf16_model):
    staging, manifest, tensor = bf16_model
    output = tmp_path / ".rev1.converting"
    with pytest.raises(SyncError) as error:
        convert_model_bf16_to_fp16(staging, str(output), manifest, overflow_policy="fail", where="node1")
    assert str(error.value) == (
        f"converting the model on node1 to FP16 would turn 1 value(s) beyond FP16's ±65504 into inf, in 1 tensor(s): "
        f"model-00002-of-00002.safetensors:{tensor} (1). Nothing was promoted. Serve the model on GPUs with BF16, "
        f"or accept saturation with model_sync_convert_overflow: clamp.")
    assert not output.exists()


def test_convert_task_is_idempotent_and_requires_a_verified_staging(tmp_path, bf16_model):
    staging, manifest, _ = bf16_model
    output = str(tmp_path / ".rev1.converting")
    first = convert_task(staging, output, manifest.content_id, overflow_policy="clamp", check_mode=False, where="n")
    second = convert_task(staging, output, manifest.content_id, overflow_policy="clamp", check_mode=False, where="n")
    assert first["changed"] and not second["changed"]
    assert second["content_id"] == first["content_id"]
    with open(os.path.join(staging, "config.json"), "a") as handle:
        handle.write(" ")
    with pytest.raises(SyncError, match=r"is not verified against content id"):
        convert_task(staging, str(tmp_path / "other"), manifest.content_id, overflow_policy="clamp",
                     check_mode=False, where="n")


def test_convert_task_check_mode_lists_the_shards(tmp_path, bf16_model):
    staging, manifest, _ = bf16_model
    output = tmp_path / ".rev1.converting"
    result = convert_task(staging, str(output), manifest.content_id, overflow_policy="clamp", check_mode=True,
                          where="n")
    assert result["changed"] and not output.exists()
    assert result["diff"]["after"] == "F16  model-00001-of-00002.safetensors\nF16  model-00002-of-00002.safetensors\n"
