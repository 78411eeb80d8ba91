"""A tree against a manifest (missing, extra, wrong size, wrong sha256), the hash cache, the verified marker."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ansible.module_utils.revive_files import write_json_atomic
from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.manifest import (
    HASH_CACHE,
    MANIFEST_NAME,
    VERIFIED_MARKER,
    Manifest,
    hash_files,
    load_manifest,
    scan_tree,
)


@dataclass
class VerifyReport:
    root: str
    missing: List[str] = field(default_factory=list)
    extra: List[str] = field(default_factory=list)
    size_mismatch: List[Tuple[str, int, int]] = field(default_factory=list)  # (path, expected, actual)
    checksum_mismatch: List[str] = field(default_factory=list)
    hashed_files: int = 0
    cached_files: int = 0

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.size_mismatch or self.checksum_mismatch)

    @property
    def corrupt(self) -> List[str]:
        """Files present with wrong content: removing and re-fetching them repairs the tree."""
        return sorted([path for path, _, _ in self.size_mismatch] + self.checksum_mismatch)

    def summary(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"missing: {', '.join(self.missing)}")
        if self.size_mismatch:
            parts.append("wrong size: " + ", ".join(
                f"{path} ({actual} bytes, manifest says {expected})" for path, expected, actual in self.size_mismatch))
        if self.checksum_mismatch:
            parts.append(f"sha256 differs: {', '.join(self.checksum_mismatch)}")
        if self.extra:
            parts.append(f"not in the manifest: {', '.join(self.extra)}")
        return "; ".join(parts) if parts else "all files match"

    def to_dict(self) -> dict:
        return {
            "ok": self.ok, "missing": self.missing, "extra": self.extra,
            "size_mismatch": [{"path": path, "expected": expected, "actual": actual}
                              for path, expected, actual in self.size_mismatch],
            "checksum_mismatch": self.checksum_mismatch,
            "hashed_files": self.hashed_files, "cached_files": self.cached_files,
        }


StatKey = Tuple[int, int, int, int, int]


def stat_key(path: str) -> StatKey:
    """What changes whenever a file's bytes change: size, mtime, ctime (not settable), inode, device."""
    info = os.stat(path)
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)


def load_hash_cache(root: str) -> Dict[str, Tuple[StatKey, str]]:
    """Digests computed while rsync was still writing (model_stage), valid while the file's stat is unchanged."""
    try:
        with open(os.path.join(root, HASH_CACHE), encoding="utf-8") as handle:
            raw = json.load(handle)
        return {path: (tuple(entry["stat"]), entry["sha256"]) for path, entry in raw["files"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def save_hash_cache(root: str, cache: Dict[str, Tuple[StatKey, str]]) -> None:
    write_json_atomic(os.path.join(root, HASH_CACHE),
                      {"files": {path: {"stat": list(key), "sha256": digest} for path, (key, digest) in cache.items()}},
                      mode=0o600)


def verify_tree(root: str, manifest: Manifest, *, workers: int, use_cache: bool = True,
                quick: bool = False) -> VerifyReport:
    """Compare a tree with a manifest: missing, extra, wrong-size and wrong-checksum files, by name.

    `quick` compares names and sizes only (for an already promoted, read-only copy).
    """
    report = VerifyReport(root=root)
    present = scan_tree(root) if os.path.isdir(root) else {}
    expected = manifest.by_path()
    report.missing = sorted(set(expected) - set(present))
    report.extra = sorted(set(present) - set(expected))
    to_hash = []
    for relpath in sorted(set(expected) & set(present)):
        if present[relpath] != expected[relpath].size:
            report.size_mismatch.append((relpath, expected[relpath].size, present[relpath]))
        else:
            to_hash.append(relpath)
    if quick:
        return report
    cache = load_hash_cache(root) if use_cache else {}
    digests: Dict[str, str] = {}
    uncached = []
    for relpath in to_hash:
        cached = cache.get(relpath)
        if cached and cached[0] == stat_key(os.path.join(root, relpath)):
            digests[relpath] = cached[1]
        else:
            uncached.append(relpath)
    report.cached_files = len(digests)
    digests.update(hash_files(root, uncached, workers))
    report.hashed_files = len(uncached)
    report.checksum_mismatch = [relpath for relpath in to_hash if digests[relpath] != expected[relpath].sha256]
    return report


def pending_transfer(root: str, manifest: Manifest) -> Tuple[int, List[str], List[str]]:
    """(bytes still to move, files to fetch, extra files) judged by name and size, as rsync --append-verify would.

    A file shorter than the manifest says is a partial transfer: only its remainder moves.
    """
    present = scan_tree(root) if os.path.isdir(root) else {}
    remaining = 0
    files = []
    for entry in manifest.files:
        have = present.get(entry.path)
        if have == entry.size:
            continue
        files.append(entry.path)
        remaining += entry.size - have if have is not None and have < entry.size else entry.size
    extra = sorted(set(present) - set(manifest.by_path()))
    return remaining, files, extra


# The verified marker: a tree matched its manifest, and no file changed since.


def mark_verified(root: str, manifest: Manifest) -> None:
    """Record that `root` matched `manifest`, with each file's stat, and keep the manifest beside the model."""
    write_json_atomic(os.path.join(root, MANIFEST_NAME), manifest.to_dict())
    snapshot = {entry.path: list(stat_key(os.path.join(root, entry.path))) for entry in manifest.files}
    write_json_atomic(os.path.join(root, VERIFIED_MARKER),
                      {"content_id": manifest.content_id, "files": snapshot}, mode=0o600)


def verified_manifest(root: str) -> Optional[Manifest]:
    """The manifest `root` was verified against, if it was and no file changed since; else None."""
    try:
        with open(os.path.join(root, VERIFIED_MARKER), encoding="utf-8") as handle:
            marker = json.load(handle)
        manifest = load_manifest(os.path.join(root, MANIFEST_NAME))
    except (OSError, ValueError, SyncError):
        return None
    if marker.get("content_id") != manifest.content_id or set(scan_tree(root)) != set(manifest.by_path()):
        return None
    for relpath, key in marker.get("files", {}).items():
        try:
            if list(stat_key(os.path.join(root, relpath))) != key:
                return None
        except OSError:
            return None
    return manifest


def invalidate_verified(root: str) -> None:
    for name in (VERIFIED_MARKER, MANIFEST_NAME):
        try:
            os.unlink(os.path.join(root, name))
        except FileNotFoundError:
            pass
