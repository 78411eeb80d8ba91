"""model_sync manifests and verification reports: exact files named, dtypes recorded, stale manifests caught."""
from __future__ import annotations

import hashlib
import json
import os

import pytest
from ansible.module_utils.revive_sync.dtype import decide_dtypes, safetensors_dtypes
from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.manifest import (
    HASH_CACHE, MANIFEST_NAME, Manifest, ManifestFile, build_manifest, load_manifest, manifest_from_dict,
)
from ansible.module_utils.revive_sync.tasks import manifest_task
from ansible.module_utils.revive_sync.verify import pending_transfer, save_hash_cache, stat_key, verify_tree
from fixtures.models import write_model


def _sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture()
def model(tmp_path):
    path = write_model(str(tmp_path / "chat"), "llama-2-7b-chat", dtype="F16", shards=2)
    # Different bytes per shard so a swapped file is not invisible to the checksum.
    with open(os.path.join(path, "model-00002-of-00002.safetensors"), "r+b") as handle:
        handle.seek(-4, os.SEEK_END)
        handle.write(b"\x01\x02\x03\x04")
    return path


def test_manifest_lists_every_file_with_size_sha256_and_shard_dtypes(model):
    manifest = build_manifest(model, read_dtypes=safetensors_dtypes, workers=2)
    names = [entry.path for entry in manifest.files]
    assert names == sorted(os.listdir(model))
    for entry in manifest.files:
        path = os.path.join(model, entry.path)
        assert entry.size == os.path.getsize(path)
        assert entry.sha256 == _sha256(path)
    assert manifest.by_path()["model-00001-of-00002.safetensors"].dtypes == ("F16",)
    assert manifest.by_path()["config.json"].dtypes is None
    assert manifest.total_bytes == sum(os.path.getsize(os.path.join(model, name)) for name in names)


def test_manifest_ignores_vcs_hub_cache_and_its_own_files(model):
    for name in (".git/HEAD", ".cache/huggingface/download/x.metadata", MANIFEST_NAME, HASH_CACHE):
        os.makedirs(os.path.dirname(os.path.join(model, name)), exist_ok=True)
        with open(os.path.join(model, name), "w") as handle:
            handle.write("x")
    os.makedirs(os.path.join(model, "original"))
    with open(os.path.join(model, "original", "params.json"), "w") as handle:
        handle.write("{}")
    names = [entry.path for entry in build_manifest(model, read_dtypes=safetensors_dtypes, workers=1).files]
    assert "original/params.json" in names
    assert not [name for name in names if name.startswith((".git", ".cache", MANIFEST_NAME, ".revive-"))]


def test_hugging_face_cache_symlinks_are_followed(tmp_path, model):
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    for name in os.listdir(model):
        (snapshot / name).symlink_to(os.path.join(model, name))
    manifest = build_manifest(str(snapshot), read_dtypes=safetensors_dtypes, workers=1)
    assert manifest.content_id == build_manifest(model, read_dtypes=safetensors_dtypes, workers=1).content_id


def test_manifest_round_trips_and_content_id_ignores_everything_but_bytes(model):
    manifest = build_manifest(model, read_dtypes=safetensors_dtypes, workers=1)
    again = manifest_from_dict(json.loads(json.dumps(manifest.to_dict())), "x")
    assert again == manifest and again.content_id == manifest.content_id
    renamed = Manifest(files=tuple(ManifestFile(e.path + "x", e.size, e.sha256) for e in manifest.files))
    assert renamed.content_id != manifest.content_id


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(format="other/1"), "format is not 'revive-model-manifest/1'"),
    (lambda d: d.update(algorithm="md5"), "algorithm 'md5' is not 'sha256'"),
    (lambda d: d["files"][0].update(path="../etc/passwd"), "is not a relative path inside the model"),
    (lambda d: d["files"][0].update(sha256="abc"), "has a bad size or sha256"),
    (lambda d: d["files"][0].update(size=d["files"][0]["size"] + 1), "content_id does not match its file list"),
    (lambda d: d.update(files=[]), "it lists no files"),
])
def test_invalid_manifests_are_refused_with_the_reason(model, edit, message):
    data = build_manifest(model, read_dtypes=safetensors_dtypes, workers=1).to_dict()
    edit(data)
    with pytest.raises(SyncError) as error:
        manifest_from_dict(data, "/srv/m/revive-manifest.json")
    assert str(error.value).startswith("manifest /srv/m/revive-manifest.json is invalid: ")
    assert message in str(error.value)
    assert "model_sync_manifest_refresh: true" in str(error.value)


