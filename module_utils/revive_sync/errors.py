"""What a refusal of model_sync says: SyncError, and the byte counts its messages name."""
from __future__ import annotations


class SyncError(Exception):
    """A refusal or failure whose message says what is wrong, where, and how to fix it."""


# Messages name both the exact number of bytes and a readable one.
def format_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            readable = f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
            return f"{readable} ({count} bytes)"
        value /= 1024
    raise AssertionError("unreachable")
