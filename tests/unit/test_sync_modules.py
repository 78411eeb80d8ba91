"""The model_* modules through Ansible itself, on temp dirs: docs render, a full sync runs, reruns change nothing."""
from __future__ import annotations

import grp
import json
import os
import subprocess
import sys

import yaml
from fixtures.models import write_model

BIN = os.path.dirname(sys.executable)
MODULES = ("model_manifest", "model_preflight", "model_stage", "model_convert", "model_promote")
GROUP = grp.getgrgid(os.getgid()).gr_name


def _env(repo):
    return dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
                ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable)


def run_playbook(repo, playbook, *args):
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
                           *args], cwd=repo, env=_env(repo), capture_output=True, text=True, timeout=300)
    output = json.loads(proc.stdout)
    tasks = {task["task"]["name"]: task["hosts"]["localhost"] for task in output["plays"][0]["tasks"]}
    return proc.returncode, tasks, output["stats"]["localhost"]


def test_ansible_doc_renders_every_module(repo):
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "-M", "library", *MODULES], cwd=repo,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for module in MODULES:
        assert f"MODULE {module}" in proc.stdout.replace("\x1b[1m", "").replace("\x1b[0m", "")
    assert proc.stdout.count("RETURN VALUES") == len(MODULES) and proc.stdout.count("EXAMPLES") == len(MODULES)


def _sync_playbook(tmp_path, source, dest):
    tasks = [
        {"name": "manifest", "model_manifest": {"path": source}, "register": "src"},
        {"name": "preflight", "model_preflight": {"dest": dest, "manifest": "{{ src.manifest }}",
                                                  "convert_bf16": True, "allowed_dtypes": ["F16"],
                                                  "free_space_margin_bytes": 0},
         "register": "pre"},
        {"name": "stage", "model_stage": {"dest": dest, "manifest": "{{ src.manifest }}", "src_path": source,
                                          "convert_bf16": True, "allowed_dtypes": ["F16"]},
         "when": "not pre.up_to_date"},
        {"name": "convert", "model_convert": {"dest": dest, "source_content_id": "{{ src.manifest.content_id }}",
                                              "overflow": "clamp"},
         "when": "not pre.up_to_date and pre.convert_bf16"},
        {"name": "promote", "model_promote": {"dest": dest, "source_content_id": "{{ src.manifest.content_id }}",
                                              "converted": "{{ pre.convert_bf16 }}", "group": GROUP}},
    ]
    playbook = tmp_path / "sync.yml"
    playbook.write_text(yaml.safe_dump([{"name": "sync", "hosts": "localhost", "gather_facts": False,
                                         "tasks": tasks}]))
    return playbook


def test_full_sync_with_conversion_then_idempotent_then_check_mode_clean(repo, tmp_path):
    source = write_model(str(tmp_path / "store" / "qwen2" / "rev1"), "qwen2-7b-instruct", dtype="BF16", shards=2)
    dest = str(tmp_path / "data" / "models" / "qwen2" / "rev1")
    playbook = _sync_playbook(tmp_path, source, dest)

    rc, tasks, stats = run_playbook(repo, playbook)
    assert rc == 0, tasks
    assert tasks["manifest"]["created"] and tasks["preflight"]["convert_bf16"]
    assert tasks["stage"]["verified"] and tasks["convert"]["report"]["config_keys_rewritten"] == ["torch_dtype"]
    assert tasks["promote"]["promoted_from"].endswith("/.rev1.converting")
    with open(os.path.join(dest, "config.json")) as handle:
        assert json.load(handle)["torch_dtype"] == "float16"
    assert os.readlink(os.path.join(os.path.dirname(dest), "current")) == "rev1"
    assert sorted(os.listdir(os.path.dirname(dest))) == ["current", "rev1"]

    rc, tasks, stats = run_playbook(repo, playbook)
    assert rc == 0 and stats["changed"] == 0, tasks
    assert tasks["preflight"]["up_to_date"] and tasks["stage"]["skipped"]

    rc, tasks, stats = run_playbook(repo, playbook, "--check", "--diff")
    assert rc == 0 and stats["changed"] == 0, tasks


def test_check_mode_on_a_fresh_node_predicts_the_sync_and_writes_nothing(repo, tmp_path):
    source = write_model(str(tmp_path / "store" / "qwen2" / "rev1"), "qwen2-7b-instruct", dtype="BF16", shards=2)
    dest = str(tmp_path / "data" / "models" / "qwen2" / "rev1")
    rc, tasks, stats = run_playbook(repo, _sync_playbook(tmp_path, source, dest), "--check", "--diff")
    assert rc == 0, tasks
    assert tasks["stage"]["changed"] and tasks["convert"]["changed"] and tasks["promote"]["changed"]
    assert not os.path.exists(os.path.join(source, "revive-manifest.json"))
    assert not os.path.exists(str(tmp_path / "data"))


def test_refusal_is_a_failed_task_with_the_message(repo, tmp_path):
    source = write_model(str(tmp_path / "m"), "llama-2-7b-chat", dtype="BF16", shards=1)
    playbook = tmp_path / "refuse.yml"
    playbook.write_text(yaml.safe_dump([{"name": "refuse", "hosts": "localhost", "gather_facts": False, "tasks": [
        {"name": "manifest", "model_manifest": {"path": source}, "register": "src"},
        {"name": "preflight", "model_preflight": {"dest": str(tmp_path / "d" / "rev1"), "manifest": "{{ src.manifest }}"}},
    ]}]))
    rc, tasks, _ = run_playbook(repo, playbook)
    assert rc != 0
    assert tasks["preflight"]["failed"]
    assert tasks["preflight"]["msg"].startswith("the model has BF16 weights (model.safetensors) but the GPUs of ")
