"""_common's `packages` entry point (roles/_common/tasks/packages.yml): apt runs only where dpkg does not list every
package as installed. Through ansible-playbook on this Debian controller, apt in check mode only (nothing installed).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

BIN = os.path.dirname(sys.executable)


def run(repo, tmp_path, packages, *args) -> dict:
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{"name": "Packages", "hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "Packages", "ansible.builtin.import_role": {"name": "_common", "tasks_from": "packages"},
         "vars": {"_common_packages": packages}},
        {"name": "Show", "ansible.builtin.debug": {"msg": "{{ __common_packages_install }}"}}]}]))
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
                           *args], cwd=repo, env=env, capture_output=True, text=True)
    report = json.loads(proc.stdout)
    return {task["task"]["name"]: task["hosts"]["localhost"] for play in report["plays"] for task in play["tasks"]}


def test_apt_is_skipped_when_dpkg_lists_every_package_installed(repo, tmp_path):
    results = run(repo, tmp_path, ["dpkg", "coreutils"])
    install = next(result for name, result in results.items() if "Install the packages" in name)
    assert install["skipped"] and results["Show"]["msg"]["skipped"] is True


@pytest.mark.parametrize("packages", [["dpkg", "sl"], ["revive-no-such-package"]])
def test_apt_runs_when_one_is_missing_or_unknown_to_dpkg(repo, tmp_path, packages):
    results = run(repo, tmp_path, packages, "--check")
    install = next(result for name, result in results.items() if "Install the packages" in name)
    assert not install.get("skipped"), install
    assert install["action"] == "ansible.builtin.apt"
