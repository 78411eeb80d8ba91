"""model_sync staging with real rsync (local source): resume moves the remainder, corruption is re-fetched."""
from __future__ import annotations

import os
import shutil

import pytest
from ansible.module_utils.revive_sync.dtype import DtypePolicy, safetensors_dtypes
from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.manifest import MANIFEST_NAME, VERIFIED_MARKER, build_manifest
from ansible.module_utils.revive_sync.rsync import RsyncSource, parse_rsync_stats, rsync_argv
from ansible.module_utils.revive_sync.tasks import stage_task
from ansible.module_utils.revive_sync.verify import verified_manifest
from fixtures.models import write_model

POLICY = DtypePolicy(gpu_bf16=False, convert_bf16=False, allowed_dtypes=())


FAKE_SSH = """#!/bin/sh
# Test double for ssh: records its argv, drops the options and the host, runs the remote command here.
echo "$@" >> "$(dirname "$0")/ssh.log"
while [ $# -gt 0 ]; do
  case "$1" in
    -p|-o|-i|-l) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
shift
exec sh -c "$*"
"""


@pytest.fixture()
def fake_ssh(tmp_path, monkeypatch):
    """rsync pulls through this 'ssh', so the local rsync is the receiver exactly as on a node pulling from the store."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir / "ssh.log"


@pytest.fixture()
def source(tmp_path, fake_ssh):
    path = write_model(str(tmp_path / "src"), "llama-2-7b-chat", dtype="F16", shards=3)
    # Random tail bytes so every shard differs and rsync cannot match blocks across files.
    for index, name in enumerate(sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))):
        with open(os.path.join(path, name), "r+b") as handle:
            handle.seek(-64, os.SEEK_END)
            handle.write(os.urandom(64))
    return path


def _stage(source_dir, staging, manifest, **overrides):
    kwargs = dict(repair=True, check_mode=False, workers=2, read_dtypes=safetensors_dtypes, policy=POLICY,
                  where="node1")
    kwargs.update(overrides)
    remote = RsyncSource(path=source_dir, host="model-store", identity_file="/k", known_hosts_file="/kh")
    return stage_task(remote if source_dir else None, staging, manifest, **kwargs)


def _same_tree(a, b, manifest):
    for entry in manifest.files:
        with open(os.path.join(a, entry.path), "rb") as left, open(os.path.join(b, entry.path), "rb") as right:
            assert left.read() == right.read(), entry.path


def test_rsync_argv_is_resumable_pull_with_pinned_host_key():
    source = RsyncSource(path="chat/rev1", host="10.77.0.10", user="root", port=2222,
                         identity_file="/root/.ssh/revive_model_sync", known_hosts_file="/etc/revive/kh")
    assert rsync_argv(source, "/data/models/chat/.rev1.staging", bwlimit_kib=50000) == [
        "rsync", "--recursive", "--times", "--links", "--copy-unsafe-links", "--append-verify", "--delete",
        "--no-human-readable",
        "--stats", "--out-format=revive-done %n", "--timeout=300", "--exclude=/revive-manifest.json",
        "--exclude=/.revive-*", "--exclude=/.git", "--exclude=/.cache", "--bwlimit=50000",
        "-e", "ssh -p 2222 -o BatchMode=yes -o ConnectTimeout=20 -o ServerAliveInterval=15 -o ServerAliveCountMax=4 "
              "-i /root/.ssh/revive_model_sync -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes "
              "-o UserKnownHostsFile=/etc/revive/kh",
        "root@10.77.0.10:chat/rev1/", "/data/models/chat/.rev1.staging/"]


def test_rsync_stats_are_parsed_with_or_without_separators():
    stats = parse_rsync_stats("Number of regular files transferred: 3\nNumber of deleted files: 1\n"
                              "Literal data: 1,234,567 bytes\nMatched data: 0 bytes\n"
                              "Total bytes received: 1234999\nTotal bytes sent: 88\n")
    assert (stats.files_transferred, stats.files_deleted, stats.literal_bytes, stats.bytes_received,
            stats.bytes_sent) == (3, 1, 1234567, 1234999, 88)


def test_first_stage_copies_verifies_and_marks(tmp_path, source, fake_ssh):
    manifest = build_manifest(source, read_dtypes=safetensors_dtypes, workers=1)
    staging = str(tmp_path / ".rev1.staging")
    result = _stage(source, staging, manifest)
    assert result["changed"] and result["verified"]
    assert sorted(result["transferred"]) == sorted(entry.path for entry in manifest.files)
    assert result["literal_bytes"] == manifest.total_bytes
    # Every file was hashed as rsync reported it finished; verification then only read the cache.
    assert result["hashed_during_transfer"] == len(manifest.files)
    assert result["verify"]["cached_files"] == len(manifest.files) and result["verify"]["hashed_files"] == 0
    _same_tree(source, staging, manifest)
    assert verified_manifest(staging).content_id == manifest.content_id
    assert os.path.exists(os.path.join(staging, MANIFEST_NAME))
    ssh_argv = fake_ssh.read_text()
    assert "-i /k -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile=/kh -l root model-store " \
           "rsync --server --sender" in ssh_argv
    assert "--append --append" in ssh_argv  # what --append-verify is on the wire


def test_local_source_is_copied_and_verified(tmp_path, source):
    manifest = build_manifest(source, read_dtypes=safetensors_dtypes, workers=1)
    staging = str(tmp_path / ".rev1.staging")
    result = stage_task(RsyncSource(path=source), staging, manifest, repair=True, check_mode=False, workers=2,
                        read_dtypes=safetensors_dtypes, policy=POLICY, where="node1")
    assert result["verified"]
    assert result["verify"]["cached_files"] + result["verify"]["hashed_files"] == len(manifest.files)
    _same_tree(source, staging, manifest)


def test_second_stage_of_a_verified_copy_changes_nothing(tmp_path, source):
    manifest = build_manifest(source, read_dtypes=safetensors_dtypes, workers=1)
    staging = str(tmp_path / ".rev1.staging")
    _stage(source, staging, manifest)
    again = _stage(source, staging, manifest)
    assert not again["changed"] and again["verified"] and again["transferred"] == []


def test_interrupted_transfer_resumes_moving_only_the_remainder(tmp_path, source):
    manifest = build_manifest(source, read_dtypes=safetensors_dtypes, workers=1)
    staging = tmp_path / ".rev1.staging"
    staging.mkdir()
    # What a killed rsync --append-verify leaves: whole files, one cut short in place, one not started.
    shards = [entry for entry in manifest.files if entry.path.endswith(".safetensors")]
    cut = shards[1]
    for entry in manifest.files:
        if entry is shards[2]:
            continue
        with open(os.path.join(source, entry.path), "rb") as src:
            data = src.read()
        (staging / entry.path).write_bytes(data[: entry.size // 3] if entry is cut else data)
        shutil.copystat(os.path.join(source, entry.path), staging / entry.path)
    remainder = (cut.size - cut.size // 3) + shards[2].size
    result = _stage(source, str(staging), manifest)
    assert result["remainder_bytes"] == remainder
    assert sorted(result["transferred"]) == sorted([cut.path, shards[2].path])
    assert remainder <= result["literal_bytes"] <= remainder * 1.10
    _same_tree(source, str(staging), manifest)


def test_corrupted_byte_in_staging_is_caught_and_refetched(tmp_path, source):
    manifest = build_manifest(source, read_dtypes=safetensors_dtypes, workers=1)
    staging = str(tmp_path / ".rev1.staging")
    _stage(source, staging, manifest)
    shard = os.path.join(staging, "model-00002-of-00003.safetensors")
    mtime = os.stat(shard).st_mtime_ns
    with open(shard, "r+b") as handle:
        handle.seek(4096)
        byte = handle.read(1)
        handle.seek(4096)
        handle.write(bytes([byte[0] ^ 0x01]))
    os.utime(shard, ns=(mtime, mtime))  # same size and mtime: rsync's quick check alone would miss it
    result = _stage(source, staging, manifest)
    assert result["repaired"] == ["model-00002-of-00003.safetensors"]
    assert result["verified"] and "model-00002-of-00003.safetensors" in result["transferred"]
    _same_tree(source, staging, manifest)


def test_extra_files_in_staging_are_removed(tmp_path, source):
    manifest = build_manifest(source, read_dtypes=safetensors_dtypes, workers=1)
    staging = tmp_path / ".rev1.staging"
    staging.mkdir()
    (staging / "leftover.bin").write_bytes(b"old")
    _stage(source, str(staging), manifest)
    assert not (staging / "leftover.bin").exists()


def test_source_that_no_longer_matches_its_manifest_fails_after_one_refetch(tmp_path, source):
    manifest = build_manifest(source, read_dtypes=safetensors_dtypes, workers=1)
    with open(os.path.join(source, "model-00001-of-00003.safetensors"), "r+b") as handle:
        handle.seek(512)
        handle.write(b"\x7f")
    with pytest.raises(SyncError) as error:
        _stage(source, str(tmp_path / ".rev1.staging"), manifest)
    assert "still differs from the manifest after fetching the bad files again (sha256 differs: " \
           "model-00001-of-00003.safetensors)" in str(error.value)
    assert "model_sync_manifest_refresh: true" in str(error.value)


def test_missing_source_fails_with_rsync_exit_and_resume_hint(tmp_path, source):
    manifest = build_manifest(source, read_dtypes=safetensors_dtypes, workers=1)
    with pytest.raises(SyncError) as error:
        _stage(str(tmp_path / "nope"), str(tmp_path / ".rev1.staging"), manifest)
    assert f"rsync from model-store:{tmp_path}/nope into {tmp_path}/.rev1.staging on node1 failed with exit 23 " \
           f"(partial transfer due to error)" in str(error.value)
    assert "the next run resumes it" in str(error.value)


def test_check_mode_reports_the_remainder_and_writes_nothing(tmp_path, source):
    manifest = build_manifest(source, read_dtypes=safetensors_dtypes, workers=1)
    staging = str(tmp_path / ".rev1.staging")
    result = _stage(source, staging, manifest, check_mode=True)
    assert result["changed"] and not result["verified"]
    assert result["remainder_bytes"] == manifest.total_bytes
    assert not os.path.exists(staging)


def test_verify_only_mode_removes_corrupt_files_for_the_caller_to_push_again(tmp_path, source):
    manifest = build_manifest(source, read_dtypes=safetensors_dtypes, workers=1)
    staging = tmp_path / ".rev1.staging"
    shutil.copytree(source, staging)
    (staging / "config.json").write_text("{}")
    result = _stage(None, str(staging), manifest)
    assert result["refetch"] == ["config.json"] and not result["verified"]
    assert not (staging / "config.json").exists()
    shutil.copy2(os.path.join(source, "config.json"), staging / "config.json")
    result = _stage(None, str(staging), manifest, repair=False)
    assert result["verified"] and (staging / VERIFIED_MARKER).exists()


def test_bf16_staged_on_volta_is_refused_even_if_the_manifest_said_otherwise(tmp_path, fake_ssh):
    source = write_model(str(tmp_path / "src"), "llama-2-7b-chat", dtype="BF16", shards=1)
    manifest = build_manifest(source, read_dtypes=lambda path: ("F16",), workers=1)
    with pytest.raises(SyncError, match=r"the model has BF16 weights \(model.safetensors\) but the GPUs of node1"):
        _stage(source, str(tmp_path / ".rev1.staging"), manifest)
    assert verified_manifest(str(tmp_path / ".rev1.staging")) is None


def test_a_truncated_shard_header_is_named(tmp_path, fake_ssh):
    source = write_model(str(tmp_path / "src"), "llama-2-7b-chat", dtype="F16", shards=1)
    with open(os.path.join(source, "model.safetensors"), "r+b") as handle:
        handle.truncate(100)
    manifest = build_manifest(source, read_dtypes=lambda path: ("F16",), workers=1)
    with pytest.raises(Exception, match=r"model\.safetensors: corrupt safetensors header"):
        _stage(source, str(tmp_path / ".rev1.staging"), manifest)


def test_hugging_face_cache_snapshot_is_staged_as_regular_files(tmp_path, source):
    # snapshots/<rev>/ holds symlinks into ../../blobs: outside the transferred tree, so rsync copies the bytes.
    blobs = tmp_path / "hub" / "blobs"
    snapshot = tmp_path / "hub" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for name in os.listdir(source):
        shutil.copy2(os.path.join(source, name), blobs / name)
        (snapshot / name).symlink_to(os.path.join("..", "..", "blobs", name))
    manifest = build_manifest(str(snapshot), read_dtypes=safetensors_dtypes, workers=1)
    staging = tmp_path / ".rev1.staging"
    assert _stage(str(snapshot), str(staging), manifest)["verified"]
    assert all(not (staging / entry.path).is_symlink() and (staging / entry.path).is_file()
               for entry in manifest.files)