def test_verify_report_names_missing_extra_wrong_size_and_wrong_checksum(tmp_path, model):
    manifest = build_manifest(model, read_dtypes=safetensors_dtypes, workers=1)
    copy = tmp_path / "copy"
    copy.mkdir()
    for entry in manifest.files:
        with open(os.path.join(model, entry.path), "rb") as src, open(copy / entry.path, "wb") as dst:
            dst.write(src.read())
    assert verify_tree(str(copy), manifest, workers=2).ok
    os.unlink(copy / "tokenizer.json")
    (copy / "stray.bin").write_bytes(b"x")
    with open(copy / "config.json", "ab") as handle:
        handle.write(b" ")
    with open(copy / "model-00001-of-00002.safetensors", "r+b") as handle:
        handle.seek(200)
        byte = handle.read(1)
        handle.seek(200)
        handle.write(bytes([byte[0] ^ 0xFF]))
    report = verify_tree(str(copy), manifest, workers=2)
    config_size = manifest.by_path()["config.json"].size
    assert (report.missing, report.extra, report.size_mismatch, report.checksum_mismatch) == (
        ["tokenizer.json"], ["stray.bin"], [("config.json", config_size, config_size + 1)],
        ["model-00001-of-00002.safetensors"])
    assert report.corrupt == ["config.json", "model-00001-of-00002.safetensors"]
    assert report.summary() == (
        f"missing: tokenizer.json; wrong size: config.json ({config_size + 1} bytes, manifest says {config_size}); "
        f"sha256 differs: model-00001-of-00002.safetensors; not in the manifest: stray.bin")


def test_hash_cache_is_used_only_while_the_stat_is_unchanged(tmp_path, model):
    manifest = build_manifest(model, read_dtypes=safetensors_dtypes, workers=1)
    shard = "model-00001-of-00002.safetensors"
    path = os.path.join(model, shard)
    save_hash_cache(model, {shard: (stat_key(path), manifest.by_path()[shard].sha256)})
    report = verify_tree(model, manifest, workers=1)
    assert report.ok and report.cached_files == 1 and report.hashed_files == len(manifest.files) - 1
    # A corrupted byte changes ctime (and mtime): the cached digest no longer counts and the file is re-hashed.
    with open(path, "r+b") as handle:
        handle.seek(100)
        handle.write(b"\xAA")
    report = verify_tree(model, manifest, workers=1)
    assert report.cached_files == 0 and report.checksum_mismatch == [shard]


def test_a_wrong_cached_digest_with_an_unchanged_stat_is_what_the_cache_reports(tmp_path, model):
    # The cache is written only by model_stage's own hashing; this pins that verify trusts it as designed.
    manifest = build_manifest(model, read_dtypes=safetensors_dtypes, workers=1)
    path = os.path.join(model, "config.json")
    save_hash_cache(model, {"config.json": (stat_key(path), "0" * 64)})
    assert verify_tree(model, manifest, workers=1).checksum_mismatch == ["config.json"]
    assert verify_tree(model, manifest, workers=1, use_cache=False).ok


def test_pending_transfer_counts_only_the_remainder_of_partial_files(tmp_path, model):
    manifest = build_manifest(model, read_dtypes=safetensors_dtypes, workers=1)
    staging = tmp_path / "staging"
    staging.mkdir()
    shard = manifest.by_path()["model-00001-of-00002.safetensors"]
    with open(os.path.join(model, shard.path), "rb") as src:
        (staging / shard.path).write_bytes(src.read(1000))
    (staging / "extra.txt").write_text("x")
    remaining, files, extra = pending_transfer(str(staging), manifest)
    assert remaining == manifest.total_bytes - 1000
    assert files == sorted(entry.path for entry in manifest.files)
    assert extra == ["extra.txt"]


def test_manifest_task_makes_keeps_and_then_reads_the_manifest(model):
    first = manifest_task(model, refresh=False, check_mode=False, workers=2, read_dtypes=safetensors_dtypes,
                          where="model-store")
    assert (first["changed"], first["created"], first["written"]) == (True, True, True)
    on_disk = load_manifest(os.path.join(model, MANIFEST_NAME))
    assert on_disk.content_id == first["manifest"]["content_id"]
    second = manifest_task(model, refresh=False, check_mode=False, workers=2, read_dtypes=safetensors_dtypes,
                           where="model-store")
    assert (second["changed"], second["created"]) == (False, False)
    assert second["manifest"] == first["manifest"]


