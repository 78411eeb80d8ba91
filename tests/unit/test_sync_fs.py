"""model_sync destination checks: network/FUSE filesystems refused by name, free space named in bytes."""
from __future__ import annotations

import os

import pytest
from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.mounts import (
    NETWORK_REASON, classify_destination, fs_kind, mount_for_path, parse_mountinfo, resolve_path,
)
from ansible.module_utils.revive_sync.space import check_free_space

# A V100 node as it is often found: root on NVMe, /data on a local SSD, the model share on NFS, a home dir over
# sshfs, a scratch area on CIFS, and a bind mount of the NFS share under /data (the trap).
MOUNTINFO = """\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
40 22 259:3 / /data rw,relatime shared:20 - xfs /dev/nvme1n1 rw,attr2,inode64
41 22 0:52 / /mnt/models rw,relatime shared:21 - nfs4 10.0.0.5:/export/models rw,vers=4.2,rsize=1048576
42 22 0:53 / /home/ops/remote rw,nosuid,nodev,relatime shared:22 - fuse.sshfs ops@jump:/srv rw,user_id=0
43 22 0:54 / /scratch rw,relatime shared:23 - cifs //filer/scratch rw,vers=3.1.1
44 40 0:52 /export/models/shared /data/shared\\040models rw,relatime shared:21 - nfs4 10.0.0.5:/export/models rw
45 40 0:60 / /data/fast rw,relatime shared:24 - tmpfs tmpfs rw,size=1048576k
46 45 0:61 / /data/fast rw,relatime shared:25 - ceph 10.0.0.9:6789:/ rw,name=admin
"""


def test_mountinfo_fields_and_octal_escapes_are_parsed():
    mounts = parse_mountinfo(MOUNTINFO)
    assert [(m.mount_point, m.fstype) for m in mounts][:5] == [
        ("/", "ext4"), ("/proc", "proc"), ("/data", "xfs"), ("/mnt/models", "nfs4"), ("/home/ops/remote", "fuse.sshfs")]
    assert mounts[6].mount_point == "/data/shared models"
    assert mounts[3].source == "10.0.0.5:/export/models"


@pytest.mark.parametrize("fstype,kind", [
    ("nfs", "network"), ("nfs4", "network"), ("cifs", "network"), ("smb3", "network"), ("ceph", "network"),
    ("glusterfs", "network"), ("lustre", "network"), ("9p", "network"), ("fuse.sshfs", "fuse"),
    ("fuse.s3fs", "fuse"), ("fuse", "fuse"), ("ext4", "local"), ("xfs", "local"), ("btrfs", "local"),
    ("tmpfs", "local"), ("overlay", "local"),
])
def test_fs_kind(fstype, kind):
    assert fs_kind(fstype) == kind


@pytest.mark.parametrize("path,mount_point,fstype,kind", [
    ("/data/models/chat-20b/rev1", "/data", "xfs", "local"),
    ("/mnt/models/chat-20b/rev1", "/mnt/models", "nfs4", "network"),
    ("/home/ops/remote/models", "/home/ops/remote", "fuse.sshfs", "fuse"),
    ("/scratch/m", "/scratch", "cifs", "network"),
    ("/data/shared models/chat", "/data/shared models", "nfs4", "network"),
    # Two mounts on one mount point: the one mounted last (listed later) is what a path resolves to.
    ("/data/fast/m", "/data/fast", "ceph", "network"),
    # A prefix that is not a path component boundary does not count.
    ("/datastore/m", "/", "ext4", "local"),
    ("/opt/models", "/", "ext4", "local"),
])
def test_deepest_mount_decides(path, mount_point, fstype, kind):
    mount = mount_for_path(path, parse_mountinfo(MOUNTINFO))
    assert (mount.mount_point, mount.fstype, fs_kind(mount.fstype)) == (mount_point, fstype, kind)


