#!/usr/bin/python
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_convert
short_description: Convert a verified staged model from BF16 to FP16, shard by shard, without torch
description:
  - Runs on the node, with an interpreter that has numpy (the role's tools venv). It reads the verified
    staging copy and writes C(.<revision>.converting) beside the promoted path.
  - Each BF16 tensor is streamed in bounded chunks (uint16 to float32 to float16), so memory stays at a few MiB
    whatever the shard size. Tensor offsets do not move, because both dtypes take 2 bytes.
  - Values beyond FP16's range (65504 in magnitude) are counted per tensor. O(overflow) decides what happens to
    them. V(fail) converts nothing when any value overflows and lists the tensors. V(clamp) saturates them to
    65504 in magnitude. V(inf) keeps IEEE overflow to infinity.
  - C(torch_dtype) (and C(dtype)) in config.json become C(float16). The safetensors index's metadata records the
    conversion. A new manifest, hashed while writing, records the source's content id in C(converted_from).
  - Files that need no change are hard-linked from staging.
version_added: "1.0.0"
author: revive
requirements:
  - numpy on the interpreter that runs the module
options:
  dest:
    description: The promoted path of this revision; staging and the FP16 copy sit beside it.
    type: path
    required: true
  source_content_id:
    description: The source manifest's content id; the staging copy must be verified against it.
    type: str
    required: true
  overflow:
    description: What to do with values beyond FP16's range.
    type: str
    choices: [fail, clamp, inf]
    default: fail
  chunk_values:
    description: Values converted per chunk (2 bytes read, about 8 bytes of working memory each).
    type: int
    default: 1048576
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
seealso:
  - module: model_stage
  - module: model_promote
"""

EXAMPLES = r"""
- name: Convert BF16 weights to FP16 for a V100 node
  model_convert:
    dest: /data/models/qwen2-7b/2024-06-01
    source_content_id: "{{ source_manifest.manifest.content_id }}"
    overflow: fail
  vars:
    ansible_python_interpreter: /opt/revive/tools-venv/bin/python
"""

RETURN = r"""
output_dir:
  description: Where the FP16 copy is.
  returned: always
  type: str
  sample: /data/models/qwen2-7b/.2024-06-01.converting
content_id:
  description: Content id of the FP16 copy's manifest.
  returned: success
  type: str
report:
  description: Per-shard counts; RV(report.overflow) maps shard to tensor to the number of overflowing values.
  returned: when converted in this run
  type: dict
  sample:
    converted_values: 7615616512
    overflow_values: 2
    overflow: {model-00002-of-00004.safetensors: {model.layers.3.mlp.down_proj.weight: 2}}
    underflow_values: 1043
    overflow_policy: clamp
    config_keys_rewritten: [torch_dtype]
    index_files_rewritten: [model.safetensors.index.json]
"""

import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.revive_bounds import Bound, check_options
from ansible.module_utils.revive_model import ModelInspectError
from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.promote import converting_path, staging_path
from ansible.module_utils.revive_sync.tasks import convert_task

try:
    import numpy  # noqa: F401  (imported by the conversion itself; checked here for a clear message)
    NUMPY_ERROR = None
except ImportError as exc:
    NUMPY_ERROR = exc


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "chunk_values": Bound(int, 1, high=2 ** 30, why="values per chunk, about 8 bytes of memory each"),
}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            source_content_id=dict(type="str", required=True),
            overflow=dict(type="str", choices=["fail", "clamp", "inf"], default="fail"),
            chunk_values=dict(type="int", default=1 << 20),
        ),
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "model_convert")
    params = module.params
    if NUMPY_ERROR is not None and not module.check_mode:
        module.fail_json(msg=missing_required_lib("numpy") + " (the model_sync role installs it in its tools venv, "
                         "model_sync_tools_venv, from model_sync_tools_wheelhouse)", exception=str(NUMPY_ERROR))
    try:
        result = convert_task(staging_path(params["dest"]), converting_path(params["dest"]),
                              params["source_content_id"], overflow_policy=params["overflow"],
                              check_mode=module.check_mode, where=os.uname().nodename,
                              chunk_values=params["chunk_values"])
    except (SyncError, ModelInspectError) as exc:
        module.fail_json(msg=str(exc))
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
