"""revive lock: generate the hash locks nodes install vLLM from (uv pip compile --generate-hashes).

    revive lock [VERSION] [--python X.Y] [--supply DIR] [--index-url URL] [--out-dir DIR]
    revive lock --wheelhouse DIR --requirement REQ [--requirement REQ ...] --python X.Y [--platform P] --out FILE

The first form locks a release of data/vllm-releases.yml from its `lock:` block into
data/locks/vllm-<version>-py<X.Y>.txt: no VERSION locks every release that has a lock block, no --python
every Python of the block's `pythons`. --supply DIR holds the wheels of the block's `supplied`
distributions (gone from the index): they are hashed into the lock; without it they are listed as
`missing` and the lock is incomplete (the runtime refuses it). The second form (the lab) locks a
requirement set against a local wheelhouse only (--no-index --find-links DIR).
uv comes from next to this Python, else PATH (requirements.txt pins uv==0.13.8).
Exit status: 0 written (or already up to date), 1 the resolution failed, 2 bad arguments or data.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List

from ansible.module_utils.revive_lockgen import (
    DEFAULT_INDEX,
    LockGenError,
    LockResult,
    ResolveError,
    find_uv,
    lock_release,
    lock_wheelhouse,
)
from ansible.module_utils.revive_releases import ReleaseDataError, load_release_file

from revive_cli import REPO

KEY_PACKAGES = ("vllm", "torch", "xformers", "transformers")


class InputError(Exception):
    """An argument or data problem; the message says which and how to fix it."""


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="revive lock", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("version", nargs="?", help="release of data/vllm-releases.yml (default: every locked one)")
    parser.add_argument("--python", help="Python minor version, e.g. 3.10 (default: the lock block's pythons)")
    parser.add_argument("--supply", help="directory holding the wheels of the release's supplied distributions")
    parser.add_argument("--index-url", default=DEFAULT_INDEX, help=f"package index (default {DEFAULT_INDEX})")
    parser.add_argument("--out-dir", default=str(REPO / "data" / "locks"), help="where locks go (default data/locks)")
    parser.add_argument("--wheelhouse", help="lab mode: lock against this directory of wheels only")
    parser.add_argument("--requirement", action="append", default=[], help="lab mode: a requirement (repeatable)")
    parser.add_argument("--platform", help="lab mode: uv --python-platform (default: this machine)")
    parser.add_argument("--out", help="lab mode: the lock file to write")
    return parser.parse_args(argv)


def summary(result: LockResult) -> str:
    lock = result.lock
    picks = ", ".join(str(lock.get(name)) for name in KEY_PACKAGES if lock.get(name) is not None)
    path = os.path.relpath(result.path) if os.path.abspath(result.path).startswith(os.getcwd() + os.sep) \
        else result.path
    line = f"{path}: {len(lock.entries)} packages" + (f" ({picks})" if picks else "") + \
        ("" if result.changed else ", unchanged")
    if lock.supplied:
        line += f"; supplied {', '.join(lock.supplied)}"
    if lock.missing:
        line += (f"; INCOMPLETE, missing {', '.join(lock.missing)} (not on the index: put the wheel in a "
                 f"directory and rerun with --supply DIR)")
    return line


def run_wheelhouse(args: argparse.Namespace) -> List[LockResult]:
    if args.version or args.supply or args.index_url != DEFAULT_INDEX:
        raise InputError("--wheelhouse locks a requirement set, not a release: drop VERSION, --supply and --index-url")
    missing = [flag for flag, value in (("--requirement", args.requirement), ("--python", args.python),
                                        ("--out", args.out)) if not value]
    if missing:
        raise InputError(f"--wheelhouse needs {', '.join(missing)}")
    return [lock_wheelhouse(args.requirement, args.wheelhouse, args.python, args.out, args.platform, uv=find_uv())]


def run_releases(args: argparse.Namespace) -> List[LockResult]:
    if args.requirement or args.out or args.platform:
        raise InputError("--requirement, --out and --platform belong to --wheelhouse mode; a release's "
                         "requirements and platform come from its lock block in data/vllm-releases.yml")
    try:
        data = load_release_file(str(REPO / "data" / "vllm-releases.yml"))
        releases = [data.release(args.version)] if args.version else \
            [data.release(v) for v in data.versions() if data.release(v).get("lock") is not None]
    except ReleaseDataError as exc:
        raise InputError(str(exc)) from exc
    if not releases:
        raise InputError("no release in data/vllm-releases.yml has a lock block")
    uv = find_uv()
    results = []
    for release in releases:
        block = release.get("lock")
        if not isinstance(block, dict):
            raise InputError(f"vLLM {release.version} has no lock block in data/vllm-releases.yml; add one "
                             "(exclude_newer, platform, pythons, constraints, supplied) to lock it")
        pythons = [args.python] if args.python else [str(p) for p in block.get("pythons") or []]
        for python in pythons:
            result = lock_release(release, python, args.out_dir, args.supply, args.index_url, uv=uv)
            print(summary(result), flush=True)
            results.append(result)
    return results


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    try:
        if args.wheelhouse:
            for result in run_wheelhouse(args):
                print(summary(result))
        else:
            run_releases(args)
    except InputError as exc:
        print(f"revive lock: {exc}", file=sys.stderr)
        return 2
    except ResolveError as exc:
        print(f"revive lock: {exc}", file=sys.stderr)
        return 1
    except LockGenError as exc:
        print(f"revive lock: {exc}", file=sys.stderr)
        return 2
    return 0
