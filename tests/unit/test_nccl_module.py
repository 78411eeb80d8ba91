"""nccl_check through Ansible (`ansible localhost -m nccl_check`): the docs render, check mode starts nothing, the
refusals' messages, and the one real run - the real rank program in a real torch, gloo on CPU processes.

The torch interpreter (fixture torch_python), in this order: $REVIVE_TORCH_PYTHON (it must work, or the test
fails saying so); a release venv that `make check-runtime` left (/var/tmp/revive-check/vllm-*/bin/python, the
release's own torch); /var/tmp/revive-nccl/torch-2.13.0, built here if missing with Python 3.11 and
`pip install torch==2.13.0` (the CPU build that lies on the project machines' disk, so no large download). If
none can be had the test fails with what to do; it is never skipped.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from fixtures.models import write_model

BIN = os.path.dirname(sys.executable)
TORCH_PYTHON_ENV = "REVIVE_TORCH_PYTHON"
RELEASE_VENVS = "/var/tmp/revive-check/vllm-*/bin/python"
BUILT_VENV = Path("/var/tmp/revive-nccl/torch-2.13.0")
TORCH_PIN = "torch==2.13.0"
GLOO_PROBE = ("import torch, torch.distributed as d; assert d.is_available() and d.is_gloo_available(), "
              "'torch.distributed has no gloo'; print(torch.__version__)")


def torch_error(python: str) -> Optional[str]:
    """None when `python` runs torch.distributed with gloo, else why not."""
    try:
        proc = subprocess.run([python, "-c", GLOO_PROBE], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    if proc.returncode == 0:
        return None
    return (proc.stderr or proc.stdout).strip()[-400:] or f"exit status {proc.returncode}"


def build_torch_venv() -> str:
    python = BUILT_VENV / "bin" / "python"
    base = shutil.which("python3.11")
    if base is None:
        pytest.fail(f"no interpreter with torch for the gloo run: set {TORCH_PYTHON_ENV} to a python with torch, or "
                    f"install Python 3.11 so that this test can build {BUILT_VENV} with `pip install {TORCH_PIN}`")
    steps = [[base, "-m", "venv", "--clear", str(BUILT_VENV)],
             [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", TORCH_PIN]]
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            pytest.fail(f"building the torch venv for the gloo run failed at `{' '.join(step)}`: "
                        f"{(proc.stderr or proc.stdout).strip()[-800:]}; set {TORCH_PYTHON_ENV} to a python with torch")
    return str(python)


@pytest.fixture(scope="session")
def torch_python() -> str:
    chosen = os.environ.get(TORCH_PYTHON_ENV)
    if chosen:
        error = torch_error(chosen)
        if error:
            pytest.fail(f"{TORCH_PYTHON_ENV}={chosen} cannot run torch.distributed with gloo: {error}")
        return chosen
    for candidate in sorted(glob.glob(RELEASE_VENVS)) + [str(BUILT_VENV / "bin" / "python")]:
        if os.access(candidate, os.X_OK) and torch_error(candidate) is None:
            return candidate
    python = build_torch_venv()
    error = torch_error(python)
    if error:
        pytest.fail(f"{python} was built but cannot run torch.distributed with gloo: {error}")
    return python


def ansible_env(repo) -> dict:
    return dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
                ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable)


def adhoc(repo, args: dict, *flags: str) -> dict:
    proc = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-c", "local", "-i", "localhost,",
                           "-m", "nccl_check", "-a", json.dumps(args), *flags],
                          cwd=repo, env=ansible_env(repo), capture_output=True, text=True, timeout=600)
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, repo) -> list:
    """The planner's replicas for the notes' 20B on the 8x V100 PCIe box: 2 x TP 4, P2P and SHM disabled."""
    model = write_model(str(tmp_path_factory.mktemp("models") / "chat-20b"), "internlm2-chat-20b", dtype="F16",
                        config_only=True)
    proc = subprocess.run([sys.executable, str(repo / "bin" / "revive"), "plan", "--model", model, "--gpus",
                           "v100-pcie-8x", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["replicas"]


def test_ansible_doc_renders_nccl_check(repo):
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "-M", "library", "nccl_check"], cwd=repo,
                          env=dict(ansible_env(repo), ANSIBLE_NOCOLOR="1"), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "busbw = algbw * 2(n-1)/n" in text and "ACSCtl" in text and "compare_margin" in text


def test_check_mode_reports_the_processes_and_their_environment_and_runs_nothing(repo, replicas, tmp_path):
    marker = tmp_path / "ran"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ntouch {marker}\n")
    python.chmod(0o755)
    result = adhoc(repo, {"replicas": replicas, "python": str(python), "backend": "gloo", "compare": True}, "--check")
    assert result.get("failed") is not True, result.get("msg")
    assert not marker.exists() and result["changed"] is False and result["simulated"] is True
    assert [len(run["argv"]) for entry in result["would_run"] for run in entry["runs"]] == [4, 4, 4, 4]
    first = result["would_run"][0]["runs"][0]
    assert first["env"] == dict(replicas[0]["env"], NCCL_DEBUG="INFO")
    assert first["argv"][0] == [str(python), "-u", "WORKER", "SPEC", "0"]
    assert "check mode: nothing started; would run 16 rank process(es)" in result["msg"]


@pytest.mark.parametrize("args, message", [
    ({"python": "/nonexistent/venv/bin/python"}, "nccl_check cannot run: the release venv's python "
                                                 "/nonexistent/venv/bin/python does not exist"),
    ({"sizes": ["1TB"]}, "nccl_check cannot run: size '1TB' is not bytes or N KiB/MiB/GiB"),
    ({"sizes": ["6"]}, "size '6' = 6 bytes: it must be a positive multiple of 4 (float32)"),
])
def test_refusals_say_what_and_how_to_fix(repo, replicas, args, message):
    result = adhoc(repo, dict({"replicas": replicas, "python": sys.executable, "backend": "gloo"}, **args))
    assert result["failed"] is True and message in result["msg"]


def test_the_real_worker_on_gloo_measures_every_size_and_compares(repo, replicas, torch_python):
    result = adhoc(repo, {"replicas": replicas[:1], "python": torch_python, "backend": "gloo", "compare": True,
                          "compare_margin": 50, "sizes": ["64KiB", "1MiB"], "iterations": 3, "warmup": 1,
                          "timeout": 240})
    assert result.get("failed") is not True, result.get("msg")
    assert result["ok"] is True and result["simulated"] is True and result["backend"] == "gloo"
    (entry,) = result["replicas"]
    run = entry["run"]
    assert entry["world_size"] == 4 and [r["phase"] for r in run["ranks"]] == ["done"] * 4
    assert run["versions"]["torch"] == torch_error_free_version(torch_python)
    assert [row["bytes"] for row in run["sizes"]] == [64 << 10, 1 << 20]
    for row in run["sizes"]:
        assert row["algbw_gbps"] > 0 and row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 1.5, abs=2e-3)
    assert entry["compare"]["ok"] is True and entry["compare"]["verdict"] == "no_difference"
    assert "NCCL_P2P_DISABLE" not in entry["compare"]["env"] and run["env"]["NCCL_P2P_DISABLE"] == "1"
    assert result["warning_messages"] == []
    assert "not applied, the GPUs are simulated" in entry["placement"]["notes"][0]


def torch_error_free_version(python: str) -> str:
    return subprocess.run([python, "-c", GLOO_PROBE], capture_output=True, text=True, check=True).stdout.strip()


def test_the_real_worker_killed_at_its_deadline_fails_the_module_with_the_phase(repo, replicas, torch_python):
    result = adhoc(repo, {"replicas": replicas[:1], "python": torch_python, "backend": "gloo", "timeout": 0.5})
    assert result["failed"] is True and result["ok"] is False
    assert "vllm-0 (GPUs [0, 1, 2, 3]): the all-reduce did not finish within the 0.5 s deadline: rank(s) [0, 1, 2, " \
           "3] were killed in phase" in result["msg"]
    ranks = result["replicas"][0]["run"]["ranks"]
    # Half a second: python has started (phase start) or is importing torch (phase import), never further.
    assert [r["rc"] for r in ranks] == [-9] * 4 and {r["phase"] for r in ranks} <= {"start", "import"}
