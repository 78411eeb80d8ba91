#!/usr/bin/env python3
"""Mount a dead FUSE filesystem (type fuse.sshfs) at PATH inside a running lab host, from the controller.

    dead_fuse_mount.py NSPAWN_PID PATH

What a node shows after its sshfs daemon died: the mount stays in /proc/self/mountinfo with its type and every
access fails with ENOTCONN. Lab hosts may not open /dev/fuse (nspawn's device policy) and the lab's kernel has
no NFS client, so the controller opens /dev/fuse, enters the host's mount namespace and mounts there; closing
the descriptor aborts the connection. model_sync must refuse a destination there before touching it.
"""
from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWNS = 0x00020000


def main(argv) -> int:
    nspawn_pid, target = int(argv[0]), argv[1]
    with open(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children", encoding="ascii") as handle:
        container_init = int(handle.read().split()[0])
    libc = ctypes.CDLL(None, use_errno=True)
    fuse = os.open("/dev/fuse", os.O_RDWR)
    namespace = os.open(f"/proc/{container_init}/ns/mnt", os.O_RDONLY)
    if libc.setns(namespace, CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), f"setns into the mount namespace of pid {container_init}")
    os.makedirs(target, exist_ok=True)
    options = f"fd={fuse},rootmode=40000,user_id=0,group_id=0".encode()
    if libc.mount(b"ops@jump:/srv/models", target.encode(), b"fuse.sshfs", 0, options) != 0:
        raise OSError(ctypes.get_errno(), f"mounting a FUSE filesystem at {target}")
    os.close(fuse)
    print(f"fuse.sshfs mounted at {target} in pid {container_init}'s mount namespace (connection aborted)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
