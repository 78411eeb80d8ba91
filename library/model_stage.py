#!/usr/bin/python
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_stage
short_description: Fetch a model into its staging directory with resumable rsync and verify it against the manifest
description:
  - Runs on the node. Pulls the model with rsync into C(.<revision>.staging) beside the promoted path (made if
    missing, mode 0700; missing parents 0755), over SSH from
    the model-store host (O(src_host)) or from a path on the node itself (for example an NFS mount), then checks every
    file against the source manifest (missing, extra, wrong size, wrong sha256) and parses every safetensors header.
  - Resumable. rsync runs with C(--append-verify), so a transfer cut short (even by SIGKILL) keeps its bytes and
    the next run moves only the remainder, then checksums the whole file.
  - Each file is hashed as soon as rsync reports it finished, while later files are still moving. The digests are
    cached by the file's stat (size, mtime, ctime, inode), so a file written again afterwards is hashed again.
  - With O(repair), corrupt or extra files are removed and fetched once more. If they are still wrong, the source
    no longer matches its manifest and the module fails.
  - Without O(src_path) (the controller pushed the files), it only verifies. Corrupt files are removed and
    returned in RV(refetch) for the caller to push again.
  - A verified staging directory gets its manifest and a marker. Later runs and M(model_promote) trust the marker
    only while no file's stat has changed.
version_added: "1.0.0"
author: revive
options:
  dest:
    description: The promoted path of this revision; staging is C(.<basename>.staging) in the same directory.
    type: path
    required: true
  manifest:
    description: The source manifest, as returned by M(model_manifest) in RV(manifest).
    type: dict
    required: true
  src_path:
    description:
      - The model directory to pull. With O(src_host), a path relative to the directory the model-store key is
        restricted to (rrsync); without it, a local path on the node.
      - Leave empty to verify files pushed by other means.
    type: str
    default: ""
  src_host:
    description: Address of the model-store host; empty for a local O(src_path).
    type: str
    default: ""
  src_user:
    description: SSH user on the model-store host.
    type: str
    default: root
  src_port:
    description: SSH port on the model-store host.
    type: int
    default: 22
  identity_file:
    description: Private key rsync's ssh uses (the node's model-sync key).
    type: path
    default: ""
  known_hosts_file:
    description: known_hosts file that pins the model-store host's key (StrictHostKeyChecking=yes).
    type: path
    default: ""
  repair:
    description: Remove files that fail verification and fetch them again once.
    type: bool
    default: true
  bwlimit_kib:
    description: rsync C(--bwlimit) in KiB/s, so a fleet sync does not saturate the model-store's link; V(0) is unlimited.
    type: int
    default: 0
  io_timeout:
    description: rsync C(--timeout) in seconds; a stalled transfer fails (and resumes on the next run).
    type: int
    default: 300
  workers:
    description: Files hashed in parallel; V(0) means one per CPU, at most 8.
    type: int
    default: 0
  gpu_bf16:
    description: Whether every GPU of the node supports BF16.
    type: bool
    default: false
  convert_bf16:
    description: Whether BF16 weights will be converted to FP16 (otherwise they are refused on GPUs without BF16).
    type: bool
    default: false
  allowed_dtypes:
    description: Tensor dtypes the plan can load; empty allows any.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    details: Compares staging with the manifest by name and size, and reports what rsync would move; nothing is written.
  diff_mode:
    support: full
seealso:
  - module: model_manifest
  - module: model_promote
"""

EXAMPLES = r"""
- name: Pull the model from the model-store host into staging and verify it
  model_stage:
    dest: /data/models/chat-20b-fp16/2024-06-01
    manifest: "{{ source_manifest.manifest }}"
    src_host: 10.77.0.10
    src_path: chat-20b-fp16/2024-06-01
    identity_file: /root/.ssh/revive_model_sync
    known_hosts_file: /etc/revive/model_sync_known_hosts

- name: Copy from an NFS mount on the node (reading from the network is fine, the destination is local)
  model_stage:
    dest: /data/models/chat-20b-fp16/2024-06-01
    manifest: "{{ source_manifest.manifest }}"
    src_path: /mnt/nfs/models/chat-20b-fp16/2024-06-01
