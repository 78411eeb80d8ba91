"""Model sync to a node's local disk: destination checks, manifests, staging, verification, promotion.

Pure logic for the `model_*` modules of role `model_sync` (Python 3.9+; stdlib only, except the BF16 →
FP16 conversion, which imports numpy when it runs). The field notes' rule this enforces:
the model goes to local SSD, is rsynced whole first, verified, and only then becomes visible under its
promoted path (`/data/models/<name>/<revision>`, with `current` pointing at it).

Layout on the node (all on one filesystem, so every promotion step is a rename):
    <models>/<name>/<revision>/              promoted, read-only, group-readable by the service group
    <models>/<name>/.<revision>.staging/     rsync target; resumable; never served
    <models>/<name>/.<revision>.converting/  BF16 → FP16 output, when conversion is on
    <models>/<name>/current -> <revision>    swapped atomically (symlink + rename)
"""
from __future__ import annotations

import errno
import grp
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ansible.module_utils.revive_files import write_json_atomic

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

# Filesystem types that are served over a network or by a userspace daemon. A destination on one of
# them is refused: field notes "Software stack that worked" (never first-load from a network disk).
NETWORK_FSTYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "9p", "afs", "coda",
    "ncpfs", "beegfs", "gpfs", "pvfs2", "orangefs", "wekafs",
})
NETWORK_REASON = (
    "vLLM's first load reads the weights randomly, which from a network or FUSE filesystem makes cold "
    "start take tens of minutes, and a broken transfer leaves a corrupt cache (field notes: model on "
    "local SSD, never first-loaded from a network disk)"
)


class SyncError(Exception):
    """A refusal or failure whose message says what is wrong, where, and how to fix it."""


# --------------------------------------------------------------------------------------------------
# Byte counts for humans (messages name both the exact number and a readable one)


def format_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            readable = f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
            return f"{readable} ({count} bytes)"
        value /= 1024
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------------------------------
# Destination filesystem classification (/proc/self/mountinfo)


@dataclass(frozen=True)
class Mount:
    mount_id: int
    parent_id: int
    mount_point: str
    fstype: str
    source: str
    options: str


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape_mountinfo(text: str) -> str:
    # The kernel escapes space, tab, newline and backslash in paths as \040, \011, \012 and \134.
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), text)


def parse_mountinfo(text: str) -> List[Mount]:
    """Parse /proc/<pid>/mountinfo (proc(5)); optional fields end at the lone "-" separator."""
    mounts = []
    for line_number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)
            mounts.append(Mount(
                mount_id=int(fields[0]),
                parent_id=int(fields[1]),
                mount_point=_unescape_mountinfo(fields[4]),
                options=fields[5],
                fstype=fields[separator + 1],
                source=_unescape_mountinfo(fields[separator + 2]),
            ))
        except (ValueError, IndexError) as exc:
            raise SyncError(f"cannot parse mountinfo line {line_number} ({line!r}): {exc}") from exc
    return mounts


def fs_kind(fstype: str) -> str:
    """'network', 'fuse' or 'local' for a mountinfo filesystem type."""
    if fstype in NETWORK_FSTYPES:
        return "network"
    if fstype in ("fuse", "fuseblk") or fstype.startswith("fuse."):
        return "fuse"
    return "local"


def resolve_path(path: str) -> str:
    """Absolute path with symlinks resolved as far as the path exists; the rest appended as given.

    A destination usually does not exist yet; what matters is where it will be created. A dead FUSE
    mount (ENOTCONN) counts as not existing, so its mount point still decides.
    """
    path = os.path.abspath(path)
    existing = path
    rest: List[str] = []
    while not os.path.exists(existing) and existing != os.path.dirname(existing):
        existing, tail = os.path.split(existing)
        rest.insert(0, tail)
    return os.path.join(os.path.realpath(existing), *rest)


