"""The model_inspect module through Ansible itself: ansible-doc renders it, an ad-hoc run returns facts."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from fixtures.models import write_model

BIN = os.path.dirname(sys.executable)


def run_ansible(repo, module, args):
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-i", "localhost,", "-c", "local",
                           "-m", module, "-a", args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=120)
    result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return proc.returncode, result


def test_ansible_doc_renders_model_inspect(repo):
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "-M", "library", "model_inspect"], cwd=repo,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for text in ("A model directory (Hugging Face layout)", "num_key_value_heads", "RETURN VALUES",
                 "Plan from a bare config.json"):
        assert text in proc.stdout


def test_ad_hoc_run_returns_model_facts(repo, tmp_path):
    path = write_model(str(tmp_path / "chat-20b-fp16"), "internlm2-chat-20b", dtype="F16")
    rc, result = run_ansible(repo, "model_inspect", f"path={path}")
    assert rc == 0
    assert result["changed"] is False
    assert result["model"]["architecture"] == "InternLM2ForCausalLM"
    assert result["model"]["dtypes"] == ["F16"]
    assert len(result["model"]["shards"]) == 2


def test_ad_hoc_run_fails_with_the_file_and_fix(repo, tmp_path):
    path = write_model(str(tmp_path / "m"), "llama-2-7b-chat")
    os.remove(os.path.join(path, "model-00002-of-00002.safetensors"))
    rc, result = run_ansible(repo, "model_inspect", f"path={path}")
    assert rc != 0
    assert result["failed"] is True
    assert result["msg"].startswith(f"{path}/model-00002-of-00002.safetensors: missing shard listed in ")
