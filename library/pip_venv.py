#!/usr/bin/python
"""Ansible module pip_venv: thin wiring over module_utils/revive_venv.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: pip_venv
short_description: A Python venv installed from a hash lock (an index, a mirror or a wheelhouse), rebuilt when half-built
description:
  - >-
    Creates a virtual environment at O(path) with the node's interpreter O(python) and installs exactly the
    hash lock O(lock) from the public index, an internal mirror or an offline wheelhouse directory on the
    node (C(--no-index --find-links)) with C(pip install --require-hashes --only-binary :all: --no-deps -r LOCK):
    every file checked against its sha256, no sdist ever built on the node, nothing outside the lock.
  - Idempotent. A venv whose completion marker C(.revive-venv.json) holds the same pins and whose installed
    versions still satisfy them is left alone (V(changed=false)). A venv without the marker (a failed or
    interrupted build), with other pins, a broken interpreter or another Python minor version is removed
    and built again; an incomplete venv is never used. The marker is written last.
  - Versions are compared as PEP 440 does - C(==0.5.4) is satisfied by C(0.5.4+sim) and the local label
    (C(sim)) is reported.
  - Optionally imports O(verify_import) in the venv afterwards and checks its C(__version__).
  - Commands run as argument lists; pip runs C(--isolated), so no C(pip.conf) or C(PIP_*) variable on the
    node changes where packages come from.
version_added: "0.1.0"
author:
  - revive project
options:
  path:
    description: Directory of the venv, e.g. C(/opt/revive/probe-venv) or C(/opt/vllm/venvs/0.5.4-3f9a1c2e).
    type: path
    required: true
  python:
    description:
      - Interpreter the venv is made from (C(python -m venv)); Python 3.10 on Ubuntu 22.04, 3.11 on Debian 12.
      - A venv made from another minor version is rebuilt.
    type: str
    default: python3
  packages:
    description:
      - Exact pins, C(name==version). Ranges, wildcards, extras and markers are refused so that every node
        gets the same build.
    type: list
    elements: str
    required: true
  source:
    description: Where pip gets the packages.
    type: dict
    default: {}
    suboptions:
      type:
        description: V(index) (the public index, or O(source.index_url)), V(mirror) (an internal index), V(wheelhouse) (a directory on the node).
        type: str
        choices: [index, mirror, wheelhouse]
        default: index
      index_url:
        description: Simple-index URL for V(index) (default C(https://pypi.org/simple)) and V(mirror) (required).
        type: str
      trusted_host:
        description: Host to trust over plain HTTP (C(--trusted-host)), for a mirror without TLS.
        type: str
      wheelhouse:
        description: Directory of wheels on the node, for V(wheelhouse) (C(--no-index --find-links DIR)).
        type: path
  lock:
    description:
      - A requirements file on the node with C(--hash=sha256:...) for every requirement (C(bin/revive lock)
        writes them); pip installs exactly it. It must pin every entry of O(packages) at a version that
        satisfies the pin; a lock whose header names C(missing) distributions is refused.
    type: path
    required: true
  verify_import:
    description: A module to import in the venv after the install (and when the venv is kept); its C(__version__) must satisfy O(verify_version).
    type: str
  verify_version:
    description: The version C(verify_import.__version__) must satisfy; default the pin of the package named like O(verify_import).
    type: str
attributes:
  check_mode:
    support: full
    details: Inspects the existing venv (running its interpreter read-only) and reports the action it would take; nothing is created, removed or installed.
  diff_mode:
    support: full
    details: The pins of the existing venv (from its marker) before, the requested pins after.
requirements:
  - the C(venv) module for O(python) (Debian/Ubuntu package C(python3-venv))
notes:
  - The issue-6 runtime role reuses this module for the vLLM release venvs under C(/opt/vllm/venvs/).
seealso:
  - name: PEP 440 version matching
    description: A pin without a local version label ignores the candidate's label.
    link: https://peps.python.org/pep-0440/#version-matching
  - name: pip hash-checking mode
    description: C(--require-hashes) and C(--hash) in requirements files.
    link: https://pip.pypa.io/en/stable/topics/secure-installs/
"""