def mount_for_path(path: str, mounts: Sequence[Mount]) -> Mount:
    """The mount that holds `path` (resolved): the longest mount point prefix, the last one mounted on top."""
    best: Optional[Mount] = None
    for mount in mounts:
        point = mount.mount_point
        if path == point or path.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) >= len(best.mount_point):
                best = mount
    if best is None:
        raise SyncError(f"no mount in mountinfo holds {path}; is /proc mounted?")
    return best


@dataclass(frozen=True)
class DestinationFs:
    path: str
    mount_point: str
    fstype: str
    source: str
    kind: str

    def refusal(self, where: str) -> Optional[str]:
        """The refusal message for a network or FUSE destination, else None."""
        if self.kind == "local":
            return None
        label = "a network filesystem" if self.kind == "network" else "a FUSE filesystem"
        return (
            f"destination {self.path} on {where} is on {label}: {self.fstype} mounted at {self.mount_point} "
            f"from {self.source}. {NETWORK_REASON}. Set model_sync_dest to a directory on a local disk "
            f"(ext4, xfs, btrfs) of {where}; reading the source from a network mount is fine."
        )


def classify_destination(path: str, mountinfo_text: str) -> DestinationFs:
    resolved = resolve_path(path)
    mount = mount_for_path(resolved, parse_mountinfo(mountinfo_text))
    return DestinationFs(path=resolved, mount_point=mount.mount_point, fstype=mount.fstype,
                         source=mount.source, kind=fs_kind(mount.fstype))


def read_mountinfo(path: str = "/proc/self/mountinfo") -> str:
    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
        return handle.read()


# --------------------------------------------------------------------------------------------------
# Free space


@dataclass(frozen=True)
class SpaceCheck:
    path: str
    free_bytes: int
    needed_bytes: int
    transfer_bytes: int
    convert_bytes: int
    margin_bytes: int

    @property
    def ok(self) -> bool:
        return self.free_bytes >= self.needed_bytes

    def refusal(self, where: str) -> Optional[str]:
        if self.ok:
            return None
        parts = [f"{format_bytes(self.transfer_bytes)} still to transfer"]
        if self.convert_bytes:
            parts.append(f"{format_bytes(self.convert_bytes)} for the FP16 copy")
        parts.append(f"a margin of {format_bytes(self.margin_bytes)}")
        return (
            f"not enough free space for the model at {self.path} on {where}: the filesystem has "
            f"{format_bytes(self.free_bytes)} free, the sync needs {format_bytes(self.needed_bytes)} "
            f"({' + '.join(parts)}). Free space there, or set model_sync_dest to a larger local disk "
            f"(model_sync_free_space_margin_bytes sets the margin)."
        )


def free_bytes_at(path: str) -> int:
    """Bytes an unprivileged writer may still use on the filesystem that will hold `path`."""
    existing = resolve_path(path)
    while not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    result = os.statvfs(existing)
    return result.f_bavail * result.f_frsize


def check_free_space(path: str, *, transfer_bytes: int, convert_bytes: int, margin_bytes: int,
                     free_bytes: Optional[int] = None) -> SpaceCheck:
    free = free_bytes_at(path) if free_bytes is None else free_bytes
    return SpaceCheck(path=path, free_bytes=free, needed_bytes=transfer_bytes + convert_bytes + margin_bytes,
                      transfer_bytes=transfer_bytes, convert_bytes=convert_bytes, margin_bytes=margin_bytes)


# --------------------------------------------------------------------------------------------------
# Manifest: every file's relative path, size and sha256, kept beside the model as revive-manifest.json.
# sha256 because it is what the Hugging Face Hub uses as the LFS object id of weight files (so manifest
# entries can be compared with the Hub's), and with SHA-NI it is the fastest stdlib digest (measured:
# sha256 1281 MB/s, blake2b 705 MB/s, md5 561 MB/s on this build host); files are hashed in parallel.


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


# --------------------------------------------------------------------------------------------------
# Verification of a tree against a manifest


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


# --------------------------------------------------------------------------------------------------
# Dtype policy: BF16 on GPUs without BF16 (Volta) is refused or converted


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
            f"compute capability of at least 8.0' (reference/vllm-0.5.4-and-volta.md §1.4). Sync an FP16 "
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


