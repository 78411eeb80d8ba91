"""The fleet's wheel cache: every wheel of a hash lock downloaded once, verified, resumable.

Used by library/wheel_cache.py and `bin/revive wheels fetch`. fill_cache() first runs the source check
(module_utils/revive_wheelsource.py), so nothing is downloaded unless the source serves the whole lock;
then, for each entry, the wheel the target installs goes to `dest/<filename>`:

- a file already there with a locked hash is kept (a second run downloads nothing: changed=false); one
  with another hash is downloaded again and replaced;
- the download goes to `dest/<filename>.part` and resumes with an HTTP Range request where a previous
  attempt or run stopped; a server that ignores Range (200 instead of 206) restarts the file cleanly;
- the sha256 is checked against the lock before the part file is renamed into place; a mismatch deletes the
  part file and fails, naming the URL and both hashes (a resumed file that mismatches is first fetched
  once more from the start, in case the server's file changed between the runs);
- nothing else is written into dest (the module's progress file is the module's own).

A progress callback receives (files done, files total, bytes done, bytes total, current file) as it goes;
bytes count what is in dest, kept files and resumed parts included. Stdlib only, Python >= 3.9.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import time
from dataclasses import dataclass, field, replace
from typing import Callable, List, Optional

from ansible.module_utils.revive_files import write_json_atomic
from ansible.module_utils.revive_lockfile import Lock
from ansible.module_utils.revive_venv import Source
from ansible.module_utils.revive_wheelsource import (
    CHUNK,
    TRANSIENT,
    Http,
    HttpStatus,
    Selected,
    SourceReport,
    WheelSourceError,
    check_source,
    locked_sha256,
    sha256_file,
)
from ansible.module_utils.revive_wheeltags import Target

PART = ".part"
PROGRESS_FILE = ".progress.json"

# (files done, files total, bytes done, bytes total, current file or None)
Progress = Callable[[int, int, int, int, Optional[str]], None]


class SourceProblems(WheelSourceError):
    """The source check failed; nothing was downloaded. `report` holds every problem."""

    def __init__(self, report: SourceReport) -> None:
        super().__init__(report.message())
        self.report = report


class DownloadError(WheelSourceError):
    """A file could not be fetched or did not verify; the message names the URL and the fix."""


class _Interrupted(Exception):
    """The body ended before its announced length (the connection dropped): resume."""


class _Restart(Exception):
    """The server's answer cannot continue the part file (bad Content-Range, 416): start the file over."""


@dataclass
class CacheResult:
    dest: str
    check_mode: bool
    files_total: int = 0
    downloaded: List[str] = field(default_factory=list)
    kept: List[str] = field(default_factory=list)
    replaced: List[str] = field(default_factory=list)
    bytes_downloaded: int = 0
    bytes_to_download: int = 0
    bytes_total: int = 0
    unknown_sizes: List[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.downloaded)

    def as_dict(self) -> dict:
        return {"changed": self.changed, "dest": self.dest, "files_total": self.files_total,
                "files_downloaded": len(self.downloaded), "files_kept": len(self.kept),
                "downloaded": self.downloaded, "kept": self.kept, "replaced": self.replaced,
                "bytes_downloaded": self.bytes_downloaded, "bytes_to_download": self.bytes_to_download,
                "bytes_total": self.bytes_total, "unknown_sizes": self.unknown_sizes}


@dataclass
class _Counter:
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    progress: Optional[Progress]

    def report(self, current: Optional[str]) -> None:
        if self.progress:
            self.progress(self.files_done, self.files_total, self.bytes_done, self.bytes_total, current)


def _hash_prefix(path: str):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest


def _open_body(http: Http, url: str, offset: int):
    """(stream, resumed, remaining length or None) for `url` from byte `offset`; a local path is a wheelhouse file."""
    if not re.match(r"^https?://", url):
        handle = open(url, "rb")
        handle.seek(offset)
        return handle, offset > 0, os.path.getsize(url) - offset
    headers = {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        response = http.open_once(url, headers)
    except HttpStatus as error:
        if error.status == 416 and offset:
            raise _Restart(f"HTTP 416 for bytes {offset}-") from None
        raise
    length = response.headers.get("Content-Length")
    remaining = int(length) if length and length.isdigit() else None
    if response.status == 206:
        match = re.match(r"^bytes (\d+)-\d+/(\d+|\*)$", response.headers.get("Content-Range", "").strip())
        if not offset or not match or int(match.group(1)) != offset:
            response.close()
            raise _Restart(f"Content-Range {response.headers.get('Content-Range')!r} does not continue at {offset}")
        return response, True, remaining
    return response, False, remaining


@dataclass
class _Tally:
    fetched: int = 0


def _transfer(http: Http, selected: Selected, part: str, counter: _Counter, base: int, tally: _Tally) -> tuple:
    """One attempt: append to (or restart) `part`. Returns (sha256 of the whole part, whether it resumed)."""
    offset = os.path.getsize(part) if os.path.exists(part) else 0
    if selected.size is not None and offset > selected.size:
        os.unlink(part)
        offset = 0
    if offset and offset == selected.size:
        return _hash_prefix(part).hexdigest(), True
    stream, resumed, remaining = _open_body(http, selected.url, offset)
    fetched = 0
    with stream:
        digest = _hash_prefix(part) if resumed else hashlib.sha256()
        start = offset if resumed else 0
        with open(part, "ab" if resumed else "wb") as out:
            try:
                for chunk in iter(lambda: stream.read(CHUNK), b""):
                    out.write(chunk)
                    digest.update(chunk)
                    fetched += len(chunk)
                    tally.fetched += len(chunk)
                    counter.bytes_done = base + start + fetched
                    counter.report(selected.filename)
            finally:
                out.flush()
                os.fsync(out.fileno())
    if remaining is not None and fetched < remaining:
        raise _Interrupted(f"the body ended after {fetched} of {remaining} bytes")
    return digest.hexdigest(), resumed


def download(http: Http, selected: Selected, hashes: List[str], dest: str, counter: _Counter) -> int:
    """Fetch one file into dest through its part file, verified; returns the bytes transferred this run."""
    final = os.path.join(dest, selected.filename)
    part = final + PART
    base, tally = counter.bytes_done, _Tally()
    where = f"{dest} on {socket.gethostname()}"
    restarted, attempt, last = False, 0, None
    while True:
        try:
            actual, resumed = _transfer(http, selected, part, counter, base, tally)
        except _Restart as error:
            actual, resumed = (sha256_file(part), True) if os.path.exists(part) else ("", True)
            if actual not in hashes:
                if restarted:
                    raise DownloadError(f"cannot resume {selected.url} into {where}: {error}") from None
                restarted = True
                if os.path.exists(part):
                    os.unlink(part)
                continue
        except (_Interrupted, *TRANSIENT) as error:
            last = f"{getattr(error, 'reason', None) or error}"
            if attempt >= http.retries:
                raise DownloadError(
                    f"cannot download {selected.url} into {where} ({attempt + 1} attempt(s)): {last}; "
                    f"{os.path.basename(part)} is kept: run again to resume where it stopped") from None
            http.pause(attempt)
            attempt += 1
            continue
        except HttpStatus as error:
            if error.status >= 500 and attempt < http.retries:
                http.pause(attempt)
                attempt += 1
                continue
            raise DownloadError(f"cannot download {selected.url} into {where}: {error}; check that the source "
                                "still serves it") from None
        if actual in hashes:
            os.chmod(part, 0o644)
            os.replace(part, final)
            return tally.fetched
        os.unlink(part)
        if resumed and not restarted:
            restarted = True  # the server's file may have changed between the runs: once more from the start
            continue
        raise DownloadError(
            f"{selected.url} does not match the lock: got sha256:{actual}, the lock has "
            f"{', '.join('sha256:' + h for h in hashes)} for {selected.requirement}; the part file was deleted. "
            "The source serves another file under this name: fix the mirror or regenerate the lock")


def fill_cache(lock: Lock, source: Source, target: Target, dest: str, progress: Optional[Progress] = None,
               check_mode: bool = False, http: Optional[Http] = None, jobs: int = 8) -> CacheResult:
    """Download into `dest` the wheel of every lock entry that `target` installs (see the module docs).

    Raises SourceProblems (nothing downloaded) when the source does not serve the whole lock, DownloadError
    when a file cannot be fetched or verified. In check mode only reads: the result says what would be
    downloaded and how many bytes, where the source gives sizes."""
    http = replace(http or Http(), trusted_host=source.trusted_host)
    report = check_source(lock, source, target, http, jobs)
    if not report.ok:
        raise SourceProblems(report)
    result = CacheResult(dest=dest, check_mode=check_mode, files_total=len(report.selected))
    hashes = {selected.requirement: locked_sha256(lock.get(selected.requirement.split("==", 1)[0]))
              for selected in report.selected}
    todo: List[Selected] = []
    counter = _Counter(0, len(report.selected), 0, 0, progress)
    for selected in report.selected:
        path = os.path.join(dest, selected.filename)
        size = selected.size
        if os.path.isfile(path):
            size = os.path.getsize(path)
            if sha256_file(path) in hashes[selected.requirement]:
                result.kept.append(selected.filename)
                counter.files_done += 1
                counter.bytes_done += size
                result.bytes_total += size
                continue
            result.replaced.append(selected.filename)
        todo.append(selected)
        if selected.size is None:
            result.unknown_sizes.append(selected.filename)
        else:
            result.bytes_to_download += selected.size - _part_size(os.path.join(dest, selected.filename + PART),
                                                                    selected.size)
            result.bytes_total += selected.size
    counter.bytes_total = result.bytes_total
    if check_mode:
        result.downloaded = [selected.filename for selected in todo]
        return result
    if not todo:
        return result  # nothing to do: no progress reported, nothing written
    _check_space(dest, result.bytes_to_download)
    counter.report(None)
    for selected in todo:
        done_before = counter.bytes_done
        result.bytes_downloaded += download(http, selected, hashes[selected.requirement], dest, counter)
        size = os.path.getsize(os.path.join(dest, selected.filename))
        if selected.size is None:
            counter.bytes_total += size
            result.bytes_total += size
        counter.bytes_done = done_before + size
        counter.files_done += 1
        result.downloaded.append(selected.filename)
        counter.report(None)
    return result


def _part_size(part: str, size: int) -> int:
    have = os.path.getsize(part) if os.path.isfile(part) else 0
    return have if have <= size else 0


def _check_space(dest: str, needed: int) -> None:
    os.makedirs(dest, mode=0o755, exist_ok=True)
    free = shutil.disk_usage(dest).free
    if needed > free:
        raise DownloadError(f"{dest} on {socket.gethostname()} has {free / 2**30:.1f} GiB free, the lock's wheels need "
                            f"{needed / 2**30:.1f} GiB more: free space there or choose another dest")


# --- the module's progress file ------------------------------------------------------------------------

@dataclass
class ProgressFile:
    """A Progress callback that writes dest/.progress.json atomically, at most every `interval` seconds (and
    whenever a file completes); finish() records the outcome. A run with nothing to download leaves the file
    alone, unless it still tells of an unfinished run."""

    dest: str
    interval: float = 1.0
    _last: float = field(default=0.0, init=False)
    _state: dict = field(default_factory=dict, init=False)

    @property
    def path(self) -> str:
        return os.path.join(self.dest, PROGRESS_FILE)

    def __call__(self, files_done: int, files_total: int, bytes_done: int, bytes_total: int,
                 current: Optional[str]) -> None:
        self._state = {"state": "running", "files_done": files_done, "files_total": files_total,
                       "bytes_done": bytes_done, "bytes_total": bytes_total, "current": current}
        now = time.monotonic()
        if current is None or now - self._last >= self.interval:
            self._last = now
            self._write()

    def recorded_state(self) -> Optional[str]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                return json.load(handle).get("state")
        except (OSError, ValueError, AttributeError):
            return None

    def finish(self, state: str, msg: str = "", result: Optional[CacheResult] = None) -> None:
        """Record `state` (done, failed); `result` gives the totals when this run reported no progress."""
        if not os.path.isdir(self.dest):
            return
        if not self._state:
            if state == "done" and self.recorded_state() in (None, "done"):
                return
            if result is not None:
                self._state = {"files_done": result.files_total, "files_total": result.files_total,
                               "bytes_done": result.bytes_total, "bytes_total": result.bytes_total}
        self._state = dict(self._state, state=state, current=None, msg=msg)
        self._write()

    def _write(self) -> None:
        os.makedirs(self.dest, mode=0o755, exist_ok=True)
        write_json_atomic(self.path, dict(self._state, updated=time.time()))
