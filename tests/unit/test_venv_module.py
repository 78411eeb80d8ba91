"""pip_venv through Ansible: `ansible localhost -m pip_venv` builds, keeps, and in check mode only reports."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from test_venv_build import auto_lock, make_wheel

BIN = os.path.dirname(sys.executable)


def ansible_env(repo) -> dict:
    return dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
                ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable)


def adhoc(repo, args: dict, *flags: str) -> dict:
    proc = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-c", "local", "-i", "localhost,",
                           "-m", "pip_venv", "-a", json.dumps(args), *flags],
                          cwd=repo, env=ansible_env(repo), capture_output=True, text=True)
    report = json.loads(proc.stdout)
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_ansible_doc_renders_pip_venv(repo):
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "-M", "library", "pip_venv"], cwd=repo,
                          env=ansible_env(repo), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "--require-hashes --only-binary :all: --no-deps -r LOCK" in " ".join(proc.stdout.split())
    assert "completion marker" in proc.stdout


def test_ansible_localhost_builds_then_keeps_the_venv_and_check_mode_changes_nothing(repo, tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    make_wheel(wheelhouse, "tinypkg", "1.0+sim", "__version__ = '1.0+sim'\n")
    lock = auto_lock(wheelhouse, ("tinypkg==1.0",), tmp_path / "lock.txt")
    args = {"path": str(tmp_path / "venv"), "python": sys.executable, "packages": ["tinypkg==1.0"],
            "source": {"type": "wheelhouse", "wheelhouse": str(wheelhouse)}, "lock": str(lock),
            "verify_import": "tinypkg"}

    checked = adhoc(repo, args, "--check", "--diff")
    assert (checked["changed"], checked["decision"]) == (True, "create")
    assert checked["diff"]["after"] == "tinypkg==1.0\n"
    assert not (tmp_path / "venv").exists()

    built = adhoc(repo, args)
    assert (built["changed"], built["decision"]) == (True, "create"), built.get("msg")
    assert built["installed"] == {"tinypkg": "1.0+sim"}
    assert (built["import_version"], built["local_label"]) == ("1.0+sim", "sim")
    assert built["python"] == str(tmp_path / "venv/bin/python")

    again = adhoc(repo, args)
    assert (again["changed"], again["decision"]) == (False, "unchanged")

    refused = adhoc(repo, dict(args, packages=["tinypkg>=1.0"]))
    assert refused["failed"] is True
    assert refused["msg"].startswith("package 'tinypkg>=1.0' is not an exact pin: write name==version")

    no_lock = adhoc(repo, {key: value for key, value in args.items() if key != "lock"})
    assert no_lock["failed"] is True
    assert no_lock["msg"] == "missing required arguments: lock"
