"""Log lines in the simulated release's format, so the journal of a twin reads (and greps) like a real one.

0.5.4 logs `LEVEL MM-DD HH:MM:SS file.py:line] message` to stdout (vllm/logger.py); 0.8.5.post1 puts the
location in brackets, `LEVEL MM-DD HH:MM:SS [file.py:line] message` (v0.8.5.post1:vllm/logger.py:22-23), and
continues a multi-line message on `\r\n` plus the same prefix (its NewLineFormatter,
v0.8.5.post1:vllm/logging_utils/formatter.py:12-17). The twin names the release's source location each
message comes from, so patterns written against real logs match. Tracebacks go to stderr, as Python
prints them.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Optional, TextIO

TWIN = "twin"  # lines of the twin itself carry no vLLM source location
_lock = threading.Lock()
_stream: Optional[TextIO] = None


def set_stream(stream: TextIO) -> None:
    global _stream
    _stream = stream


def _emit(level: str, where: str, message: str, prefix: str = "") -> None:
    from vllm._twin.release import current
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime())
    brackets = current().behaviour.log_brackets
    location = "" if where == TWIN else (f" [{where}]" if brackets else f" {where}]")
    head = f"{prefix}{level} {stamp}{location} "
    if brackets and "\n" in message:
        message = message.replace("\n", "\r\n" + head)
    line = f"{head}{message}\n"
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
    """A line of the twin itself (not something vLLM prints): always marked [twin]."""
    _emit("INFO", TWIN, f"[twin] {message}")
