"""Atomic promotion: only a verified copy becomes visible, read-only for the service group; `current` swaps by rename."""
from __future__ import annotations

import grp
import os
import shutil
import stat

import pytest
from ansible.module_utils.revive_sync.dtype import safetensors_dtypes
from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.manifest import MANIFEST_NAME, VERIFIED_MARKER, build_manifest
from ansible.module_utils.revive_sync.promote import converting_path, staging_path, swap_symlink
from ansible.module_utils.revive_sync.tasks import promote_task
from ansible.module_utils.revive_sync.verify import mark_verified
from fixtures.models import write_model

GROUP = grp.getgrgid(os.getgid()).gr_name


@pytest.fixture()
def layout(tmp_path):
    dest = str(tmp_path / "models" / "chat" / "rev1")
    staging = staging_path(dest)
    write_model(staging, "llama-2-7b-chat", dtype="F16", shards=2)
    manifest = build_manifest(staging, read_dtypes=safetensors_dtypes, workers=1)
    mark_verified(staging, manifest)
    return dest, staging, manifest


def _promote(dest, content_id, check_mode=False, candidates=None):
    return promote_task(dest, content_id, candidates=candidates or [staging_path(dest)], group=GROUP,
                        current_link=os.path.join(os.path.dirname(dest), "current"), update_current=True,
                        fsync=True, check_mode=check_mode, cleanup=[staging_path(dest), converting_path(dest)])


def test_paths_sit_beside_the_revision_so_promotion_is_a_rename():
    assert staging_path("/data/models/chat/rev1") == "/data/models/chat/.rev1.staging"
    assert converting_path("/data/models/chat/rev1/") == "/data/models/chat/.rev1.converting"


def test_verified_staging_is_renamed_sealed_and_current_points_at_it(layout):
    dest, staging, manifest = layout
    result = _promote(dest, manifest.content_id)
    assert result["changed"] and result["promoted_from"] == staging
    assert result["actions"] == [f"promote {staging} to {dest}", f"point {os.path.dirname(dest)}/current at rev1"]
    assert not os.path.exists(staging)
    assert os.readlink(os.path.join(os.path.dirname(dest), "current")) == "rev1"
    assert sorted(os.listdir(dest)) == sorted([entry.path for entry in manifest.files] + [MANIFEST_NAME])
    for name in os.listdir(dest):
        info = os.stat(os.path.join(dest, name))
        assert stat.S_IMODE(info.st_mode) == 0o440 and info.st_uid == 0 and info.st_gid == grp.getgrnam(GROUP).gr_gid
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o750


def test_second_promotion_changes_nothing(layout):
    dest, _, manifest = layout
    _promote(dest, manifest.content_id)
    again = _promote(dest, manifest.content_id)
    assert not again["changed"] and again["up_to_date"] and again["actions"] == []


def test_a_copy_changed_after_verification_is_never_promoted(layout):
    dest, staging, manifest = layout
    with open(os.path.join(staging, "config.json"), "a") as handle:
        handle.write(" ")
    with pytest.raises(SyncError) as error:
        _promote(dest, manifest.content_id)
    assert f"nothing verified to promote to {dest}: none of {staging} holds a verified copy" in str(error.value)
    assert not os.path.exists(dest)


def test_an_unverified_copy_is_never_promoted(layout):
    dest, staging, manifest = layout
    os.unlink(os.path.join(staging, VERIFIED_MARKER))
    with pytest.raises(SyncError):
        _promote(dest, manifest.content_id)
    assert not os.path.exists(dest) and not os.path.lexists(os.path.join(os.path.dirname(dest), "current"))


def test_check_mode_reports_and_changes_nothing(layout):
    dest, staging, manifest = layout
    result = _promote(dest, manifest.content_id, check_mode=True)
    assert result["changed"]
    assert result["diff"]["after"] == f"{dest}: verified copy of {manifest.content_id}\n{os.path.dirname(dest)}/current -> rev1\n"
    assert os.path.isdir(staging) and not os.path.exists(dest)


def test_check_mode_before_any_transfer_predicts_a_promotion(tmp_path):
    dest = str(tmp_path / "models" / "chat" / "rev1")
    os.makedirs(os.path.dirname(dest))
    result = _promote(dest, "ab" * 32, check_mode=True)
    assert result["changed"] and result["actions"][0] == f"promote the staged copy to {dest}"


def test_an_outdated_promoted_copy_is_replaced_and_the_old_one_removed(layout, tmp_path):
    dest, staging, manifest = layout
    old = tmp_path / "old"
    write_model(str(old), "mistral-7b-instruct-v0.2", dtype="F16", shards=1)
    old_manifest = build_manifest(str(old), read_dtypes=safetensors_dtypes, workers=1)
    mark_verified(str(old), old_manifest)
    shutil.move(str(old), dest)
    result = _promote(dest, manifest.content_id)
    assert result["changed"] and f"promote {staging} to {dest}" in result["actions"]
    assert os.path.exists(os.path.join(dest, "model-00002-of-00002.safetensors"))
    assert [name for name in os.listdir(os.path.dirname(dest)) if "replaced" in name] == []


def test_converted_copy_is_promoted_and_staging_removed(layout):
    dest, staging, manifest = layout
    converting = converting_path(dest)
    shutil.copytree(staging, converting)
    mark_verified(converting, manifest)
    result = _promote(dest, manifest.content_id, candidates=[converting])
    assert result["promoted_from"] == converting
    assert f"remove {staging}" in result["actions"]
    assert not os.path.exists(staging) and not os.path.exists(converting)


def test_current_that_is_a_real_directory_is_refused(layout):
    dest, _, manifest = layout
    os.makedirs(os.path.join(os.path.dirname(dest), "current"))
    with pytest.raises(SyncError, match=r"current exists and is not a symlink"):
        _promote(dest, manifest.content_id)


def test_swap_symlink_replaces_the_link_in_one_rename(tmp_path):
    link = str(tmp_path / "current")
    swap_symlink(link, "rev1")
    inode = os.lstat(link).st_ino
    swap_symlink(link, "rev2")
    assert os.readlink(link) == "rev2" and os.lstat(link).st_ino != inode
    assert os.listdir(tmp_path) == ["current"]


def test_missing_service_group_is_named(layout):
    dest, _, manifest = layout
    with pytest.raises(SyncError, match=r"group no-such-group-xyz does not exist; model_sync creates it"):
        promote_task(dest, manifest.content_id, candidates=[staging_path(dest)], group="no-such-group-xyz",
                     current_link=os.path.join(os.path.dirname(dest), "current"), update_current=True,
                     fsync=False, check_mode=False)
