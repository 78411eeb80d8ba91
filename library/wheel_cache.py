#!/usr/bin/python
"""Ansible module wheel_cache: thin wiring over module_utils/revive_wheelcache.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: wheel_cache
short_description: Download every wheel of a hash lock once into a cache directory, verified and resumable
description:
  - For each entry of the hash lock O(lock), downloads the wheel that the target (CPython O(python) on
    O(platform)) installs from O(source) into O(dest) - the fleet's cache, usually on the controller, from which
    the nodes' wheelhouses are filled.
  - The source is checked first (as the pip_source_check module does), so nothing is downloaded unless it
    serves every locked wheel; all problems are reported at once. Of several wheels of an entry, the one with
    the most specific tag (pip's choice) is taken.
  - A file already in O(dest) with a locked hash is kept, so a second run downloads nothing (V(changed=false));
    one with another hash is downloaded again and replaced.
  - Each download goes to C(<dest>/<filename>.part) and resumes with an HTTP Range request where an interrupted
    attempt or run stopped; a server that ignores Range restarts the file cleanly. The sha256 is checked against
    the lock before the file is renamed into place; a mismatch deletes the part file and fails naming the URL and
    both hashes.
  - Writes nothing else into O(dest) but C(<dest>/.progress.json) (files and bytes done and in total, the current
    file, the state - V(running), V(done) or V(failed) with C(msg)), rewritten atomically about once a second
    while it downloads, so a playbook can follow a long download (C(async) with C(poll=0), then
    C(ansible.builtin.slurp) the file). A run with nothing to download writes nothing at all.
  - Fails before downloading when O(dest)'s file system has less room than the known sizes need.
version_added: "0.1.0"
author:
  - revive project
options:
  lock:
    description: The hash lock, a path on the host running the module.
    type: path
    required: true
  source:
    description: Where the wheels come from (as the O(source) of the pip_venv module).
    type: dict
    default: {}
    suboptions:
      type:
        description: V(index) (the public index, or O(source.index_url)), V(mirror) (an internal index), V(wheelhouse) (a directory).
        type: str
        choices: [index, mirror, wheelhouse]
        default: index
      index_url:
        description: Simple-index URL for V(index) (default C(https://pypi.org/simple)) and V(mirror) (required).
        type: str
      trusted_host:
        description: Host (or C(host:port)) whose plain-http URLs are allowed and whose certificate is not checked.
        type: str
      wheelhouse:
        description: Directory of wheels for V(wheelhouse) (its locked wheels are copied into O(dest)).
        type: path
  python:
    description: CPython minor version of the nodes' venv interpreter, e.g. V(3.10).
    type: str
    required: true
  platform:
    description: The nodes' manylinux platform, e.g. V(manylinux_2_35_x86_64) (or uv's V(x86_64-manylinux_2_35)).
    type: str
    required: true
  dest:
    description: The cache directory; created (mode 0755) when missing. Wheels land there under their file names.
    type: path
    required: true
  timeout:
    description: Seconds per HTTP request (and of silence within a download).
    type: float
    default: 60
  retries:
    description: Further attempts after a network error, a cut connection (resumed) or an HTTP 5xx answer.
    type: int
    default: 3
  jobs:
    description: Index pages fetched at the same time during the source check (downloads run one at a time).
    type: int
    default: 8
attributes:
  check_mode:
    support: full
    details: Checks the source and hashes the files already in O(dest); reports what would be downloaded and how many bytes where the index gives sizes. Downloads and writes nothing.
  diff_mode:
    support: none
seealso:
  - module: pip_source_check
  - module: pip_venv
  - name: HTTP range requests
    description: How an interrupted download resumes.
    link: https://developer.mozilla.org/en-US/docs/Web/HTTP/Range_requests
"""

EXAMPLES = r"""
- name: Fill the controller's cache for the release's lock
  wheel_cache:
    lock: "{{ playbook_dir }}/../data/locks/vllm-0.8.5.post1-py3.10.txt"
    source:
      type: index
    python: "3.10"
    platform: manylinux_2_35_x86_64
    dest: "{{ playbook_dir }}/../.cache/wheels/vllm-0.8.5.post1-py3.10"
  delegate_to: localhost
  run_once: true

- name: Or in the background, following its progress file
  wheel_cache:
    lock: /srv/revive/locks/vllm-0.8.5.post1-py3.10.txt
    source: {type: mirror, index_url: "http://pypi.mirror.internal/simple", trusted_host: pypi.mirror.internal}
    python: "3.10"
    platform: manylinux_2_35_x86_64
    dest: /srv/revive/wheels
  async: 7200
  poll: 0
  register: fill
"""

RETURN = r"""
changed:
  description: Whether a file was downloaded (or, in check mode, would be).
  returned: always
  type: bool
dest:
  description: The cache directory.
  returned: always
  type: str
files_total:
  description: Wheels of the lock (one per entry).
  returned: always
  type: int
  sample: 145
files_downloaded:
  description: Wheels downloaded (in check mode, that would be).
  returned: always
  type: int
files_kept:
  description: Wheels already in O(dest) with a locked hash.
  returned: always
  type: int
downloaded:
  description: File names downloaded (or, in check mode, to download).
  returned: always
  type: list
  elements: str
kept:
  description: File names kept.
  returned: always
  type: list
  elements: str
replaced:
  description: File names that were in O(dest) with a hash not in the lock, downloaded again.
  returned: always
  type: list
  elements: str
bytes_downloaded:
  description: Bytes transferred by this run (0 in check mode; a resumed file counts only its remainder).
  returned: always
  type: int
bytes_to_download:
  description: Bytes still to fetch before this run, over the files whose size the source gave (resumable parts deducted).
  returned: always
  type: int
  sample: 8160437862
bytes_total:
  description: Bytes of all the lock's wheels, where known.
  returned: always
  type: int
unknown_sizes:
  description: Files to download whose size the source did not give (a PEP 503 HTML index), not in O(bytes_to_download).
  returned: always
  type: list
  elements: str
progress_file:
  description: The progress file, C(<dest>/.progress.json) (not written in check mode).
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import check_options
from ansible.module_utils.revive_wheelcache import ProgressFile, SourceProblems, fill_cache
from ansible.module_utils.revive_wheelsource import (LOCK_SOURCE_BOUNDS, WheelSourceError, http_for,
                                                     lock_source_argument_spec, prepare)


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = LOCK_SOURCE_BOUNDS


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(lock_source_argument_spec(), dest={"type": "path", "required": True}),
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "wheel_cache")
    params = module.params
    progress = ProgressFile(params["dest"])
    try:
        lock, source, target = prepare(params["lock"], params["source"], params["python"], params["platform"])
        result = fill_cache(lock, source, target, params["dest"], None if module.check_mode else progress,
                            module.check_mode, http_for(source, params["timeout"], params["retries"]), params["jobs"])
    except SourceProblems as error:
        if not module.check_mode:
            progress.finish("failed", str(error))
        module.fail_json(**error.report.as_dict())
    except WheelSourceError as error:
        if not module.check_mode:
            progress.finish("failed", str(error))
        module.fail_json(msg=str(error), dest=params["dest"])
    if not module.check_mode:
        progress.finish("done", result=result)
    module.exit_json(progress_file=progress.path, **result.as_dict())


if __name__ == "__main__":
    main()
