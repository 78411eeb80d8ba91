#!/usr/bin/python
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_promote
short_description: Atomically promote a verified model copy to its revision path and point current at it
description:
  - Runs on the node. Takes the verified staging copy, or the verified FP16 copy when O(converted) is set. The copy
    is trusted only while no file's stat has changed since verification.
  - Makes the files C(root:<group>) mode C(0440) and directories C(0750) (read-only, readable by the service group),
    flushes them to disk, and renames the copy to O(dest).
  - A corrupt or partial copy is never visible under O(dest). A previous copy at O(dest) that does not hold the
    source's bytes is renamed aside first and removed afterwards.
  - Then points O(current_link) at O(dest) atomically, by making a new symlink beside it and renaming it over the old one.
  - Leftover staging and conversion directories of this revision are removed.
  - Nothing changes when O(dest) already holds the source's bytes and the link already points at it.
version_added: "1.0.0"
author: revive
options:
  dest:
    description: The promoted path of this revision, e.g. C(/data/models/<name>/<revision>).
    type: path
    required: true
  source_content_id:
    description: The source manifest's content id.
    type: str
    required: true
  converted:
    description: Promote the FP16 copy made by M(model_convert) instead of the staging copy.
    type: bool
    default: false
  group:
    description: Group that may read the model (the service's group); it must exist.
    type: str
    default: vllm
  current_link:
    description: The symlink to point at O(dest); default C(current) beside O(dest).
    type: path
  update_current:
    description: Whether to point O(current_link) at O(dest).
    type: bool
    default: true
  fsync:
    description: Flush every file to disk before the rename, so a power loss cannot leave a promoted but empty file.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
seealso:
  - module: model_stage
  - module: model_convert
"""

EXAMPLES = r"""
- name: Promote the verified copy and point current at it
  model_promote:
    dest: /data/models/chat-20b-fp16/2024-06-01
    source_content_id: "{{ source_manifest.manifest.content_id }}"
    group: vllm
"""

RETURN = r"""
actions:
  description: What was done (or, in check mode, would be done).
  returned: always
  type: list
  elements: str
  sample:
    - promote /data/models/chat-20b-fp16/.2024-06-01.staging to /data/models/chat-20b-fp16/2024-06-01
    - point /data/models/chat-20b-fp16/current at 2024-06-01
promoted_from:
  description: The directory that was renamed to O(dest), or null.
  returned: always
  type: str
up_to_date:
  description: O(dest) already held the source's bytes before this run.
  returned: always
  type: bool
current_link:
  description: The symlink that points at the promoted revision.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_sync.errors import SyncError
from ansible.module_utils.revive_sync.promote import converting_path, staging_path
from ansible.module_utils.revive_sync.tasks import promote_task


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            source_content_id=dict(type="str", required=True),
            converted=dict(type="bool", default=False),
            group=dict(type="str", default="vllm"),
            current_link=dict(type="path"),
            update_current=dict(type="bool", default=True),
            fsync=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    dest = params["dest"].rstrip("/")
    staging, converting = staging_path(dest), converting_path(dest)
    try:
        result = promote_task(
            dest, params["source_content_id"], candidates=[converting if params["converted"] else staging],
            group=params["group"], current_link=params["current_link"] or os.path.join(os.path.dirname(dest), "current"),
            update_current=params["update_current"], fsync=params["fsync"], check_mode=module.check_mode,
            cleanup=[staging, converting])
    except SyncError as exc:
        module.fail_json(msg=str(exc))
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
