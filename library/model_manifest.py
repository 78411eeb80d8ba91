#!/usr/bin/python
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_manifest
short_description: Read or make the manifest kept beside a model (every file's path, size and sha256)
description:
  - Runs where the model's source lives (the model-store host, the controller, or a node with the source mounted).
  - If C(revive-manifest.json) exists in O(path), it is read and checked against the files by name and size; a
    mismatch fails, since the model changed after its manifest was made.
  - Otherwise every file is hashed (sha256, files in parallel) and the manifest is written beside the model.
    Safetensors shards also record their tensor dtypes (from the header only), so BF16 weights are refused or
    planned for conversion before any byte is transferred.
  - When O(path) is read-only the manifest is still returned, with a warning, and made again on the next run.
version_added: "1.0.0"
author: revive
options:
  path:
    description: The model directory (config.json, tokenizer files, safetensors shards).
    type: path
    required: true
  refresh:
    description: Hash the files again and replace an existing manifest (after a deliberate change of the source).
    type: bool
    default: false
  workers:
    description: Files hashed in parallel; V(0) means one per CPU, at most 8.
    type: int
    default: 0
attributes:
  check_mode:
    support: full
    details: Hashes the files (read-only) and returns the manifest without writing it.
  diff_mode:
    support: full
notes:
  - Top-level C(.git) and C(.cache) (huggingface_hub download metadata) and C(.revive-*) files are not part of a model.
  - Symlinks are followed, so a Hugging Face cache snapshot directory works as a source.
seealso:
  - module: model_stage
  - module: model_preflight
"""

EXAMPLES = r"""
- name: Read or make the manifest on the model-store host
  model_manifest:
    path: /srv/models/chat-20b-fp16/2024-06-01
  delegate_to: model-store
  run_once: true
  register: source_manifest

- name: Make a new manifest after the source was deliberately replaced
  model_manifest:
    path: /srv/models/chat-20b-fp16/2024-06-01
    refresh: true
"""

RETURN = r"""
manifest:
  description: The manifest; RV(manifest.content_id) identifies the model's bytes.
  returned: always
  type: dict
  sample:
    format: revive-model-manifest/1
    algorithm: sha256
    content_id: 5f0c9e0d7e2b4c1f8e7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e
    total_bytes: 41234567890
    file_count: 12
    files:
      - {path: config.json, size: 655, sha256: 0d4c9ad1e2f3a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d}
      - {path: model-00001-of-00009.safetensors, size: 4983004072, sha256: 9f8e7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c6b5a4938271605f4e3d2c1b0a,
         dtypes: [F16]}
    converted_from: null
manifest_path:
  description: Where the manifest is kept.
  returned: always
  type: str
  sample: /srv/models/chat-20b-fp16/2024-06-01/revive-manifest.json
created:
  description: Whether the manifest was made in this run (true also in check mode, where it is not written).
  returned: always
  type: bool
written:
  description: Whether the manifest was written beside the model.
  returned: always
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import check_options
from ansible.module_utils.revive_model import ModelInspectError
from ansible.module_utils.revive_sync.dtype import safetensors_dtypes
from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.manifest import WORKERS, default_workers
from ansible.module_utils.revive_sync.tasks import manifest_task


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = {
    "workers": WORKERS,
}


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            refresh=dict(type="bool", default=False),
            workers=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "model_manifest")
    params = module.params
    try:
        result = manifest_task(params["path"], refresh=params["refresh"], check_mode=module.check_mode,
                               workers=params["workers"] or default_workers(), read_dtypes=safetensors_dtypes,
                               where=os.uname().nodename)
    except (SyncError, ModelInspectError) as exc:
        module.fail_json(msg=str(exc))
    for warning in result.pop("warnings"):
        module.warn(warning)
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