EXAMPLES = r"""
- name: Probe venv with pinned nvidia-ml-py from a wheelhouse copied to the node
  pip_venv:
    path: /opt/revive/probe-venv
    python: /usr/bin/python3
    packages: [nvidia-ml-py==13.615.71]
    source:
      type: wheelhouse
      wheelhouse: /var/cache/revive/wheelhouse
    lock: /var/cache/revive/locks/probe-venv.txt

- name: vLLM release venv from an internal mirror, hash-checked, import verified
  pip_venv:
    path: /opt/vllm/venvs/0.8.5.post1-3f9a1c2e
    python: /usr/bin/python3.10
    packages: [vllm==0.8.5.post1, torch==2.6.0, xformers==0.0.29.post2]
    source:
      type: mirror
      index_url: http://pypi.mirror.internal/simple
      trusted_host: pypi.mirror.internal
    lock: /var/cache/revive/locks/vllm-0.8.5.post1-py3.10.txt
    verify_import: vllm
  register: runtime_venv

- name: Say which build was installed (e.g. 0.8.5.post1+sim in the lab)
  ansible.builtin.debug:
    msg: "vllm {{ runtime_venv.import_version }} (local label {{ runtime_venv.local_label }})"
"""

RETURN = r"""
decision:
  description:
    - What was done (or, in check mode, would be) - V(unchanged), V(create) or V(rebuild).
    - Not called C(action) because Ansible's callbacks overwrite that key with the module's name.
  returned: always
  type: str
  sample: rebuild
reason:
  description: Why that decision.
  returned: always
  type: str
  sample: "half-built venv: no completion marker .revive-venv.json: a previous build failed or was interrupted"
path:
  description: The venv directory.
  returned: always
  type: str
python:
  description: The venv's interpreter, for C(ansible_python_interpreter) of later tasks.
  returned: always
  type: str
  sample: /opt/revive/probe-venv/bin/python
python_version:
  description: Python version of the venv (null in check mode before it exists).
  returned: always
  type: str
  sample: "3.11.2"
installed:
  description: The installed version of each pinned package (null where not installed, e.g. in check mode).
  returned: always
  type: dict
  sample: {nvidia-ml-py: "13.615.71"}
distributions:
  description: Every distribution in the venv, by normalised name.
  returned: always
  type: dict
  sample: {nvidia-ml-py: "13.615.71", pip: "23.0.1", setuptools: "66.1.1"}
pip_argv:
  description: The pip command that ran (or would run).
  returned: always
  type: list
  elements: str
import_version:
  description: C(__version__) of O(verify_import) in the venv.
  returned: when O(verify_import) is set and the venv exists
  type: str
  sample: "0.5.4+sim"
local_label:
  description: The PEP 440 local version label of C(import_version), null when it has none.
  returned: when O(verify_import) is set and the venv exists
  type: str
  sample: sim
"""

import platform

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_venv import SOURCE_ARGUMENT_SPEC as SOURCE_SPEC
from ansible.module_utils.revive_venv import VenvError, VenvSpec, ensure_venv, source_from_params


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "python": {"type": "str", "default": "python3"},
            "packages": {"type": "list", "elements": "str", "required": True},
            "source": {"type": "dict", "default": {}, "options": SOURCE_SPEC},
            "lock": {"type": "path", "required": True},
            "verify_import": {"type": "str"},
            "verify_version": {"type": "str"},
        },
        supports_check_mode=True,
    )
    params = module.params
    host = platform.node()
    try:
        spec = VenvSpec(path=params["path"], python=params["python"], packages=params["packages"],
                        source=source_from_params(params["source"]), lock=params["lock"],
                        verify_import=params["verify_import"], verify_version=params["verify_version"])
        result = ensure_venv(spec, lambda argv: module.run_command(argv), module.check_mode, host)
    except VenvError as error:
        module.fail_json(msg=str(error))
    output = result.as_dict()
    if module._diff and result.changed:
        output["diff"] = {"before": "\n".join(result.pins_before) + "\n" if result.pins_before else "",
                          "after": "\n".join(result.pins_after) + "\n",
                          "before_header": f"{spec.path} (pins)", "after_header": f"{spec.path} (pins)"}
    module.exit_json(**output)


if __name__ == "__main__":
    main()
