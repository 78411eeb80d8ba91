"""Atomic promotion: staging (or the converted copy) → <revision>, then `current` → <revision>.

Staging and the FP16 copy sit beside the promoted path, on its filesystem, so promotion is a rename.
"""
from __future__ import annotations

import errno
import grp
import os
import shutil
from dataclasses import dataclass
from typing import Optional

from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.manifest import (
    HASH_CACHE,
    MANIFEST_NAME,
    VERIFIED_MARKER,
    Manifest,
    load_manifest,
)
from ansible.module_utils.revive_sync.verify import verify_tree


def staging_path(dest: str) -> str:
    return os.path.join(os.path.dirname(dest.rstrip("/")), f".{os.path.basename(dest.rstrip('/'))}.staging")


def converting_path(dest: str) -> str:
    return os.path.join(os.path.dirname(dest.rstrip("/")), f".{os.path.basename(dest.rstrip('/'))}.converting")


def promoted_manifest(dest: str) -> Optional[Manifest]:
    path = os.path.join(dest, MANIFEST_NAME)
    if not os.path.isfile(path):
        return None
    try:
        return load_manifest(path)
    except SyncError:
        return None


@dataclass(frozen=True)
class PromotedState:
    """What is under the promoted path now, compared with the source manifest."""
    exists: bool
    up_to_date: bool
    reason: str
    content_id: Optional[str] = None


def promoted_state(dest: str, source: Manifest, *, workers: int, full: bool) -> PromotedState:
    if not os.path.exists(dest):
        return PromotedState(False, False, f"{dest} does not exist yet")
    manifest = promoted_manifest(dest)
    if manifest is None:
        return PromotedState(True, False, f"{dest} has no valid {MANIFEST_NAME}")
    if manifest.source_content_id != source.content_id:
        return PromotedState(True, False, f"{dest} holds other bytes (content id {manifest.source_content_id[:12]}, "
                                          f"source {source.content_id[:12]})", manifest.content_id)
    report = verify_tree(dest, manifest, workers=workers, use_cache=False, quick=not full)
    if not report.ok:
        return PromotedState(True, False, f"{dest} does not match its manifest: {report.summary()}",
                             manifest.content_id)
    return PromotedState(True, True, f"{dest} matches the source manifest", manifest.content_id)


FILE_MODE = 0o440
DIR_MODE = 0o750


def group_id(group: str) -> Optional[int]:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def seal_tree(root: str, gid: int, *, fsync: bool = True) -> None:
    """root:<service group>, files 0440 and directories 0750, data flushed to disk before it is renamed in."""
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            os.chown(path, 0, gid)
            os.chmod(path, FILE_MODE)
            if fsync:
                descriptor = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(descriptor)
                finally:
                    os.close(descriptor)
        os.chown(directory, 0, gid)
        os.chmod(directory, DIR_MODE)


def _fsync_dir(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def link_target(dest: str, link: str) -> str:
    return os.path.relpath(dest, os.path.dirname(link))


def current_link_state(link: str) -> Optional[str]:
    """The symlink's target, None when absent; a real file or directory there is an error."""
    if os.path.islink(link):
        return os.readlink(link)
    if os.path.lexists(link):
        raise SyncError(f"{link} exists and is not a symlink; model_sync points it at the promoted revision. "
                        f"Move it away (it may be a model copied by hand) or set model_sync_current_link.")
    return None


def swap_symlink(link: str, target: str) -> None:
    """Point `link` at `target` atomically: make a new symlink beside it and rename it over the old one."""
    temporary = f"{link}.tmp-{os.getpid()}"
    if os.path.lexists(temporary):
        os.unlink(temporary)
    os.symlink(target, temporary)
    os.replace(temporary, link)
    _fsync_dir(os.path.dirname(link) or ".")


def promote_tree(source_dir: str, dest: str, gid: int, *, fsync: bool = True) -> None:
    """Seal `source_dir` and rename it to `dest`. A previous copy at dest is renamed aside, then removed."""
    for name in (VERIFIED_MARKER, HASH_CACHE):
        try:
            os.unlink(os.path.join(source_dir, name))
        except FileNotFoundError:
            pass
    seal_tree(source_dir, gid, fsync=fsync)
    parent = os.path.dirname(dest.rstrip("/"))
    replaced = None
    if os.path.lexists(dest):
        replaced = os.path.join(parent, f".{os.path.basename(dest)}.replaced-{os.getpid()}")
        os.rename(dest, replaced)
    try:
        os.rename(source_dir, dest)
    except OSError as exc:
        if replaced:
            os.rename(replaced, dest)
        if exc.errno == errno.EXDEV:
            raise SyncError(f"{source_dir} and {dest} are on different filesystems; staging must sit beside "
                            f"the destination so promotion is a rename") from exc
        raise
    _fsync_dir(parent)
    if replaced:
        shutil.rmtree(replaced)