"""

RETURN = r"""
staging:
  description: The staging directory.
  returned: always
  type: str
  sample: /data/models/chat-20b-fp16/.2024-06-01.staging
verified:
  description: Staging matches the manifest and its headers parse; it is marked verified.
  returned: success
  type: bool
transferred:
  description: Files rsync wrote in this run (in check mode, the files it would write).
  returned: always
  type: list
  elements: str
remainder_bytes:
  description: Bytes missing from staging before this run, judged by name and size (the remainder of a cut transfer).
  returned: always
  type: int
bytes_received:
  description: Bytes rsync received over the wire in this run, protocol included (rsync --stats).
  returned: always
  type: int
literal_bytes:
  description: File data rsync sent as literal data in this run.
  returned: always
  type: int
hashed_during_transfer:
  description: Files hashed while rsync was still moving others.
  returned: always
  type: int
repaired:
  description: Files removed because they failed verification.
  returned: always
  type: list
  elements: str
refetch:
  description: Files removed that the caller must push again (only without O(src_path)).
  returned: always
  type: list
  elements: str
verify:
  description: The verification report.
  returned: when verified in this run
  type: dict
  sample: {ok: true, missing: [], extra: [], size_mismatch: [], checksum_mismatch: [], hashed_files: 1, cached_files: 8}
convert_bf16:
  description: Whether the staged model has BF16 weights that are to be converted.
  returned: always
  type: bool
seconds:
  description: Wall time of the transfer (rsync, files hashed as they arrive) and of what followed it (hashing the
    rest, headers, repairs).
  returned: when verified in this run
  type: dict
  sample: {transfer: 212.4, verify_after_transfer: 3.1}
rsync_argv:
  description: The rsync command line used.
  returned: when rsync ran
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_model import ModelInspectError
from ansible.module_utils.revive_sync.dtype import DtypePolicy, safetensors_dtypes
from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.manifest import WORKERS, default_workers, manifest_from_dict
from ansible.module_utils.revive_sync.promote import staging_path
from ansible.module_utils.revive_sync.rsync import RsyncSource
from ansible.module_utils.revive_sync.tasks import stage_task


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "src_port": Bound(int, 1, high=65535, why="a TCP port"),
    "bwlimit_kib": Bound(int, 0, unset=0, unset_means="unlimited", why="KiB/s"),
    # rsync's 0 (no timeout) is refused: a stalled transfer must fail.
    "io_timeout": Bound(int, 1, high=86400, why="seconds"),
    "workers": WORKERS,
}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            manifest=dict(type="dict", required=True),
            src_path=dict(type="str", default=""),
            src_host=dict(type="str", default=""),
            src_user=dict(type="str", default="root"),
            src_port=dict(type="int", default=22),
            identity_file=dict(type="path", default=""),
            known_hosts_file=dict(type="path", default=""),
            repair=dict(type="bool", default=True),
            bwlimit_kib=dict(type="int", default=0),
            io_timeout=dict(type="int", default=300),
            workers=dict(type="int", default=0),
            gpu_bf16=dict(type="bool", default=False),
            convert_bf16=dict(type="bool", default=False),
            allowed_dtypes=dict(type="list", elements="str", default=[]),
        ),
        required_by={"src_host": ("src_path",)},
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "model_stage")
    params = module.params
    source = None
    if params["src_path"]:
        source = RsyncSource(path=params["src_path"], host=params["src_host"], user=params["src_user"],
                             port=params["src_port"], identity_file=params["identity_file"],
                             known_hosts_file=params["known_hosts_file"])
    try:
        result = stage_task(
            source, staging_path(params["dest"]), manifest_from_dict(params["manifest"], "parameter manifest"),
            repair=params["repair"], check_mode=module.check_mode, workers=params["workers"] or default_workers(),
            read_dtypes=safetensors_dtypes,
            policy=DtypePolicy(params["gpu_bf16"], params["convert_bf16"], tuple(params["allowed_dtypes"])),
            where=os.uname().nodename, bwlimit_kib=params["bwlimit_kib"], io_timeout_s=params["io_timeout"])
    except (SyncError, ModelInspectError) as exc:
        module.fail_json(msg=str(exc))
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