# --------------------------------------------------------------------------------------------------
# The staging → promoted path bookkeeping


def staging_path(dest: str) -> str:
    return os.path.join(os.path.dirname(dest.rstrip("/")), f".{os.path.basename(dest.rstrip('/'))}.staging")


def converting_path(dest: str) -> str:
    return os.path.join(os.path.dirname(dest.rstrip("/")), f".{os.path.basename(dest.rstrip('/'))}.converting")


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


# --------------------------------------------------------------------------------------------------
# rsync into staging (pull from the model-store host, or copy from a path mounted on the node)


@dataclass(frozen=True)
class RsyncSource:
    """Where rsync reads from: `path` on `host` over SSH, or a local path when host is empty."""
    path: str
    host: str = ""
    user: str = "root"
    port: int = 22
    identity_file: str = ""
    known_hosts_file: str = ""

    def spec(self) -> str:
        path = self.path.rstrip("/") + "/"
        if not self.host:
            return path
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user}@{host}:{path}"

    def label(self) -> str:
        return f"{self.host}:{self.path}" if self.host else self.path


def ssh_command(source: RsyncSource) -> List[str]:
    """The ssh argv rsync runs (-e): key-only, the host key pinned in a dedicated known_hosts file."""
    argv = ["ssh", "-p", str(source.port), "-o", "BatchMode=yes", "-o", "ConnectTimeout=20",
            "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"]
    if source.identity_file:
        argv += ["-i", source.identity_file, "-o", "IdentitiesOnly=yes"]
    if source.known_hosts_file:
        argv += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={source.known_hosts_file}"]
    return argv


# rsync's --out-format line for each file it has finished writing (logged after the transfer completes).
_FILE_DONE_PREFIX = "revive-done "


def rsync_argv(source: RsyncSource, staging: str, *, bwlimit_kib: int = 0, io_timeout_s: int = 300,
               dry_run: bool = False) -> List[str]:
    """rsync for a resumable pull into staging.

    --append-verify: a file cut short by an interrupted run keeps its bytes in place (even on SIGKILL, as
    --append writes in place) and only the remainder moves next time, then the whole file is checksummed
    and re-sent if it differs. Staging is never served, so in-place writes are safe there.
    --copy-unsafe-links turns a Hugging Face cache snapshot's symlinks (into ../../blobs) into files; rrsync
    refuses --copy-links below a restricted directory, and links inside the model stay links. Our bookkeeping
    files are excluded (and so protected from --delete).
    """
    argv = ["rsync", "--recursive", "--times", "--links", "--copy-unsafe-links", "--append-verify", "--delete",
            "--no-human-readable", "--stats", f"--out-format={_FILE_DONE_PREFIX}%n",
            f"--timeout={io_timeout_s}", f"--exclude=/{MANIFEST_NAME}", f"--exclude=/{RESERVED_PREFIX}*"]
    argv += [f"--exclude=/{name}" for name in IGNORED_TOP_LEVEL]
    if bwlimit_kib:
        argv.append(f"--bwlimit={bwlimit_kib}")
    if dry_run:
        argv.append("--dry-run")
    if source.host:
        argv += ["-e", " ".join(shlex.quote(part) for part in ssh_command(source))]
    argv += [source.spec(), staging.rstrip("/") + "/"]
    return argv


@dataclass
class RsyncStats:
    files_transferred: int = 0
    files_deleted: int = 0
    literal_bytes: int = 0
    matched_bytes: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0


_STATS_FIELDS = {
    "Number of regular files transferred": "files_transferred",
    "Number of deleted files": "files_deleted",
    "Literal data": "literal_bytes",
    "Matched data": "matched_bytes",
    "Total bytes received": "bytes_received",
    "Total bytes sent": "bytes_sent",
}


def parse_rsync_stats(text: str) -> RsyncStats:
    stats = RsyncStats()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        attribute = _STATS_FIELDS.get(name.strip())
        if attribute:
            number = re.match(r"\s*([\d,]+)", value)
            if number:
                setattr(stats, attribute, int(number.group(1).replace(",", "")))
    return stats


