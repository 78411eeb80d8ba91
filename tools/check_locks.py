#!/usr/bin/env python3
"""Regenerate every committed lock into a temporary directory and diff it against data/locks/ (`make check-locks`).

    .venv/bin/python tools/check_locks.py [--keep DIR] [LOCK ...]

A release lock (`vllm-<V>-py<X.Y>.txt`) is made again with `bin/revive lock V --python X.Y --out-dir TMP`: its
inputs are its header (release, python, platform, exclude-newer, constraints, supplied) and the index, so this
talks to PyPI and is not part of `make test`. A lock that hashes supplied files (`# supplied:`) needs their
directory and is reported as not regenerated. The other locks (probe-venv, convert-venv, nvitop-exporter,
guidellm-bench) are written by the `# command:` line of their header with the control venv's uv; their body
(everything below the header) is compared. Exit status: 0 every regenerated lock is byte-identical, 1 one differs or failed.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
LOCK_DIR = REPO / "data" / "locks"
RELEASE_LOCK = re.compile(r"^vllm-(?P<version>.+)-py(?P<python>\d+\.\d+)\.txt$")
TIMEOUT_S = 900
DIFF_LINES = 40


def header_and_body(text: str) -> Tuple[List[str], str]:
    lines = text.splitlines(keepends=True)
    n = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    return lines[:n], "".join(lines[n:])


def header_value(header: List[str], key: str) -> Optional[str]:
    values = [line.split(":", 1)[1].strip() for line in header if line.startswith(f"# {key}:")]
    return values[-1] if values else None


def clean_env() -> dict:
    """No UV_* settings (the generator's promise), and the control venv's uv first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def diff(committed: str, regenerated: str, name: str) -> List[str]:
    lines = list(difflib.unified_diff(committed.splitlines(), regenerated.splitlines(), f"data/locks/{name}",
                                      f"regenerated/{name}", n=0, lineterm=""))
    pins = lambda text: {line.split(" ")[0] for line in text.splitlines() if re.match(r"^[A-Za-z0-9].*==", line)}
    gone, new = sorted(pins(committed) - pins(regenerated)), sorted(pins(regenerated) - pins(committed))
    summary = [f"    pins only in the committed lock: {', '.join(gone) or 'none'}",
               f"    pins only in the regenerated lock: {', '.join(new) or 'none'}"]
    shown = [f"    {line}" for line in lines[:DIFF_LINES]]
    if len(lines) > DIFF_LINES:
        shown.append(f"    ... {len(lines) - DIFF_LINES} more diff lines")
    return summary + shown


def check_release_lock(path: Path, out_dir: Path) -> Tuple[str, List[str]]:
    match = RELEASE_LOCK.match(path.name)
    committed = path.read_text(encoding="utf-8")
    header, _ = header_and_body(committed)
    if any(line.startswith("# supplied:") for line in header):
        return "skipped", [f"  hashes supplied files ({header_value(header, 'supplied')}): regenerate it with "
                           f"`{header_value(header, 'command')}` and that directory"]
    argv = [sys.executable, str(REPO / "bin" / "revive"), "lock", match["version"], "--python", match["python"],
            "--out-dir", str(out_dir)]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    seen = [f"  $ bin/revive lock {match['version']} --python {match['python']} --out-dir {out_dir.name}  "
            f"(exit {proc.returncode}, {time.monotonic() - started:.0f} s)"]
    seen += [f"    {line}" for line in (proc.stdout + proc.stderr).strip().splitlines()[-6:]]
    regenerated = out_dir / path.name
    if proc.returncode != 0 or not regenerated.is_file():
        return "failed", seen
    new = regenerated.read_text(encoding="utf-8")
    if new == committed:
        return "same", seen + [f"  byte-identical ({len(committed.splitlines())} lines, "
                               f"exclude-newer {header_value(header, 'exclude-newer')})"]
    return "differs", seen + diff(committed, new, path.name)


def check_command_lock(path: Path, out_dir: Path) -> Tuple[str, List[str]]:
    committed = path.read_text(encoding="utf-8")
    header, body = header_and_body(committed)
    command = header_value(header, "command")
    if not command:
        return "skipped", ["  no `# command:` line"]
    started = time.monotonic()
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=out_dir, env=clean_env(),
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    seen = [f"  $ {command}  (exit {proc.returncode}, {time.monotonic() - started:.0f} s; uv from "
            f"{Path(sys.executable).parent})"]
    if proc.returncode != 0:
        return "failed", seen + [f"    {line}" for line in proc.stderr.strip().splitlines()[-6:]]
    (out_dir / path.name).write_text(proc.stdout, encoding="utf-8")
    if proc.stdout == body:
        return "same", seen + [f"  body byte-identical ({len(body.splitlines())} lines below the header)"]
    return "differs", seen + diff(body, proc.stdout, path.name)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="tools/check_locks.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("locks", nargs="*", help="lock files (default: every data/locks/*.txt)")
    parser.add_argument("--keep", help="write the regenerated locks here instead of a temporary directory")
    args = parser.parse_args(argv)
    paths = [Path(p).resolve() for p in args.locks] or sorted(LOCK_DIR.glob("*.txt"))
    verdicts = {}
    with tempfile.TemporaryDirectory(prefix="check-locks-") as tmp:
        out_dir = Path(args.keep).resolve() if args.keep else Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        print(f"check-locks {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime())}: {len(paths)} locks of "
              f"{os.path.relpath(LOCK_DIR, REPO)}, regenerated into {out_dir}")
        for path in paths:
            check = check_release_lock if RELEASE_LOCK.match(path.name) else check_command_lock
            verdict, lines = check(path, out_dir)
            verdicts[path.name] = verdict
            print(f"{path.name}: {verdict.upper()}")
            for line in lines:
                print(line)
            sys.stdout.flush()
    counts = {v: sum(1 for x in verdicts.values() if x == v) for v in ("same", "differs", "failed", "skipped")}
    print("summary: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    return 1 if counts["differs"] or counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
