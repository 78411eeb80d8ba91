"""What the lab benchmarks share: run a command from the repository with its output in a log, timed, and show the
log's end when it failed. pytest puts bench/ on sys.path (rootdir-relative imports, no package)."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]


def run_logged(argv: List[str], log: Path, env: Optional[Dict[str, str]] = None) -> Tuple[int, float]:
    """(exit code, seconds) of `argv` run in the repository, stdout and stderr into `log`."""
    started = time.monotonic()
    with log.open("wb") as handle:
        rc = subprocess.run(argv, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, env=env).returncode
    return rc, time.monotonic() - started


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