RSYNC_EXIT_MEANING = {
    1: "syntax or usage error", 2: "protocol incompatibility", 3: "errors selecting input/output files",
    5: "error starting client-server protocol", 10: "error in socket I/O", 11: "error in file I/O",
    12: "error in rsync protocol data stream", 20: "interrupted by a signal", 23: "partial transfer due to error",
    24: "partial transfer due to vanished source files", 30: "timeout in data send/receive",
    35: "timeout waiting for daemon connection", 255: "ssh connection failed",
}


@dataclass
class StageResult:
    stats: RsyncStats
    transferred: List[str]
    hashed_during_transfer: int
    argv: List[str]


class _OverlappedHasher:
    """Hashes each staged file as soon as rsync reports it finished, while rsync moves the next one.

    Results go to the staging dir's hash cache, keyed by the file's stat; verify_tree trusts an entry
    only while that stat is unchanged, so a later write (or a corrupted byte) forces a re-hash.
    """

    def __init__(self, root: str, manifest: Manifest, workers: int):
        self.root = root
        self.expected = manifest.by_path()
        self.cache = load_hash_cache(root)
        self.pool = ThreadPoolExecutor(max_workers=max(1, workers))
        self.futures: Dict[str, Future] = {}
        self.deferred: set = set()
        self.lock = threading.Lock()

    def _hash(self, relpath: str) -> Optional[Tuple[StatKey, str]]:
        path = os.path.join(self.root, relpath)
        try:
            before = stat_key(path)
            # Flushing here, while rsync still moves later files, leaves promotion's fsync nothing to wait for.
            digest = sha256_file(path, flush=True)
            return (before, digest) if stat_key(path) == before else None
        except OSError:
            return None

    def submit(self, relpath: str) -> None:
        """Queue a finished file. When pulling, rsync logs a file once it is written; copying locally, the
        sender logs it and the receiver may still be writing, so an incomplete file waits for the next line."""
        self.deferred.discard(relpath)
        entry = self.expected.get(relpath)
        if entry is None:
            return
        path = os.path.join(self.root, relpath)
        try:
            key = stat_key(path)
        except OSError:
            key = None
        if key is None or key[0] != entry.size:
            self.deferred.add(relpath)
            return
        cached = self.cache.get(relpath)
        if cached and cached[0] == key:
            return
        with self.lock:
            self.futures[relpath] = self.pool.submit(self._hash, relpath)

    def retry_deferred(self) -> None:
        for relpath in sorted(self.deferred):
            self.submit(relpath)

    def finish(self) -> int:
        self.retry_deferred()
        self.pool.shutdown(wait=True)
        for relpath, future in self.futures.items():
            result = future.result()
            if result is not None:
                self.cache[relpath] = result
        self.cache = {path: value for path, value in self.cache.items() if path in self.expected}
        save_hash_cache(self.root, self.cache)
        return sum(1 for future in self.futures.values() if future.result() is not None)


