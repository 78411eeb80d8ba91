#!/usr/bin/python
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations

DOCUMENTATION = r"""
---
module: config_files
short_description: Keep a role's configuration files and their directories in one module run
description:
  - Runs on the host. Creates each of O(directories) that is missing and sets its owner, group and mode; then, for
    each of O(files), writes O(files[].content) where the file's bytes differ, sets its owner, group and mode where
    they differ, or removes it (O(files[].state=absent)).
  - One module run for all of them, where M(ansible.builtin.copy) and M(ansible.builtin.template) cost two per file
    even when nothing changes. Render the contents on the controller with the C(ansible.builtin.template) lookup
    (or C(ansible.builtin.file) with C(rstrip=false) for a static file).
  - A file is written through a temporary file beside it that gets its owner, group and mode before the content is
    checked (O(files[].validate)) and renamed into place, so a reader sees the old file or the new one, and a
    root-only file is never readable by others.
  - O(files[].content) is C(no_log), like the content of M(ansible.builtin.copy), and the module writes no
    C(Invoked with) line to the node's log, which would show the contents. With C(--diff) the result holds a
    unified diff of each changed file, so a task that writes a secret (an API key, a private key) sets C(diff) to
    false, and C(no_log) to true to hide the rest of its result.
  - Nothing changes, and RV(changed) is false, when every directory and file is already as given.
version_added: "1.0.0"
author: revive
options:
  directories:
    description: Directories to create (with their parents) before the files are written.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path.
        type: str
        required: true
      owner:
        description: Owner; the user must exist.
        type: str
        default: root
      group:
        description: Group; it must exist.
        type: str
        default: root
      purge:
        description:
          - A file-name pattern, e.g. C(*.yml). After the files are written, the directory's own files that match it
            and that no entry of O(files) keeps are removed (a rule file the repository no longer has).
          - Subdirectories are never removed.
        type: str
      mode:
        description:
          - Octal mode as a quoted string, e.g. C("0755"). A number is refused (YAML reads an unquoted C(0755) as
            the decimal 493).
        type: raw
        required: true
  files:
    description: Files to keep, in order.
    type: list
    elements: dict
    default: []
    suboptions:
      dest:
        description: Absolute path of the file. Its directory must exist or be one of O(directories).
        type: str
        required: true
      name:
        description: The key of this file in RV(files); default O(files[].dest).
        type: str
      content:
        description: The file's text, exactly (a final newline is not added). Required unless O(files[].state=absent).
        type: str
      state:
        description: C(absent) removes the file.
        type: str
        choices: [present, absent]
        default: present
      owner:
        description: Owner; the user must exist.
        type: str
        default: root
      group:
        description: Group; it must exist.
        type: str
        default: root
      mode:
        description: Octal mode as a quoted string, e.g. C("0644"); a number is refused.
        type: raw
        default: "0644"
      validate:
        description:
          - A command that checks the new content before it replaces the file; C(%s) is the temporary file's path.
          - When it fails the file is left as it was and the task fails with the command's output.
        type: str
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
notes:
  - Directories are created parents first; files are written in the order given. The first error stops the task
    with what was done before it in place.
seealso:
  - module: ansible.builtin.copy
  - module: ansible.builtin.template
"""

EXAMPLES = r"""
- name: Write the exporter's unit and its arguments
  config_files:
    directories:
      - {path: /etc/revive, mode: "0755"}
    files:
      - name: unit
        dest: /etc/systemd/system/revive-exporter.service
        content: "{{ lookup('ansible.builtin.template', 'revive-exporter.service.j2') }}"
      - dest: /etc/revive/exporter.args
        content: "{{ lookup('ansible.builtin.template', 'exporter.args.j2') }}"
        mode: "0600"
      - dest: /usr/local/libexec/revive/old-helper
        state: absent
  register: exporter_files

- name: Restart the exporter when its unit changed
  ansible.builtin.systemd_service:
    name: revive-exporter.service
    state: restarted
    daemon_reload: true
  when: exporter_files.files.unit is changed
"""

RETURN = r"""
files:
  description: Per file (keyed by O(files[].name)), its path and whether it changed; C(is changed) works on each.
  returned: always
  type: dict
  sample:
    unit: {dest: /etc/systemd/system/revive-exporter.service, changed: true}
actions:
  description: What was done (or, in check mode, would be done).
  returned: always
  type: list
  elements: str
  sample: ["create directory /etc/revive", "write /etc/systemd/system/revive-exporter.service"]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_config_files import ConfigFileError, Outcome, apply, parse

OWNED = dict(
    owner=dict(type="str", default="root"),
    group=dict(type="str", default="root"),
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            directories=dict(type="list", elements="dict", default=[], options=dict(
                path=dict(type="str", required=True),
                purge=dict(type="str"),
                mode=dict(type="raw", required=True),
                **OWNED,
            )),
            files=dict(type="list", elements="dict", default=[], options=dict(
                dest=dict(type="str", required=True),
                name=dict(type="str"),
                # As copy's: masked where it shows whole in a result (a content may hold a secret).
                content=dict(type="str", no_log=True),
                state=dict(type="str", choices=["present", "absent"], default="present"),
                mode=dict(type="raw", default="0644"),
                validate=dict(type="str"),
                **OWNED,
            )),
        ),
        supports_check_mode=True,
        # No "Invoked with ..." line in the node's log: Ansible masks a no_log suboption there only where its value
        # appears verbatim, and the line shows the list of files escaped (a content's newlines as \\n).
        no_log=True,
    )
    outcome = Outcome()
    try:
        directories, files = parse(module.params["directories"], module.params["files"])
        apply(directories, files, check_mode=module.check_mode, want_diff=module._diff, outcome=outcome)
    except (ConfigFileError, OSError) as exc:
        outcome.changed = outcome.changed or any(record["changed"] for record in outcome.files.values())
        module.fail_json(msg=f"{exc}", changed=outcome.changed, files=outcome.files, actions=outcome.actions)
    result = dict(changed=outcome.changed, files=outcome.files, actions=outcome.actions)
    if module._diff and outcome.diff:
        result["diff"] = outcome.diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
