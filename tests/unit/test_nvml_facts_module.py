"""library/nvml_facts.py through Ansible itself: its docs render, and a real `ansible localhost -m nvml_facts`
run against the fake NVML returns the facts, saves them once, stays unchanged after, honours check mode."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def fakenvml() -> Path:
    subprocess.run(["make", "-s", "-C", str(REPO / "lab" / "fakenvml")], check=True, capture_output=True)
    return REPO / "lab" / "fakenvml"


def ansible_env(fakenvml: Path, profile: str) -> dict[str, str]:
    return dict(os.environ, LD_LIBRARY_PATH=str(fakenvml), FAKE_NVML_PROFILE=str(REPO / "lab" / "profiles" / profile),
                ANSIBLE_CACHE_PLUGIN="memory", FAKE_NVML_UTILIZATION="/nonexistent/utilization.json", ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACK_RESULT_FORMAT="yaml")


def run_module(env: dict[str, str], *args: str) -> tuple[str, dict, subprocess.CompletedProcess]:
    """`ansible localhost -m nvml_facts ...` -> (CHANGED/SUCCESS/FAILED!, the result, the process)."""
    done = subprocess.run(
        [str(BIN / "ansible"), "localhost", "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-m", "nvml_facts", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    head, _, body = done.stdout.partition("=>")
    status = head.split("|")[-1].strip()
    return status, yaml.safe_load(body) or {}, done


def test_ansible_doc_renders_the_module_documentation() -> None:
    done = subprocess.run([str(BIN / "ansible-doc"), "-M", "library", "nvml_facts"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
    assert done.returncode == 0, done.stderr
    assert "> MODULE nvml_facts" in done.stdout
    assert "Reads the node's GPUs through unmodified" in " ".join(done.stdout.split())
    for text in ("facts_path", "check_mode", "EXAMPLES", "/var/lib/revive/gpu-facts.json", "slowest_path",
                 "RETURN VALUES"):
        assert text in done.stdout, text


def test_module_returns_facts_saves_them_once_and_honours_check_mode(fakenvml: Path, tmp_path: Path) -> None:
    env = ansible_env(fakenvml, "v100-pcie-8x-degraded.json")
    saved = tmp_path / "var" / "lib" / "revive" / "gpu-facts.json"

    status, result, done = run_module(env, "-a", f"facts_path={saved}")
    assert status == "CHANGED", done.stdout + done.stderr
    gpu = result["ansible_facts"]["gpu"]
    assert result["gpu"] == gpu
    assert result["facts_path"] == str(saved)
    assert (gpu["simulated"], gpu["count"], gpu["summary"]["slowest_path"]) == (True, 8, "SYS")
    assert gpu["devices"][6]["processes"][0]["pid"] == 48213
    assert json.loads(saved.read_text()) == gpu
    assert oct(saved.stat().st_mode & 0o777) == "0o644"

    # `bin/revive gpus --json` prints exactly what the module returned under `gpu`.
    cli = subprocess.run([sys.executable, str(REPO / "bin" / "revive"), "gpus", "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert json.loads(cli.stdout) == gpu

    before = saved.stat().st_mtime_ns
    status, result, done = run_module(env, "-a", f"facts_path={saved}")
    assert (status, result["changed"]) == ("SUCCESS", False), done.stdout
    assert saved.stat().st_mtime_ns == before

    other = tmp_path / "check" / "gpu-facts.json"
    status, result, done = run_module(env, "--check", "--diff", "-a", f"facts_path={other}")
    assert status == "CHANGED", done.stdout
    assert not other.exists() and not other.parent.exists()


def test_module_failure_says_what_where_and_how(fakenvml: Path, tmp_path: Path) -> None:
    env = ansible_env(fakenvml, "v100-pcie-8x.json")
    env["FAKE_NVML_PROFILE"] = str(tmp_path / "missing.json")
    status, result, done = run_module(env)
    assert status == "FAILED!", done.stdout
    assert result["msg"].startswith("NVML initialisation failed on ")
    assert f"the library said: fakenvml: cannot read GPU profile {tmp_path}/missing.json: No such file" in result["msg"]