def run_rsync(source: RsyncSource, staging: str, manifest: Manifest, *, workers: int, bwlimit_kib: int = 0,
              io_timeout_s: int = 300, where: str = "the node",
              popen: Callable[..., subprocess.Popen] = subprocess.Popen) -> StageResult:
    """Pull the source into staging with rsync, hashing finished files while later ones are still moving."""
    os.makedirs(staging, mode=0o700, exist_ok=True)
    invalidate_verified(staging)
    argv = rsync_argv(source, staging, bwlimit_kib=bwlimit_kib, io_timeout_s=io_timeout_s)
    hasher = _OverlappedHasher(staging, manifest, workers)
    # Files already whole from an interrupted run are never touched again by --append-verify: hash now.
    for relpath, size in scan_tree(staging).items():
        if relpath in hasher.expected and size == hasher.expected[relpath].size:
            hasher.submit(relpath)
    process = popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    stderr_lines: List[str] = []
    reader = threading.Thread(target=lambda: stderr_lines.extend(process.stderr), daemon=True)
    reader.start()
    transferred = []
    other_lines = []
    for line in process.stdout:
        line = line.rstrip("\n")
        if line.startswith(_FILE_DONE_PREFIX):
            relpath = line[len(_FILE_DONE_PREFIX):]
            hasher.retry_deferred()
            if not relpath.endswith("/"):
                transferred.append(relpath)
                hasher.submit(relpath)
        else:
            other_lines.append(line)
    returncode = process.wait()
    reader.join()
    hashed = hasher.finish()
    if returncode != 0:
        meaning = RSYNC_EXIT_MEANING.get(returncode, "see rsync(1) EXIT VALUES")
        detail = " ".join(line.strip() for line in stderr_lines[-6:]).strip()
        raise SyncError(
            f"rsync from {source.label()} into {staging} on {where} failed with exit {returncode} ({meaning}): "
            f"{detail or 'no message'}. What was copied stays in staging and the next run resumes it; check that "
            f"the source path exists and that {where} can reach the source over SSH.")
    return StageResult(stats=parse_rsync_stats("\n".join(other_lines)), transferred=transferred,
                       hashed_during_transfer=hashed, argv=argv)


def remove_files(root: str, relpaths: Iterable[str]) -> List[str]:
    removed = []
    for relpath in relpaths:
        try:
            os.unlink(os.path.join(root, relpath))
            removed.append(relpath)
        except FileNotFoundError:
            pass
    return removed


# --------------------------------------------------------------------------------------------------
# Atomic promotion: staging (or the converted copy) → <revision>, then `current` → <revision>

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


# --------------------------------------------------------------------------------------------------
# The modules' work, one function each: parameters in, a result dict out (changed, diff, facts).


def _diff_lines(title: str, lines: Sequence[str]) -> str:
    return "".join(f"{title}{line}\n" for line in lines)


def manifest_task(source_dir: str, *, refresh: bool, check_mode: bool, workers: int, read_dtypes: DtypeReader,
                  where: str) -> dict:
    """Read the manifest kept beside the model, or make it (and keep it there when the source is writable)."""
    if not os.path.isdir(source_dir):
        raise SyncError(f"source model directory {source_dir} does not exist on {where}: check "
                        f"model_sync_source_path (and model_sync_source_type)")
    manifest_path = os.path.join(source_dir, MANIFEST_NAME)
    if os.path.exists(manifest_path) and not refresh:
        manifest = load_manifest(manifest_path)
        report = verify_tree(source_dir, manifest, workers=workers, quick=True)
        if not report.ok:
            raise SyncError(
                f"the manifest {manifest_path} on {where} no longer matches the files beside it ({report.summary()}): "
                f"the model was changed after the manifest was made. Check the source, then set "
                f"model_sync_manifest_refresh: true to make a new manifest.")
        return {"changed": False, "created": False, "written": False, "manifest_path": manifest_path,
                "manifest": manifest.to_dict(), "warnings": []}
    manifest = build_manifest(source_dir, read_dtypes=read_dtypes, workers=workers)
    result = {"changed": True, "created": True, "written": False, "manifest_path": manifest_path,
              "manifest": manifest.to_dict(), "warnings": [],
              "diff": {"before": "", "after": _diff_lines("", [f"{entry.path} {entry.size} {entry.sha256}"
                                                                for entry in manifest.files]),
                       "before_header": manifest_path, "after_header": manifest_path}}
    if check_mode:
        return result
    try:
        write_json_atomic(manifest_path, manifest.to_dict())
        result["written"] = True
    except OSError as exc:
        result["changed"] = False
        result["warnings"].append(
            f"could not keep the manifest beside the model at {manifest_path} on {where} ({exc.strerror}); it is "
            f"made again on every run until the source directory is writable for a moment")
    return result


