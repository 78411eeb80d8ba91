"""Free space on the destination's filesystem: what the sync still needs (transfer, FP16 copy, margin)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ansible.module_utils.revive_sync.errors import format_bytes
from ansible.module_utils.revive_sync.mounts import resolve_path


@dataclass(frozen=True)
class SpaceCheck:
    path: str
    free_bytes: int
    needed_bytes: int
    transfer_bytes: int
    convert_bytes: int
    margin_bytes: int

    @property
    def ok(self) -> bool:
        return self.free_bytes >= self.needed_bytes

    def refusal(self, where: str) -> Optional[str]:
        if self.ok:
            return None
        parts = [f"{format_bytes(self.transfer_bytes)} still to transfer"]
        if self.convert_bytes:
            parts.append(f"{format_bytes(self.convert_bytes)} for the FP16 copy")
        parts.append(f"a margin of {format_bytes(self.margin_bytes)}")
        return (
            f"not enough free space for the model at {self.path} on {where}: the filesystem has "
            f"{format_bytes(self.free_bytes)} free, the sync needs {format_bytes(self.needed_bytes)} "
            f"({' + '.join(parts)}). Free space there, or set model_sync_dest to a larger local disk "
            f"(model_sync_free_space_margin_bytes sets the margin)."
        )


def free_bytes_at(path: str) -> int:
    """Bytes an unprivileged writer may still use on the filesystem that will hold `path`."""
    existing = resolve_path(path)
    while not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    result = os.statvfs(existing)
    return result.f_bavail * result.f_frsize


def check_free_space(path: str, *, transfer_bytes: int, convert_bytes: int, margin_bytes: int,
                     free_bytes: Optional[int] = None) -> SpaceCheck:
    free = free_bytes_at(path) if free_bytes is None else free_bytes
    return SpaceCheck(path=path, free_bytes=free, needed_bytes=transfer_bytes + convert_bytes + margin_bytes,
                      transfer_bytes=transfer_bytes, convert_bytes=convert_bytes, margin_bytes=margin_bytes)
