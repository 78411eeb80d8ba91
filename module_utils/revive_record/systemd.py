"""What a replica's unit says to systemd: ExecStart=/Environment= words, the start deadline, StartLimitIntervalSec=.

Quoting (`exec_start`, `environment_assignment`) follows systemd.service(5) "Command lines" and systemd.exec(5)
"Environment=": words are double-quoted when they need it, ``\\`` and ``"`` escaped, and ``%`` doubled because unit
files expand specifiers; ``$`` is doubled in ExecStart= because systemd expands ``$VAR`` there (it does not in
Environment=).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, List, Sequence

from ansible.module_utils.revive_record import ReleaseError


# --- quoting ---------------------------------------------------------------------------------------------

# Words of only these characters need no quotes (no space, quote, backslash, `%` specifier or `$` variable).
_SAFE_WORD = re.compile(r"[A-Za-z0-9_@+=:,./-]+")


def _escape(text: str, dollar: bool) -> str:
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if dollar:
        text = text.replace("$", "$$")
    for char, escaped in (("\n", "\\n"), ("\t", "\\t")):
        text = text.replace(char, escaped)
    return text


def exec_word(word: str) -> str:
    """One argument of ExecStart=, quoted only when systemd would otherwise split or expand it."""
    if word and _SAFE_WORD.fullmatch(word):
        return word
    return f'"{_escape(word, dollar=True)}"'


def exec_start(argv: Sequence[str]) -> str:
    if not argv or not str(argv[0]).startswith("/"):
        raise ReleaseError(f"ExecStart needs an absolute program path, got {list(argv)[:1]}")
    return " ".join(exec_word(str(word)) for word in argv)


def environment_assignment(name: str, value: Any) -> str:
    """One Environment= word: `"NAME=value"`, quoted and escaped."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
        raise ReleaseError(f"environment variable name {name!r} is not valid for systemd")
    return f'"{_escape(f"{name}={value}", dollar=False)}"'


def parse_exec_words(line: str) -> List[str]:
    """The argv systemd makes of an ExecStart= value rendered by `exec_start` (the inverse, for tests)."""
    words: List[str] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] == " ":
            i += 1
        if i >= n:
            break
        word = []
        quoted = line[i] == '"'
        if quoted:
            i += 1
        while i < n and (line[i] != '"' if quoted else line[i] != " "):
            char = line[i]
            if char == "\\" and i + 1 < n:
                word.append({"n": "\n", "t": "\t"}.get(line[i + 1], line[i + 1]))
                i += 2
                continue
            if char in "%$" and i + 1 < n and line[i + 1] == char:
                word.append(char)
                i += 2
                continue
            word.append(char)
            i += 1
        i += 1 if quoted else 0
        words.append("".join(word))
    return words


# --- start deadline -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StartTiming:
    base_seconds: int = 120
    load_bytes_per_second: int = 200_000_000
    per_rank_seconds: int = 5
    slack_seconds: int = 30
    restart_seconds: int = 10
    start_limit_burst: int = 3
    ray_gate_seconds: int = 0      # a serving group head's wait for its Ray cluster (ExecStartPre)


def health_deadline(weight_bytes: int, tensor_parallel_size: int, timing: StartTiming) -> int:
    """Seconds from the process start until /health must answer 200.

    Process start-up, profiling and the port opening take a fixed part; loading the weights from local
    SSD takes time proportional to their bytes (41 GB cold-started in 1-2 minutes, docs/field-report.md
    ('Software stack that worked')); NCCL set-up adds a little per rank.
    """
    if timing.load_bytes_per_second <= 0:
        raise ReleaseError("the start load rate (bytes per second) must be positive")
    load = math.ceil(max(int(weight_bytes or 0), 0) / timing.load_bytes_per_second)
    return int(timing.base_seconds + load + timing.per_rank_seconds * max(int(tensor_parallel_size or 1), 1))


def start_limit_interval(start_timeout: int, restart_seconds: int, burst: int) -> int:
    """StartLimitIntervalSec= long enough that `burst` failed starts (each up to TimeoutStartSec, then
    RestartSec) fall inside it: a shorter window never reaches the limit and the unit loops forever."""
    return int(burst * (start_timeout + restart_seconds) + start_timeout)

