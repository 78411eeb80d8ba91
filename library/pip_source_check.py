#!/usr/bin/python
"""Ansible module pip_source_check: thin wiring over module_utils/revive_wheelsource.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: pip_source_check
short_description: Prove that a package source offers every wheel of a hash lock for a node, before installing
description:
  - Reads the hash lock O(lock) (C(name==version --hash=sha256:...) lines, as C(bin/revive lock) writes them) and
    checks that the package source O(source) offers, for every entry, a wheel whose sha256 is one of the entry's
    hashes and whose tags install on the target (CPython O(python) on O(platform)). That is what
    C(pip install --require-hashes --no-deps -r LOCK --only-binary=:all:) needs; sdists never count.
  - For an index or a mirror it fetches one simple-index page per entry (C(<index_url>/<normalized name>/)), asking
    for the PEP 691 JSON form and reading the PEP 503 HTML form (hashes in C(#sha256=) fragments) when the index
    serves only that; a few pages at a time, with a timeout and retries. Plain http is used only for
    O(source.trusted_host), as pip's C(--trusted-host) (which also skips certificate checks for that host).
  - For a wheelhouse it hashes the directory's wheels of the locked names and versions (streamed sha256), and
    also reports another build of a locked version that pip would prefer over the locked wheel.
  - Wheel tags follow pip. C(cpXY), C(abi3) (from older minors) and C(py3)/C(none)/C(any) wheels count;
    C(manylinux_X_Y) counts up to the target's glibc, and C(manylinux2014) is C(manylinux_2_17).
    C(linux_x86_64) (local builds) and C(musllinux) never count.
  - A lock whose header lists C(# missing:) distributions (needed but not hashed) is refused, with the
    C(bin/revive lock VERSION --supply DIR) command that completes it.
  - Never changes anything. It fails with every problem at once, each naming the requirement, the page or
    directory and what is missing.
version_added: "0.1.0"
author:
  - revive project
options:
  lock:
    description: The hash lock, a path on the host running the module (the node, or the controller when delegated).
    type: path
    required: true
  source:
    description: Where pip will get the packages (as the O(source) of the pip_venv module).
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
        description: Directory of wheels for V(wheelhouse), on the host running the module.
        type: path
  python:
    description: CPython minor version of the venv's interpreter on the node, e.g. V(3.10) (Ubuntu 22.04) or V(3.11) (Debian 12).
    type: str
    required: true
  platform:
    description:
      - The node's manylinux platform, e.g. V(manylinux_2_35_x86_64) (glibc 2.35, Ubuntu 22.04) or V(manylinux_2_36_x86_64)
        (Debian 12); uv's spelling V(x86_64-manylinux_2_35), as lock headers record it, is accepted too.
    type: str
    required: true
  timeout:
    description: Seconds per HTTP request.
    type: float
    default: 60
  retries:
    description: Further attempts after a network error or an HTTP 5xx/429 answer (with exponential backoff from 1 s).
    type: int
    default: 3
  jobs:
    description: Pages fetched (or wheels hashed) at the same time.
    type: int
    default: 8
attributes:
  check_mode:
    support: full
    details: The module only reads (pages, files), so check mode runs it normally.
  diff_mode:
    support: none
notes:
  - Run it where pip will run. An index or a mirror is checked from the node (its network, proxy and trusted host),
    a wheelhouse where its directory is.
  - Yanked files count, as pip installs a yanked file that an C(==) pin names. Wheels a page lists without a sha256
    cannot be proved and are reported.
seealso:
  - module: pip_venv
  - module: wheel_cache
  - name: PEP 691 JSON simple index
    description: The C(application/vnd.pypi.simple.v1+json) project page.
    link: https://peps.python.org/pep-0691/
  - name: Platform compatibility tags
    description: How pip matches wheel tags (manylinux, abi3, py3-none-any).
    link: https://packaging.python.org/en/latest/specifications/platform-compatibility-tags/
"""

EXAMPLES = r"""
- name: Check that the mirror serves the whole lock for this node
  pip_source_check:
    lock: /var/cache/revive/locks/vllm-0.8.5.post1-py3.10.txt
    source:
      type: mirror
      index_url: http://pypi.mirror.internal/simple
      trusted_host: pypi.mirror.internal
    python: "3.10"
    platform: manylinux_2_35_x86_64

- name: Check the controller's wheelhouse before copying it to the nodes
  pip_source_check:
    lock: "{{ playbook_dir }}/../data/locks/vllm-0.5.4-py3.10.txt"
    source:
      type: wheelhouse
      wheelhouse: "{{ playbook_dir }}/../.cache/wheels/vllm-0.5.4-py3.10"
    python: "3.10"
    platform: x86_64-manylinux_2_35
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
ok:
  description: Whether the source offers an installable wheel with a locked hash for every entry (always true on success).
  returned: always
  type: bool
checked:
  description: Number of lock entries checked.
  returned: always
  type: int
  sample: 145
lock:
  description: The lock's path.
  returned: always
  type: str
source:
  description: The source, in words.
  returned: always
  type: str
  sample: mirror http://pypi.mirror.internal/simple
target:
  description: The target, in words.
  returned: always
  type: str
  sample: CPython 3.10 on manylinux_2_35_x86_64
problems:
  description: What is missing, one item per requirement (empty on success).
  returned: always
  type: list
  elements: dict
  contains:
    requirement:
      description: The lock entry, C(name==version).
      type: str
      sample: torch==2.6.0
    message:
      description: What is missing, where, and how to fix it.
      type: str
      sample: "no wheel of torch==2.6.0 with a locked hash at http://pypi.mirror.internal/simple/torch/ (offered: 3 wheel(s) of 2.6.0, none matching: ...)"
files:
  description: The wheel each entry installs from (the one pip picks on the target).
  returned: always
  type: list
  elements: dict
  contains:
    requirement:
      description: The lock entry.
      type: str
    filename:
      description: The wheel's file name.
      type: str
      sample: torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl
    url:
      description: Its URL, or its path in a wheelhouse.
      type: str
    sha256:
      description: Its sha256 (one of the entry's locked hashes).
      type: str
    size:
      description: Its size in bytes, null where the index does not say.
      type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_bounds import check_options
from ansible.module_utils.revive_wheelsource import (LOCK_SOURCE_BOUNDS, WheelSourceError, check_source, http_for,
                                                     lock_source_argument_spec, prepare)


# Numeric options' ranges, checked before anything else (module_utils/revive_bounds.py; docs/inputs.md).
BOUNDS = LOCK_SOURCE_BOUNDS


def main() -> None:
    module = AnsibleModule(
        argument_spec=lock_source_argument_spec(),
        supports_check_mode=True,
    )
    check_options(module, BOUNDS, "pip_source_check")
    params = module.params
    try:
        lock, source, target = prepare(params["lock"], params["source"], params["python"], params["platform"])
        report = check_source(lock, source, target, http_for(source, params["timeout"], params["retries"]),
                              params["jobs"])
    except WheelSourceError as error:
        module.fail_json(msg=str(error))
    result = report.as_dict()
    if not report.ok:
        module.fail_json(**result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
