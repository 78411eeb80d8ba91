"""revive wheels: check a package source against a hash lock, or fetch the lock's wheels into a cache.

    revive wheels check --lock FILE [--index-url URL [--trusted-host HOST] | --wheelhouse DIR]
                        [--python 3.10] [--platform manylinux_2_35_x86_64] [--json]
    revive wheels fetch --lock FILE --dest DIR [same source and target options] [--dry-run]

check proves that the source offers, for every lock entry, a wheel with a locked sha256 that installs on
the target; it reads only. fetch downloads that wheel of every entry into DIR (the fleet cache), each
once: files already there with a locked hash are kept, an interrupted download resumes where it stopped
(run it again), every file is verified against the lock. --index-url, --python and --platform default to
the lock header's `# index:`, `# python:` and `# platform:` (else https://pypi.org/simple, 3.10 and
manylinux_2_35_x86_64).
Exit status: 0 ok, 1 the source lacks files or a download failed (every problem on stderr), 2 bad
arguments or an unusable lock, source or target, 130 interrupted (fetch resumes on the next run).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from typing import List, Optional

from ansible.module_utils.revive_venv import PUBLIC_INDEX
from ansible.module_utils.revive_wheelcache import DownloadError, SourceProblems, fill_cache
from ansible.module_utils.revive_wheelsource import (LOCK_SOURCE_BOUNDS, WheelSourceError, check_source, http_for,
                                                     load_lock, prepare)

from revive_cli import bounded_option

DEFAULT_PYTHON = "3.10"
DEFAULT_PLATFORM = "manylinux_2_35_x86_64"
GIB, MIB = 2 ** 30, 2 ** 20


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="revive wheels", description=__doc__.split("\n\n")[0])
    commands = top.add_subparsers(dest="command", required=True)
    for name in ("check", "fetch"):
        command = commands.add_parser(name)
        command.add_argument("--lock", required=True, help="the hash lock (data/locks/vllm-...txt)")
        where = command.add_mutually_exclusive_group()
        where.add_argument("--index-url", help="simple index or mirror (default: the lock header's index)")
        where.add_argument("--wheelhouse", help="a directory of wheels instead of an index")
        command.add_argument("--trusted-host", help="allow plain http (and skip certificate checks) for this host")
        command.add_argument("--python", help="CPython minor of the nodes' venv (default: the lock's header)")
        command.add_argument("--platform", help="the nodes' manylinux platform (default: the lock's header)")
        command.add_argument("--timeout", type=bounded_option(LOCK_SOURCE_BOUNDS["timeout"], "timeout", "--timeout"),
                             default=60.0, help="seconds per request (default 60)")
        command.add_argument("--retries", type=bounded_option(LOCK_SOURCE_BOUNDS["retries"], "retries", "--retries"),
                             default=3, help="further attempts per request (default 3)")
        command.add_argument("--jobs", type=bounded_option(LOCK_SOURCE_BOUNDS["jobs"], "jobs", "--jobs"), default=8,
                             help="index pages fetched at once (default 8)")
        if name == "check":
            command.add_argument("--json", action="store_true", help="print the report as JSON")
        else:
            command.add_argument("--dest", required=True, help="the cache directory")
            command.add_argument("--dry-run", action="store_true", help="say what would be downloaded, fetch nothing")
    return top


def _size(count: int) -> str:
    return f"{count / GIB:.2f} GiB" if count >= GIB else f"{count / MIB:.1f} MiB"


class ProgressLine:
    """The live one-line display on a terminal (redrawn at most 5 times a second); elsewhere one line per file."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.live = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.started = time.monotonic()
        self.first_bytes: Optional[int] = None
        self.last_draw = 0.0
        self.last_files = -1

    def __call__(self, files_done: int, files_total: int, bytes_done: int, bytes_total: int,
                 current: Optional[str]) -> None:
        now = time.monotonic()
        if self.first_bytes is None:
            self.first_bytes, self.started = bytes_done, now
        if self.live:
            if current is not None and now - self.last_draw < 0.2:
                return
            self.last_draw = now
            rate = (bytes_done - self.first_bytes) / max(now - self.started, 1e-6)
            percent = f"{100 * bytes_done / bytes_total:3.0f}%" if bytes_total else "  ?%"
            line = (f"[{files_done:>{len(str(files_total))}}/{files_total}] {_size(bytes_done)} / "
                    f"{_size(bytes_total)} {percent} {rate / MIB:6.1f} MiB/s  {current or ''}")
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r" + line[:width].ljust(width))
            self.stream.flush()
        elif current is None and files_done != self.last_files:
            self.last_files = files_done
            self.stream.write(f"[{files_done}/{files_total}] {_size(bytes_done)} of {_size(bytes_total)}\n")
            self.stream.flush()

    def end(self) -> None:
        if self.live:
            self.stream.write("\n")
            self.stream.flush()


