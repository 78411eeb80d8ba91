#!/usr/bin/python
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_preflight
short_description: Refuse a model sync before any byte moves (destination filesystem, free space, dtypes)
description:
  - Runs on the node and changes nothing.
  - Refuses a destination on a network filesystem (nfs, nfs4, cifs, smb3, ceph, glusterfs, lustre, 9p, ...) or a
    FUSE filesystem (fuse, fuse.*), naming the mount, its type and why (a tens-of-minutes cold start and a
    corrupt cache after a broken transfer, docs/field-report.md ('Software stack that worked')). The type comes
    from C(/proc/self/mountinfo) for the deepest mount holding the destination, with symlinks resolved.
  - Refuses when the free space there is less than what is still to transfer, plus the FP16 copy when converting,
    plus a margin, naming both numbers and the path.
  - Refuses BF16 weights on GPUs without BF16 unless conversion is enabled, and dtypes outside O(allowed_dtypes),
    using the dtypes recorded in the source manifest.
  - Reports whether the promoted revision already holds the source's bytes, in which case nothing needs to move.
version_added: "1.0.0"
author: revive
options:
  dest:
    description: The promoted path of this revision, e.g. C(/data/models/<name>/<revision>).
    type: path
    required: true
  manifest:
    description: The source manifest, as returned by M(model_manifest) in RV(manifest).
    type: dict
    required: true
  free_space_margin_bytes:
    description: Free space to keep on top of what the sync needs.
    type: int
    default: 1073741824
  gpu_bf16:
    description: Whether every GPU of the node supports BF16 (compute capability 8.0 or higher).
    type: bool
    default: false
  convert_bf16:
    description: Whether BF16 weights are converted to FP16 on the node instead of being refused.
    type: bool
    default: false
  allowed_dtypes:
    description: Tensor dtypes the plan can load (safetensors names such as C(F16)); empty allows any.
    type: list
    elements: str
    default: []
  full_reverify:
    description: Hash the promoted copy again instead of comparing names and sizes with its manifest.
    type: bool
    default: false
  workers:
    description: Files hashed in parallel when O(full_reverify) is set; V(0) means one per CPU, at most 8.
    type: int
    default: 0
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
seealso:
  - module: model_manifest
  - module: model_stage
"""

EXAMPLES = r"""
- name: Refuse a bad destination before transferring
  model_preflight:
    dest: /data/models/chat-20b-fp16/2024-06-01
    manifest: "{{ source_manifest.manifest }}"
    gpu_bf16: false
    convert_bf16: false
  register: model_preflight
"""

RETURN = r"""
up_to_date:
  description: The promoted path already holds the source's bytes (directly or as their FP16 conversion).
  returned: success
  type: bool
promoted_reason:
  description: Why the promoted path is or is not up to date.
  returned: success
  type: str
  sample: /data/models/chat-20b-fp16/2024-06-01 does not exist yet
staging:
  description: Where the transfer writes before promotion.
  returned: success
  type: str
  sample: /data/models/chat-20b-fp16/.2024-06-01.staging
converting:
  description: Where the FP16 copy is made when converting.
  returned: success
  type: str
  sample: /data/models/chat-20b-fp16/.2024-06-01.converting
filesystem:
  description: The mount holding the destination.
  returned: success
  type: dict
  sample: {mount_point: /data, fstype: ext4, source: /dev/nvme0n1p1, kind: local}
space:
  description: Free space and what the sync needs, in bytes.
  returned: success
  type: dict
  sample: {free_bytes: 900000000000, needed_bytes: 42308309714, transfer_bytes: 41234567890,
           convert_bytes: 0, margin_bytes: 1073741824}
content_id:
  description: The source manifest's content id.
  returned: success
  type: str
model_bytes:
  description: Total bytes of the model's files.
  returned: success
  type: int
dtypes:
  description: Tensor dtypes in the source's safetensors shards.
  returned: success
  type: list
  elements: str
  sample: [BF16]
bf16_files:
  description: Shards with BF16 tensors.
  returned: success
  type: list
  elements: str
convert_bf16:
  description: Whether this sync converts BF16 to FP16.
  returned: success
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.manifest import WORKERS, default_workers, manifest_from_dict
from ansible.module_utils.revive_sync.tasks import preflight_task


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "free_space_margin_bytes": Bound(int, 0, high=2 ** 60, why="bytes"),
    "workers": WORKERS,
}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            manifest=dict(type="dict", required=True),
            free_space_margin_bytes=dict(type="int", default=1 << 30),
            gpu_bf16=dict(type="bool", default=False),
            convert_bf16=dict(type="bool", default=False),
            allowed_dtypes=dict(type="list", elements="str", default=[]),
            full_reverify=dict(type="bool", default=False),
            workers=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "model_preflight")
    params = module.params
    try:
        result = preflight_task(
            params["dest"], manifest_from_dict(params["manifest"], "parameter manifest"),
            margin_bytes=params["free_space_margin_bytes"], gpu_bf16=params["gpu_bf16"],
            convert_bf16=params["convert_bf16"], allowed_dtypes=params["allowed_dtypes"],
            full_reverify=params["full_reverify"], workers=params["workers"] or default_workers(),
            where=os.uname().nodename)
    except SyncError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