def test_nfs_destination_is_refused_naming_mount_type_and_reason():
    dest = classify_destination("/mnt/models/chat-20b/rev1", MOUNTINFO)
    message = dest.refusal("node1")
    assert message.startswith(
        "destination /mnt/models/chat-20b/rev1 on node1 is on a network filesystem: nfs4 mounted at /mnt/models "
        "from 10.0.0.5:/export/models.")
    assert NETWORK_REASON in message
    assert "tens of minutes" in message and "corrupt cache" in message
    assert "Set model_sync_dest to a directory on a local disk" in message


def test_fuse_destination_is_refused_as_fuse():
    message = classify_destination("/home/ops/remote/models", MOUNTINFO).refusal("node2")
    assert "is on a FUSE filesystem: fuse.sshfs mounted at /home/ops/remote from ops@jump:/srv" in message


def test_local_destination_is_accepted():
    dest = classify_destination("/data/models/chat-20b/rev1", MOUNTINFO)
    assert dest.kind == "local" and dest.refusal("node1") is None


def test_symlink_into_network_mount_is_followed(tmp_path):
    # /data/models -> the NFS share: the string says local, the resolved path says nfs.
    share = tmp_path / "share"
    share.mkdir()
    link = tmp_path / "models"
    link.symlink_to(share)
    mountinfo = (f"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
                 f"2 1 0:50 / {share} rw - nfs 10.0.0.5:/models rw\n")
    dest = classify_destination(str(link / "chat" / "rev1"), mountinfo)
    assert dest.path == str(share / "chat" / "rev1")
    assert (dest.fstype, dest.kind) == ("nfs", "network")


def test_resolve_path_keeps_the_missing_tail(tmp_path):
    assert resolve_path(str(tmp_path / "a" / "b")) == os.path.join(os.path.realpath(tmp_path), "a", "b")


def test_garbled_mountinfo_names_the_line():
    with pytest.raises(SyncError, match=r"cannot parse mountinfo line 2"):
        parse_mountinfo("1 0 8:1 / / rw - ext4 /dev/sda1 rw\nnonsense\n")


def test_real_mountinfo_of_this_machine_finds_a_local_tmp(tmp_path):
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        dest = classify_destination(str(tmp_path / "m"), handle.read())
    assert dest.kind == "local"
    assert dest.path.startswith(dest.mount_point.rstrip("/") + "/")


def test_too_small_destination_names_both_numbers_and_path():
    check = check_free_space("/data/models/chat/rev1", transfer_bytes=41 * 2**30, convert_bytes=0,
                             margin_bytes=2**30, free_bytes=20 * 2**30)
    assert not check.ok
    assert check.needed_bytes == 42 * 2**30
    assert check.refusal("node1") == (
        "not enough free space for the model at /data/models/chat/rev1 on node1: the filesystem has 20.00 GiB "
        "(21474836480 bytes) free, the sync needs 42.00 GiB (45097156608 bytes) (41.00 GiB (44023414784 bytes) "
        "still to transfer + a margin of 1.00 GiB (1073741824 bytes)). Free space there, or set model_sync_dest "
        "to a larger local disk (model_sync_free_space_margin_bytes sets the margin).")


def test_conversion_needs_room_for_the_fp16_copy():
    check = check_free_space("/d", transfer_bytes=100, convert_bytes=100, margin_bytes=10, free_bytes=150)
    assert check.needed_bytes == 210
    assert "100 B (100 bytes) for the FP16 copy" in check.refusal("n")


def test_enough_space_is_accepted():
    check = check_free_space("/d", transfer_bytes=100, convert_bytes=0, margin_bytes=10, free_bytes=110)
    assert check.ok and check.refusal("n") is None


def test_free_space_is_measured_on_the_nearest_existing_directory(tmp_path):
    check = check_free_space(str(tmp_path / "not" / "yet"), transfer_bytes=0, convert_bytes=0, margin_bytes=0)
    stats = os.statvfs(tmp_path)
    assert abs(check.free_bytes - stats.f_bavail * stats.f_frsize) < 64 * 2**20
