"""Log lines in vLLM 0.5.4's format, so the journal of a twin reads (and greps) like a real one.

0.5.4 logs `LEVEL MM-DD HH:MM:SS file.py:line] message` to stdout (vllm/logger.py). The twin names the
0.5.4 source location each message comes from, so patterns written against real logs match.
Tracebacks go to stderr, as Python prints them.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Optional, TextIO

TWIN = "twin"  # lines of the twin itself carry no 0.5.4 source location
_lock = threading.Lock()
_stream: Optional[TextIO] = None


def set_stream(stream: TextIO) -> None:
    global _stream
    _stream = stream


def _emit(level: str, where: str, message: str, prefix: str = "") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime())
    location = "" if where == TWIN else f" {where}]"
    line = f"{prefix}{level} {stamp}{location} {message}\n"
    stream = _stream or sys.stdout
    with _lock:
        stream.write(line)
        stream.flush()


def info(where: str, message: str, prefix: str = "") -> None:
    _emit("INFO", where, message, prefix)


def warning(where: str, message: str, prefix: str = "") -> None:
    _emit("WARNING", where, message, prefix)


def error(where: str, message: str, prefix: str = "") -> None:
    _emit("ERROR", where, message, prefix)


def sim(message: str) -> None:
    """A line of the twin itself (not something 0.5.4 prints): always marked [twin]."""
    _emit("INFO", TWIN, f"[twin] {message}")