def preflight_task(dest: str, manifest: Manifest, *, margin_bytes: int, gpu_bf16: bool, convert_bf16: bool,
                   allowed_dtypes: Sequence[str], full_reverify: bool, workers: int, where: str,
                   mountinfo_text: Optional[str] = None, free_bytes: Optional[int] = None) -> dict:
    """Every refusal that can be made before a byte moves; changes nothing."""
    destination = classify_destination(dest, read_mountinfo() if mountinfo_text is None else mountinfo_text)
    refusal = destination.refusal(where)
    if refusal:
        raise SyncError(refusal)
    decision = decide_dtypes(manifest.dtypes(), gpu_bf16=gpu_bf16, convert_bf16=convert_bf16,
                             allowed_dtypes=allowed_dtypes, where=where)
    if decision.error:
        raise SyncError(decision.error)
    state = promoted_state(dest, manifest, workers=workers, full=full_reverify)
    staging = staging_path(dest)
    if state.up_to_date:
        transfer_bytes, convert_bytes = 0, 0
    else:
        transfer_bytes = pending_transfer(staging, manifest)[0]
        by_path = manifest.by_path()
        convert_bytes = sum(by_path[path].size for path in decision.bf16_files) if decision.convert_bf16 else 0
    space = check_free_space(dest, transfer_bytes=transfer_bytes, convert_bytes=convert_bytes,
                             margin_bytes=margin_bytes, free_bytes=free_bytes)
    refusal = space.refusal(where)
    if refusal:
        raise SyncError(refusal)
    return {
        "changed": False,
        "dest": dest,
        "staging": staging,
        "converting": converting_path(dest),
        "filesystem": {"mount_point": destination.mount_point, "fstype": destination.fstype,
                       "source": destination.source, "kind": destination.kind},
        "space": {"free_bytes": space.free_bytes, "needed_bytes": space.needed_bytes,
                  "transfer_bytes": space.transfer_bytes, "convert_bytes": space.convert_bytes,
                  "margin_bytes": space.margin_bytes},
        "up_to_date": state.up_to_date,
        "promoted_reason": state.reason,
        "content_id": manifest.content_id,
        "model_bytes": manifest.total_bytes,
        "dtypes": list(decision.dtypes),
        "bf16_files": list(decision.bf16_files),
        "convert_bf16": decision.convert_bf16,
    }


@dataclass(frozen=True)
class DtypePolicy:
    gpu_bf16: bool
    convert_bf16: bool
    allowed_dtypes: Tuple[str, ...]


def _check_staged_headers(staging: str, manifest: Manifest, read_dtypes: DtypeReader, policy: DtypePolicy,
                          where: str) -> DtypeDecision:
    """Parse every staged safetensors header (errors name the file) and apply the dtype policy to what is there."""
    dtypes = {entry.path: read_dtypes(os.path.join(staging, entry.path))
              for entry in manifest.files if entry.path.endswith(SAFETENSORS_SUFFIX)}
    decision = decide_dtypes(dtypes, gpu_bf16=policy.gpu_bf16, convert_bf16=policy.convert_bf16,
                             allowed_dtypes=policy.allowed_dtypes, where=where)
    if decision.error:
        raise SyncError(decision.error)
    return decision


