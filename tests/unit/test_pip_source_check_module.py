"""pip_source_check through Ansible: `ansible localhost -m pip_source_check` against the loopback fake index."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from test_wheelsource import fake_index, sha256, two_projects, write_lock  # noqa: F401 (fixtures)

BIN = os.path.dirname(sys.executable)


def ansible_env(repo) -> dict:
    return dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
                ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
                ANSIBLE_CACHE_PLUGIN="memory")


def adhoc(repo, module: str, args: dict, *flags: str) -> dict:
    proc = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-c", "local", "-i", "localhost,",
                           "-m", module, "-a", json.dumps(args), *flags],
                          cwd=repo, env=ansible_env(repo), capture_output=True, text=True, timeout=300)
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_ansible_doc_renders_pip_source_check(repo):
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "-M", "library", "pip_source_check"], cwd=repo,
                          env=dict(ansible_env(repo), ANSIBLE_NOCOLOR="1"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    for phrase in ("> MODULE pip_source_check", "sdists never count", "manylinux2014", "trusted_host",
                   "RETURN VALUES", "Never changes anything"):
        assert phrase in text, phrase


def test_the_check_passes_in_check_mode_and_for_real_and_changes_nothing(repo, two_projects):
    index, lock = two_projects
    args = {"lock": str(lock), "python": "3.10", "platform": "x86_64-manylinux_2_35", "retries": 0,
            "source": {"type": "mirror", "index_url": index.simple, "trusted_host": "127.0.0.1"}}
    for flags in (("--check",), ()):
        result = adhoc(repo, "pip_source_check", args, *flags)
        assert result.get("failed") is not True, result.get("msg")
        assert (result["changed"], result["ok"], result["checked"], result["problems"]) == (False, True, 2, [])
        assert result["target"] == "CPython 3.10 on manylinux_2_35_x86_64"
        files = {f["requirement"]: f for f in result["files"]}
        assert files["torch==2.6.0"]["filename"] == "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl"
        assert files["torch==2.6.0"]["size"] == 300_000
    assert not index.file_requests()


def test_the_check_fails_with_every_problem_at_once(repo, fake_index, tmp_path):
    fake_index.add("torch", "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl", b"another build")
    fake_index.add("pyairports", "pyairports-2.1.1.tar.gz", b"sdist")
    lock = write_lock(tmp_path / "lock.txt", [("torch", "2.6.0", [sha256(b"locked build")]),
                                              ("pyairports", "2.1.1", [sha256(b"sdist")])],
                      missing=("outlines-core==0.1.0 -- no wheel for 3.10",))
    result = adhoc(repo, "pip_source_check", {
        "lock": str(lock), "python": "3.10", "platform": "manylinux_2_35_x86_64", "retries": 0,
        "source": {"type": "mirror", "index_url": fake_index.simple, "trusted_host": "127.0.0.1"}})
    assert result["failed"] is True
    assert [p["requirement"] for p in result["problems"]] == ["outlines-core==0.1.0", "torch==2.6.0",
                                                              "pyairports==2.1.1"]
    assert result["msg"].startswith(f"mirror {fake_index.simple} cannot serve the lock {lock} for CPython 3.10 on "
                                    "manylinux_2_35_x86_64: 3 problem(s) in 2 entries:\n- ")
    assert result["msg"].count("\n- ") == 3
    assert f"no wheel of torch==2.6.0 with a locked hash at {fake_index.simple}/torch/ (offered: 1 wheel(s)" in \
        result["msg"]
    assert "`bin/revive lock 0.5.4 --supply DIR`" in result["msg"]


def test_unusable_inputs_fail_naming_them(repo, tmp_path):
    missing = adhoc(repo, "pip_source_check", {"lock": str(tmp_path / "absent.txt"), "python": "3.10",
                                               "platform": "manylinux_2_35_x86_64"})
    assert missing["failed"] is True
    assert missing["msg"].startswith(f"cannot read the lock {tmp_path / 'absent.txt'} on ")
    lock = write_lock(tmp_path / "lock.txt", [("tinypkg", "1.0", [sha256(b"x")])])
    plain = adhoc(repo, "pip_source_check", {"lock": str(lock), "python": "3.10", "platform": "manylinux_2_35_x86_64",
                                             "source": {"type": "mirror", "index_url": "http://mirror.invalid/simple"}})
    assert plain["failed"] is True
    assert plain["msg"].startswith("http://mirror.invalid/simple is plain http and mirror.invalid is not the trusted "
                                   "host (none set)")
    bad = adhoc(repo, "pip_source_check", {"lock": str(lock), "python": "3.10", "platform": "linux_x86_64"})
    assert bad["failed"] is True and "is not a manylinux platform" in bad["msg"]
