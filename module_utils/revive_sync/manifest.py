"""The manifest: every file's relative path, size and sha256, kept beside the model as revive-manifest.json.

sha256 because it is what the Hugging Face Hub uses as the LFS object id of weight files (so manifest
entries can be compared with the Hub's), and with SHA-NI it is the fastest stdlib digest (measured:
sha256 1281 MB/s, blake2b 705 MB/s, md5 561 MB/s on this build host); files are hashed in parallel.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Optional, Tuple

from ansible.module_utils.revive_bounds import Bound
from ansible.module_utils.revive_sync.errors import SyncError

MANIFEST_NAME = "revive-manifest.json"
MANIFEST_FORMAT = "revive-model-manifest/1"
# Reserved names inside a model directory: our own bookkeeping files start with this prefix.
RESERVED_PREFIX = ".revive-"
VERIFIED_MARKER = ".revive-verified.json"
HASH_CACHE = ".revive-hashes.json"
# Top-level entries that are not part of a model: VCS data and huggingface_hub's download metadata.
IGNORED_TOP_LEVEL = (".git", ".cache")
HASH_CHUNK_BYTES = 8 << 20
SAFETENSORS_SUFFIX = ".safetensors"


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    sha256: str
    dtypes: Optional[Tuple[str, ...]] = None

    def to_dict(self) -> dict:
        entry: dict = {"path": self.path, "size": self.size, "sha256": self.sha256}
        if self.dtypes is not None:
            entry["dtypes"] = list(self.dtypes)
        return entry


def content_id_of(files: Iterable[ManifestFile]) -> str:
    """Identity of a model's bytes: sha256 over the sorted (path, size, sha256) triples."""
    digest = hashlib.sha256()
    for entry in sorted(files, key=lambda item: item.path):
        digest.update(f"{entry.path}\0{entry.size}\0{entry.sha256}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    files: Tuple[ManifestFile, ...]
    converted_from: Optional[dict] = None

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files)

    @property
    def content_id(self) -> str:
        return content_id_of(self.files)

    @property
    def source_content_id(self) -> str:
        """The content id of the bytes this model was made from: itself, or the BF16 original."""
        return self.converted_from["content_id"] if self.converted_from else self.content_id

    def by_path(self) -> Dict[str, ManifestFile]:
        return {entry.path: entry for entry in self.files}

    def dtypes(self) -> Dict[str, Tuple[str, ...]]:
        return {entry.path: entry.dtypes for entry in self.files if entry.dtypes is not None}

    def to_dict(self) -> dict:
        return {
            "format": MANIFEST_FORMAT,
            "algorithm": "sha256",
            "content_id": self.content_id,
            "total_bytes": self.total_bytes,
            "file_count": len(self.files),
            "files": [entry.to_dict() for entry in sorted(self.files, key=lambda item: item.path)],
            "converted_from": self.converted_from,
        }


_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def manifest_from_dict(data: dict, where: str) -> Manifest:
    """Validate and load a manifest dict; `where` names it in errors (a file path, or 'parameter')."""
    def bad(why: str) -> SyncError:
        return SyncError(f"manifest {where} is invalid: {why}. Remove it and let model_sync make a new one "
                         f"(model_sync_manifest_refresh: true).")

    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise bad(f"format is not {MANIFEST_FORMAT!r}")
    if data.get("algorithm") != "sha256":
        raise bad(f"algorithm {data.get('algorithm')!r} is not 'sha256'")
    entries = []
    for raw in data.get("files") or []:
        try:
            path, size, digest = raw["path"], raw["size"], raw["sha256"]
        except (KeyError, TypeError) as exc:
            raise bad(f"file entry {raw!r} lacks {exc}") from exc
        if not isinstance(path, str) or path.startswith("/") or ".." in path.split("/") or not path:
            raise bad(f"file path {path!r} is not a relative path inside the model")
        if not isinstance(size, int) or size < 0 or not _SHA256_HEX.match(str(digest)):
            raise bad(f"entry for {path} has a bad size or sha256")
        dtypes = raw.get("dtypes")
        entries.append(ManifestFile(path, size, digest, tuple(dtypes) if dtypes is not None else None))
    if not entries:
        raise bad("it lists no files")
    manifest = Manifest(files=tuple(sorted(entries, key=lambda item: item.path)),
                        converted_from=data.get("converted_from"))
    if data.get("content_id") not in (None, manifest.content_id):
        raise bad("its content_id does not match its file list (edited by hand?)")
    return manifest


def load_manifest(path: str) -> Manifest:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except json.JSONDecodeError as exc:
        raise SyncError(f"manifest {path} is not JSON ({exc}). Remove it and let model_sync make a new one "
                        f"(model_sync_manifest_refresh: true).") from exc
    return manifest_from_dict(data, path)


def is_model_file(relpath: str) -> bool:
    top = relpath.split("/", 1)[0]
    return not (top == MANIFEST_NAME or top.startswith(RESERVED_PREFIX) or top in IGNORED_TOP_LEVEL)


def scan_tree(root: str) -> Dict[str, int]:
    """Relative path → size of every model file under root (symlinks followed: the bytes are what counts)."""
    found: Dict[str, int] = {}
    for directory, subdirs, files in os.walk(root, followlinks=True):
        relative_dir = os.path.relpath(directory, root)
        if relative_dir == ".":
            subdirs[:] = [name for name in subdirs if name not in IGNORED_TOP_LEVEL]
        for name in files:
            relpath = name if relative_dir == "." else f"{relative_dir}/{name}"
            if not is_model_file(relpath):
                continue
            info = os.stat(os.path.join(directory, name))
            if stat.S_ISREG(info.st_mode):
                found[relpath] = info.st_size
    return found


def sha256_file(path: str, chunk_bytes: int = HASH_CHUNK_BYTES, *, flush: bool = False) -> str:
    """sha256 of a file; with `flush`, its data is also forced to disk (fsync) once read."""
    digest = hashlib.sha256()
    buffer = bytearray(chunk_bytes)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            count = handle.readinto(buffer)
            if not count:
                break
            digest.update(view[:count])  # hashlib releases the GIL here, so threads hash in parallel
        if flush:
            os.fsync(handle.fileno())
    return digest.hexdigest()


# The modules' `workers` option (model_manifest, model_preflight, model_stage): 0 is default_workers().
WORKERS = Bound(int, 0, high=256, unset=0, unset_means="one per CPU, at most 8", why="files hashed at once")


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def hash_files(root: str, relpaths: Iterable[str], workers: int) -> Dict[str, str]:
    relpaths = list(relpaths)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        digests = pool.map(lambda relpath: sha256_file(os.path.join(root, relpath)), relpaths)
        return dict(zip(relpaths, digests))


DtypeReader = Callable[[str], Tuple[str, ...]]


def build_manifest(root: str, *, read_dtypes: DtypeReader, workers: int) -> Manifest:
    """Hash every model file under root; safetensors files also record their dtypes (header only)."""
    sizes = scan_tree(root)
    if not sizes:
        raise SyncError(f"no model files under {root}: check model_sync_source_path")
    digests = hash_files(root, sorted(sizes), workers)
    entries = []
    for relpath in sorted(sizes):
        dtypes = read_dtypes(os.path.join(root, relpath)) if relpath.endswith(SAFETENSORS_SUFFIX) else None
        entries.append(ManifestFile(relpath, sizes[relpath], digests[relpath], dtypes))
    return Manifest(files=tuple(entries))