def stage_task(source: Optional[RsyncSource], staging: str, manifest: Manifest, *, repair: bool, check_mode: bool,
               workers: int, read_dtypes: DtypeReader, policy: DtypePolicy, where: str, bwlimit_kib: int = 0,
               io_timeout_s: int = 300, popen: Callable[..., subprocess.Popen] = subprocess.Popen) -> dict:
    """Bring staging to exactly the manifest (rsync when `source` is given), verify it, and mark it verified.

    Files found corrupt are removed and, with a source, fetched once more. Without a source (the controller
    pushed the files), the removed files are returned in `refetch` for the caller to push again.
    """
    result: dict = {"changed": False, "staging": staging, "content_id": manifest.content_id, "transferred": [],
                    "bytes_received": 0, "literal_bytes": 0, "remainder_bytes": 0, "repaired": [], "refetch": [],
                    "hashed_during_transfer": 0, "verify": None, "convert_bf16": False}
    already = verified_manifest(staging)
    if already is not None and already.content_id == manifest.content_id:
        decision = _check_staged_headers(staging, manifest, read_dtypes, policy, where)
        result.update(verified=True, convert_bf16=decision.convert_bf16, msg="staging already verified")
        return result
    remainder, pending, extra = pending_transfer(staging, manifest)
    result["remainder_bytes"] = remainder
    if check_mode:
        result.update(changed=True, verified=False, transferred=pending, msg=(
            f"would transfer {format_bytes(remainder)} in {len(pending)} file(s), remove {len(extra)} extra, "
            f"then verify {len(manifest.files)} file(s)"))
        result["diff"] = {"before": _diff_lines("", sorted(set(scan_tree(staging)) if os.path.isdir(staging) else [])),
                          "after": _diff_lines("", [entry.path for entry in manifest.files]),
                          "before_header": staging, "after_header": staging}
        return result
    os.makedirs(os.path.dirname(staging), mode=0o755, exist_ok=True)
    os.makedirs(staging, mode=0o700, exist_ok=True)
    invalidate_verified(staging)
    moved = []
    started = time.monotonic()
    if source is not None:
        moved.append(run_rsync(source, staging, manifest, workers=workers, bwlimit_kib=bwlimit_kib,
                               io_timeout_s=io_timeout_s, where=where, popen=popen))
    transferred_at = time.monotonic()
    report = verify_tree(staging, manifest, workers=workers)
    if not report.ok and repair:
        removed = remove_files(staging, report.corrupt + report.extra)
        result["repaired"] = removed
        if source is None:
            result.update(changed=True, verified=False, refetch=removed, verify=report.to_dict(),
                          msg=f"removed {len(removed)} corrupt file(s) from {staging}; push them again")
            return result
        moved.append(run_rsync(source, staging, manifest, workers=workers, bwlimit_kib=bwlimit_kib,
                               io_timeout_s=io_timeout_s, where=where, popen=popen))
        report = verify_tree(staging, manifest, workers=workers)
        if not report.ok:
            raise SyncError(
                f"the staged copy {staging} on {where} still differs from the manifest after fetching the bad files "
                f"again ({report.summary()}): the source files no longer match their manifest. Check the model at "
                f"the source, then set model_sync_manifest_refresh: true to make a new manifest.")
    if not report.ok:
        raise SyncError(f"the staged copy {staging} on {where} does not match the manifest: {report.summary()}. "
                        f"Run again to fetch the missing or corrupt files.")
    decision = _check_staged_headers(staging, manifest, read_dtypes, policy, where)
    mark_verified(staging, manifest)
    result["seconds"] = {"transfer": round(transferred_at - started, 2),
                         "verify_after_transfer": round(time.monotonic() - transferred_at, 2)}
    for stage in moved:
        result["transferred"] += stage.transferred
        result["bytes_received"] += stage.stats.bytes_received
        result["literal_bytes"] += stage.stats.literal_bytes
        result["hashed_during_transfer"] += stage.hashed_during_transfer
    if moved:
        result["rsync_argv"] = moved[0].argv
    result.update(changed=True, verified=True, verify=report.to_dict(), convert_bf16=decision.convert_bf16,
                  msg=f"staged and verified {len(manifest.files)} file(s), {format_bytes(manifest.total_bytes)}")
    return result


