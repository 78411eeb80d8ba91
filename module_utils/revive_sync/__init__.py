"""Model sync to a node's local disk: destination checks, manifests, staging, verification, promotion.

Pure logic for the `model_*` modules of role `model_sync` (Python 3.9+; stdlib only, except the BF16 →
FP16 conversion, which imports numpy when it runs). The rule this enforces (docs/field-report.md
('Software stack that worked')): the model goes to local SSD, is rsynced whole first, verified, and only
then becomes visible under its promoted path (`/data/models/<name>/<revision>`, with `current` pointing at it).

Layout on the node (all on one filesystem, so every promotion step is a rename):
    <models>/<name>/<revision>/              promoted, read-only, group-readable by the service group
    <models>/<name>/.<revision>.staging/     rsync target; resumable; never served
    <models>/<name>/.<revision>.converting/  BF16 → FP16 output, when conversion is on
    <models>/<name>/current -> <revision>    swapped atomically (symlink + rename)

One idea per file; the modules and tests import from the file that holds a name:
    errors.py    SyncError, and the byte counts its messages name
    mounts.py    the destination's filesystem, from /proc/self/mountinfo (network and FUSE refused)
    space.py     free space on the destination
    manifest.py  the manifest (path, size, sha256, shard dtypes) and the names kept in a model directory
    verify.py    a tree against a manifest, the hash cache, the verified marker
    dtype.py     shard dtypes and the BF16 policy
    rsync.py     the resumable pull into staging, hashing files as rsync finishes them
    promote.py   staging/converting paths, what is promoted, the atomic promotion
    convert.py   BF16 → FP16, streamed shard by shard
    tasks.py     the modules' work, one function per module
"""
