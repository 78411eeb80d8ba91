"""Files the modules leave on a host (release record, hand-over report, facts, manifests, venv marker): written so
that a reader sees the old content or the new one, never half of either, and a failed write leaves nothing behind.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def write_atomic(path: str, text: str, mode: int = 0o644, make_parents: bool = False) -> None:
    """Write `text` to a temporary file beside `path`, fsync it, set `mode` and rename it over `path`."""
    directory = os.path.dirname(path) or "."
    if make_parents:
        os.makedirs(directory, mode=0o755, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}-", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def write_json_atomic(path: str, data: Any, mode: int = 0o644, sort_keys: bool = False,
                      make_parents: bool = False) -> None:
    """`data` as JSON (indent 1, a final newline) through write_atomic."""
    write_atomic(path, json.dumps(data, indent=1, sort_keys=sort_keys) + "\n", mode, make_parents)