def promote_task(dest: str, source_content_id: str, *, candidates: Sequence[str], group: str, current_link: str,
                 update_current: bool, fsync: bool, check_mode: bool, cleanup: Sequence[str] = ()) -> dict:
    """Rename the verified copy to `dest` and point `current` at it; nothing when dest already holds the source."""
    actions: List[str] = []
    before: List[str] = []
    after: List[str] = []
    installed = promoted_manifest(dest)
    up_to_date = installed is not None and installed.source_content_id == source_content_id and \
        verify_tree(dest, installed, workers=1, quick=True).ok
    chosen = None
    if not up_to_date:
        for candidate in candidates:
            verified = verified_manifest(candidate)
            if verified is not None and verified.source_content_id == source_content_id:
                chosen = candidate
                break
        if chosen is None and not check_mode:
            raise SyncError(f"nothing verified to promote to {dest}: none of {', '.join(candidates)} holds a verified "
                            f"copy of content id {source_content_id[:12]}. Run the transfer and verify phases "
                            f"(tags model_sync_transfer, model_sync_verify) first.")
        before.append(f"{dest}: {installed.content_id if installed else 'absent'}")
        after.append(f"{dest}: verified copy of {source_content_id}")
        actions.append(f"promote {chosen or 'the staged copy'} to {dest}")
    gid = group_id(group)
    if gid is None and chosen is not None and not check_mode:
        raise SyncError(f"group {group} does not exist; model_sync creates it in its transfer phase "
                        f"(model_sync_service_group)")
    target = link_target(dest, current_link)
    link_now = current_link_state(current_link) if update_current else None
    if update_current and link_now != target:
        before.append(f"{current_link} -> {link_now or '(absent)'}")
        after.append(f"{current_link} -> {target}")
        actions.append(f"point {current_link} at {target}")
    pending = set(candidates) if chosen is None and not up_to_date else {chosen}
    leftovers = [path for path in cleanup if os.path.lexists(path) and path not in pending]
    actions += [f"remove {path}" for path in leftovers]
    changed = bool(actions)
    result = {"changed": changed, "dest": dest, "current_link": current_link, "actions": actions,
              "promoted_from": chosen, "up_to_date": up_to_date,
              "diff": {"before": _diff_lines("", before), "after": _diff_lines("", after)}}
    if check_mode or not changed:
        return result
    if chosen is not None:
        promote_tree(chosen, dest, gid, fsync=fsync)
    if update_current and link_now != target:
        swap_symlink(current_link, target)
    for path in leftovers:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    return result


# --------------------------------------------------------------------------------------------------
# Safetensors headers: parsed by revive_model (interface C), never here


def safetensors_dtypes(path: str) -> Tuple[str, ...]:
    """The dtypes of one shard's tensors, from its header (revive_model validates offsets against the size)."""
    from ansible.module_utils.revive_model import read_safetensors_header

    return tuple(sorted({tensor.dtype for tensor in read_safetensors_header(path).tensors}))


# --------------------------------------------------------------------------------------------------
# BF16 → FP16, streamed shard by shard in bounded chunks (numpy, no torch)

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


def convert_task(staging: str, output_dir: str, source_content_id: str, *, overflow_policy: str, check_mode: bool,
                 where: str, chunk_values: int = CONVERT_CHUNK_VALUES) -> dict:
    """BF16 → FP16 from the verified staging copy into output_dir, unless output_dir already holds that result."""
    done = verified_manifest(output_dir)
    if done is not None and done.source_content_id == source_content_id and done.converted_from:
        return {"changed": False, "output_dir": output_dir, "content_id": done.content_id,
                "report": done.converted_from, "msg": "the FP16 copy is already made and verified"}
    staged = verified_manifest(staging)
    if staged is None or staged.content_id != source_content_id:
        if check_mode:
            return {"changed": True, "output_dir": output_dir, "msg": "would convert the staged copy once verified"}
        raise SyncError(f"the staged copy {staging} on {where} is not verified against content id "
                        f"{source_content_id[:12]}; run the transfer phase (tag model_sync_transfer) first")
    bf16 = [entry.path for entry in staged.files if entry.dtypes and "BF16" in entry.dtypes]
    if check_mode:
        return {"changed": True, "output_dir": output_dir, "msg": f"would convert {len(bf16)} BF16 shard(s) to FP16",
                "diff": {"before": _diff_lines("BF16 ", bf16), "after": _diff_lines("F16  ", bf16)}}
    report = convert_model_bf16_to_fp16(staging, output_dir, staged, overflow_policy=overflow_policy, where=where,
                                        chunk_values=chunk_values)
    return {"changed": True, "output_dir": output_dir, "content_id": report["content_id"], "report": report,
            "msg": (f"converted {len(report['shards'])} shard(s), {report['converted_values']} values; "
                    f"{report['overflow_values']} beyond ±65504 ({overflow_policy}), "
                    f"{report['underflow_values']} flushed to zero")}
