"""wheel_cache through Ansible: check mode downloads nothing, a real run fills the cache once, a bad file fails."""
from __future__ import annotations

import json
import os
import subprocess

from test_pip_source_check_module import BIN, adhoc, ansible_env
from test_wheelsource import blob, fake_index, sha256, two_projects, write_lock  # noqa: F401 (fixtures)

TORCH = "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl"
TINY = "tinypkg-1.0-py3-none-any.whl"


def test_ansible_doc_renders_wheel_cache(repo):
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "-M", "library", "wheel_cache"], cwd=repo,
                          env=dict(ansible_env(repo), ANSIBLE_NOCOLOR="1"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    for phrase in ("> MODULE wheel_cache", "HTTP Range request", ".progress.json", "bytes_to_download",
                   "RETURN VALUES", "Downloads and writes nothing"):
        assert phrase in text, phrase


def test_check_mode_then_a_real_run_then_nothing_to_do(repo, two_projects, tmp_path):
    index, lock = two_projects
    dest = tmp_path / "cache" / "wheels"
    args = {"lock": str(lock), "python": "3.10", "platform": "manylinux_2_35_x86_64", "dest": str(dest),
            "retries": 0, "source": {"type": "mirror", "index_url": index.simple, "trusted_host": "127.0.0.1"}}

    checked = adhoc(repo, "wheel_cache", args, "--check")
    assert checked.get("failed") is not True, checked.get("msg")
    assert (checked["changed"], checked["downloaded"], checked["bytes_to_download"]) == (True, [TINY, TORCH], 340_000)
    assert (checked["bytes_downloaded"], checked["files_kept"]) == (0, 0)
    assert not dest.exists() and not index.file_requests()

    filled = adhoc(repo, "wheel_cache", args)
    assert filled.get("failed") is not True, filled.get("msg")
    assert (filled["changed"], filled["files_downloaded"], filled["bytes_downloaded"]) == (True, 2, 340_000)
    assert sorted(os.listdir(dest)) == [".progress.json", TINY, TORCH]
    assert sha256((dest / TORCH).read_bytes()) == sha256(blob(300_000, "t310"))
    progress = json.loads((dest / ".progress.json").read_text())
    assert (progress["state"], progress["files_done"], progress["bytes_done"]) == ("done", 2, 340_000)
    assert filled["progress_file"] == str(dest / ".progress.json")

    written = {name: (dest / name).stat().st_mtime_ns for name in os.listdir(dest)}
    again = adhoc(repo, "wheel_cache", args)
    assert (again["changed"], again["files_kept"], again["bytes_downloaded"]) == (False, 2, 0)
    assert {name: (dest / name).stat().st_mtime_ns for name in os.listdir(dest)} == written
    again_checked = adhoc(repo, "wheel_cache", args, "--check")
    assert (again_checked["changed"], again_checked["downloaded"]) == (False, [])


def test_an_interrupted_run_resumes_on_the_next_one(repo, two_projects, tmp_path):
    index, lock = two_projects
    dest = tmp_path / "cache"
    index.cut[TORCH] = 100_000
    args = {"lock": str(lock), "python": "3.10", "platform": "manylinux_2_35_x86_64", "dest": str(dest),
            "retries": 0, "source": {"type": "mirror", "index_url": index.simple, "trusted_host": "127.0.0.1"}}
    cut = adhoc(repo, "wheel_cache", args)
    assert cut["failed"] is True
    assert f"{TORCH}.part is kept: run again to resume where it stopped" in cut["msg"]
    assert json.loads((dest / ".progress.json").read_text())["state"] == "failed"
    resumed = adhoc(repo, "wheel_cache", args)
    assert (resumed["changed"], resumed["downloaded"], resumed["bytes_downloaded"]) == (True, [TORCH], 200_000)


def test_a_file_that_does_not_match_the_lock_fails_naming_url_and_hashes(repo, fake_index, tmp_path):
    locked = sha256(b"what the lock was made from")
    fake_index.add("tinypkg", TINY, b"what the mirror serves", listed=locked)
    lock = write_lock(tmp_path / "lock.txt", [("tinypkg", "1.0", [locked])])
    dest = tmp_path / "cache"
    result = adhoc(repo, "wheel_cache", {
        "lock": str(lock), "python": "3.10", "platform": "manylinux_2_35_x86_64", "dest": str(dest), "retries": 0,
        "source": {"type": "mirror", "index_url": fake_index.simple, "trusted_host": "127.0.0.1"}})
    assert result["failed"] is True
    assert result["msg"].startswith(f"{fake_index.url}/files/{TINY} does not match the lock: got "
                                    f"sha256:{sha256(b'what the mirror serves')}, the lock has sha256:{locked}")
    assert os.listdir(dest) == [".progress.json"]


def test_a_source_lacking_files_fails_before_downloading(repo, fake_index, tmp_path):
    lock = write_lock(tmp_path / "lock.txt", [("absent", "1.0", [sha256(b"x")])])
    result = adhoc(repo, "wheel_cache", {
        "lock": str(lock), "python": "3.10", "platform": "manylinux_2_35_x86_64", "dest": str(tmp_path / "c"),
        "retries": 0, "source": {"type": "mirror", "index_url": fake_index.simple, "trusted_host": "127.0.0.1"}})
    assert result["failed"] is True and result["ok"] is False
    assert [p["requirement"] for p in result["problems"]] == ["absent==1.0"]
    assert "HTTP 404" in result["msg"]
    assert not (tmp_path / "c").exists()
