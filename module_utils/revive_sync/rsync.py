"""rsync into staging: pull from the model-store host, or copy from a path mounted on the node."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.manifest import (
    IGNORED_TOP_LEVEL,
    MANIFEST_NAME,
    RESERVED_PREFIX,
    Manifest,
    scan_tree,
    sha256_file,
)
from ansible.module_utils.revive_sync.verify import (
    StatKey,
    invalidate_verified,
    load_hash_cache,
    save_hash_cache,
    stat_key,
)


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
