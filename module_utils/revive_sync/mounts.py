"""The destination's filesystem, classified from /proc/self/mountinfo: network and FUSE destinations are refused."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ansible.module_utils.revive_sync.errors import SyncError

# Filesystem types that are served over a network or by a userspace daemon. A destination on one of
# them is refused: docs/field-report.md ('Software stack that worked'), never first-load from a network disk.
NETWORK_FSTYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "9p", "afs", "coda",
    "ncpfs", "beegfs", "gpfs", "pvfs2", "orangefs", "wekafs",
})
NETWORK_REASON = (
    "vLLM's first load reads the weights randomly, which from a network or FUSE filesystem makes cold "
    "start take tens of minutes, and a broken transfer leaves a corrupt cache (docs/field-report.md ('Software "
    "stack that worked'): model on local SSD, never first-loaded from a network disk)"
)


@dataclass(frozen=True)
class Mount:
    mount_id: int
    parent_id: int
    mount_point: str
    fstype: str
    source: str
    options: str


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape_mountinfo(text: str) -> str:
    # The kernel escapes space, tab, newline and backslash in paths as \040, \011, \012 and \134.
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), text)


def parse_mountinfo(text: str) -> List[Mount]:
    """Parse /proc/<pid>/mountinfo (proc(5)); optional fields end at the lone "-" separator."""
    mounts = []
    for line_number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split(" ")
        try:
            separator = fields.index("-", 6)
            mounts.append(Mount(
                mount_id=int(fields[0]),
                parent_id=int(fields[1]),
                mount_point=_unescape_mountinfo(fields[4]),
                options=fields[5],
                fstype=fields[separator + 1],
                source=_unescape_mountinfo(fields[separator + 2]),
            ))
        except (ValueError, IndexError) as exc:
            raise SyncError(f"cannot parse mountinfo line {line_number} ({line!r}): {exc}") from exc
    return mounts


def fs_kind(fstype: str) -> str:
    """'network', 'fuse' or 'local' for a mountinfo filesystem type."""
    if fstype in NETWORK_FSTYPES:
        return "network"
    if fstype in ("fuse", "fuseblk") or fstype.startswith("fuse."):
        return "fuse"
    return "local"


def resolve_path(path: str) -> str:
    """Absolute path with symlinks resolved as far as the path exists; the rest appended as given.

    A destination usually does not exist yet; what matters is where it will be created. A dead FUSE
    mount (ENOTCONN) counts as not existing, so its mount point still decides.
    """
    path = os.path.abspath(path)
    existing = path
    rest: List[str] = []
    while not os.path.exists(existing) and existing != os.path.dirname(existing):
        existing, tail = os.path.split(existing)
        rest.insert(0, tail)
    return os.path.join(os.path.realpath(existing), *rest)


def mount_for_path(path: str, mounts: Sequence[Mount]) -> Mount:
    """The mount that holds `path` (resolved): the longest mount point prefix, the last one mounted on top."""
    best: Optional[Mount] = None
    for mount in mounts:
        point = mount.mount_point
        if path == point or path.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) >= len(best.mount_point):
                best = mount
    if best is None:
        raise SyncError(f"no mount in mountinfo holds {path}; is /proc mounted?")
    return best


@dataclass(frozen=True)
class DestinationFs:
    path: str
    mount_point: str
    fstype: str
    source: str
    kind: str

    def refusal(self, where: str) -> Optional[str]:
        """The refusal message for a network or FUSE destination, else None."""
        if self.kind == "local":
            return None
        label = "a network filesystem" if self.kind == "network" else "a FUSE filesystem"
        return (
            f"destination {self.path} on {where} is on {label}: {self.fstype} mounted at {self.mount_point} "
            f"from {self.source}. {NETWORK_REASON}. Set model_sync_dest to a directory on a local disk "
            f"(ext4, xfs, btrfs) of {where}; reading the source from a network mount is fine."
        )


def classify_destination(path: str, mountinfo_text: str) -> DestinationFs:
    resolved = resolve_path(path)
    mount = mount_for_path(resolved, parse_mountinfo(mountinfo_text))
    return DestinationFs(path=resolved, mount_point=mount.mount_point, fstype=mount.fstype,
                         source=mount.source, kind=fs_kind(mount.fstype))


def read_mountinfo(path: str = "/proc/self/mountinfo") -> str:
    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
        return handle.read()