def test_manifest_task_in_check_mode_writes_nothing(model):
    result = manifest_task(model, refresh=False, check_mode=True, workers=1, read_dtypes=safetensors_dtypes,
                           where="model-store")
    assert result["changed"] and not result["written"]
    assert not os.path.exists(os.path.join(model, MANIFEST_NAME))
    assert "config.json" in result["diff"]["after"]


def test_manifest_task_refuses_a_stale_manifest(model):
    manifest_task(model, refresh=False, check_mode=False, workers=1, read_dtypes=safetensors_dtypes, where="store")
    with open(os.path.join(model, "config.json"), "a") as handle:
        handle.write(" ")
    with pytest.raises(SyncError) as error:
        manifest_task(model, refresh=False, check_mode=False, workers=1, read_dtypes=safetensors_dtypes, where="store")
    assert "no longer matches the files beside it (wrong size: config.json" in str(error.value)
    assert "model_sync_manifest_refresh: true" in str(error.value)
    refreshed = manifest_task(model, refresh=True, check_mode=False, workers=1, read_dtypes=safetensors_dtypes,
                              where="store")
    assert refreshed["written"]


def test_manifest_task_on_a_read_only_source_returns_the_manifest_with_a_warning(model, monkeypatch):
    import ansible.module_utils.revive_sync.tasks as revive_sync

    def read_only(path, data, mode=0o644):
        raise OSError(30, "Read-only file system", path)

    monkeypatch.setattr(revive_sync, "write_json_atomic", read_only)
    result = manifest_task(model, refresh=False, check_mode=False, workers=1, read_dtypes=safetensors_dtypes,
                           where="node1")
    assert (result["changed"], result["written"]) == (False, False)
    assert result["manifest"]["file_count"] == len(os.listdir(model))
    assert result["warnings"] == [
        f"could not keep the manifest beside the model at {model}/revive-manifest.json on node1 (Read-only file "
        f"system); it is made again on every run until the source directory is writable for a moment"]


def test_manifest_task_names_a_missing_source():
    with pytest.raises(SyncError, match=r"source model directory /nonexistent/m does not exist on store: check "
                                        r"model_sync_source_path"):
        manifest_task("/nonexistent/m", refresh=False, check_mode=False, workers=1, read_dtypes=safetensors_dtypes,
                      where="store")


def test_bf16_on_volta_is_refused_with_the_fix():
    decision = decide_dtypes({"model-00001.safetensors": ("BF16",), "model-00002.safetensors": ("BF16", "F32")},
                             gpu_bf16=False, convert_bf16=False, allowed_dtypes=(), where="node1")
    assert decision.error == (
        "the model has BF16 weights (model-00001.safetensors, model-00002.safetensors) but the GPUs of node1 have no "
        "BF16 (compute capability below 8.0, e.g. V100); vLLM 0.5.4 refuses them with 'Bfloat16 is only supported "
        "on GPUs with compute capability of at least 8.0' (docs/facts/vllm-volta.md §1.4). Sync an FP16 "
        "revision of the model, or set model_sync_convert_bf16: true to convert it to FP16 on the node (values "
        "beyond FP16's ±65504 are counted and reported).")


def test_bf16_is_converted_when_enabled_and_kept_on_bf16_gpus():
    dtypes = {"a.safetensors": ("BF16",)}
    assert decide_dtypes(dtypes, gpu_bf16=False, convert_bf16=True, allowed_dtypes=("F16",), where="n").convert_bf16
    kept = decide_dtypes(dtypes, gpu_bf16=True, convert_bf16=True, allowed_dtypes=(), where="n")
    assert not kept.convert_bf16 and kept.error is None


def test_dtypes_outside_the_plan_are_refused_by_file():
    decision = decide_dtypes({"a.safetensors": ("F16",), "b.safetensors": ("F32",)}, gpu_bf16=False,
                             convert_bf16=False, allowed_dtypes=("F16",), where="node1")
    assert decision.error.startswith("the model has tensors of dtype F32 (in b.safetensors) but the plan for node1 "
                                     "allows only F16.")