def _source_params(args: argparse.Namespace, header_index: Optional[str]) -> dict:
    if args.wheelhouse:
        return {"type": "wheelhouse", "wheelhouse": args.wheelhouse}
    index_url = args.index_url or header_index or PUBLIC_INDEX
    return {"type": "index" if index_url.rstrip("/") == PUBLIC_INDEX else "mirror", "index_url": index_url,
            "trusted_host": args.trusted_host}


def _header_index(value: Optional[str]) -> Optional[str]:
    """The lock header's `# index:` when it is one URL (the index the lock was made from)."""
    return value if value and re.match(r"^https?://\S+$", value) else None


def _print_problems(report) -> None:
    print(f"revive wheels: {report.source} cannot serve {report.lock} for {report.target}: "
          f"{len(report.problems)} problem(s) in {report.checked} entries", file=sys.stderr)
    for problem in report.problems:
        print(f"  {problem.requirement}: {problem.message}", file=sys.stderr)


def main(argv: List[str]) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        header = load_lock(args.lock)
        python = args.python or header.value("python") or DEFAULT_PYTHON
        platform = args.platform or header.value("platform") or DEFAULT_PLATFORM
        lock, source, target = prepare(args.lock, _source_params(args, _header_index(header.value("index"))),
                                       python, platform)
        http = http_for(source, args.timeout, args.retries)
    except WheelSourceError as error:
        print(f"revive wheels: {error}", file=sys.stderr)
        return 2
    if args.command == "check":
        try:
            report = check_source(lock, source, target, http, args.jobs)
        except WheelSourceError as error:
            print(f"revive wheels: {error}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(report.as_dict(), indent=1))
        if not report.ok:
            _print_problems(report)
            return 1
        if not args.json:
            known = sum(selected.size or 0 for selected in report.selected)
            print(f"ok: {report.source} offers all {report.checked} locked wheels of {report.lock} for "
                  f"{report.target} ({_size(known)} where sizes are known)")
        return 0
    display = ProgressLine()
    try:
        result = fill_cache(lock, source, target, args.dest, None if args.dry_run else display, args.dry_run, http,
                            args.jobs)
    except SourceProblems as error:
        _print_problems(error.report)
        return 1
    except DownloadError as error:
        display.end()
        print(f"revive wheels: {error}", file=sys.stderr)
        return 1
    except WheelSourceError as error:
        print(f"revive wheels: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        display.end()
        print("revive wheels: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    display.end()
    if args.dry_run:
        unknown = f" (+{len(result.unknown_sizes)} of unknown size)" if result.unknown_sizes else ""
        print(f"would download {len(result.downloaded)} of {result.files_total} wheels, "
              f"{_size(result.bytes_to_download)}{unknown}, into {result.dest}; {len(result.kept)} already there")
    else:
        print(f"{result.dest}: downloaded {len(result.downloaded)} wheels ({_size(result.bytes_downloaded)}), kept "
              f"{len(result.kept)}, {result.files_total} in all")
    return 0
