"""vllm_release, vllm_release_info and vllm_venv_spec through Ansible: ansible-doc renders them; a play on localhost
queries, promotes, rolls back (check mode writes nothing), prunes venvs, reads the hand-over report and the servers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from test_release import _plan_json

BIN = os.path.dirname(sys.executable)


def run_play(repo, tmp_path, tasks: str, *flags: str):
    play = tmp_path / "play.yml"
    play.write_text(textwrap.dedent("""\
        - name: Releases
          hosts: localhost
          gather_facts: false
          tasks:
        """) + textwrap.indent(textwrap.dedent(tasks), "    "))
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play),
                           *flags], cwd=repo, env=env, capture_output=True, text=True, timeout=180)
    results = json.loads(proc.stdout)["plays"][0]["tasks"]
    return proc.returncode, [task["hosts"]["localhost"] for task in results]


@pytest.fixture
def plan_file(tmp_path, tmp_path_factory, repo, monkeypatch):
    monkeypatch.chdir(repo)
    path = tmp_path / "plan.json"
    path.write_text(_plan_json(str(tmp_path_factory.getbasetemp() / "release-plan"), True))
    return path


@pytest.mark.parametrize("module,texts", [
    ("vllm_release_info", ("A release is a vLLM venv, a model revision", "rollback", "target", "failed_release",
                           "servers", "RETURN VALUES")),
    ("vllm_release", ("current", "failure", "keep", "RETURN VALUES")),
    ("vllm_venv_spec", ("exact pins", "flash_attention_excluded", "RETURN VALUES")),
    ("vllm_journal_info", ("since_usec", "redact", "RETURN VALUES")),
])
def test_ansible_doc_renders_the_release_modules(repo, module, texts):
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "-M", "library", module], cwd=repo,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for text in texts:
        assert text in proc.stdout, text


def test_query_promote_and_rollback_through_ansible(repo, tmp_path, plan_file):
    record = tmp_path / "releases.json"
    venv = tmp_path / "venvs/0.5.4-1a2b3c4d"
    code, results = run_play(repo, tmp_path, f"""\
        - name: Query
          vllm_release_info:
            path: {record}
            plan: "{{{{ lookup('ansible.builtin.file', '{plan_file}') | from_json }}}}"
            venv: {venv}
          register: first
        - name: Promote
          vllm_release:
            path: {record}
            current: "{{{{ first.desired }}}}"
        - name: Promote again
          vllm_release:
            path: {record}
            current: "{{{{ first.desired }}}}"
        - name: Query again
          vllm_release_info:
            path: {record}
            plan: "{{{{ lookup('ansible.builtin.file', '{plan_file}') | from_json }}}}"
            venv: {venv}
        - name: Target after a failed warm-up of the only release
          vllm_release_info:
            path: {record}
        """)
    assert code == 0, results
    query, promoted, again, second, target = results
    assert (query["changed"], query["is_current"], query["current"]) == (False, False, None)
    assert query["desired"]["python"] == f"{venv}/bin/python"
    assert [r["unit"] for r in query["desired"]["replicas"]] == ["vllm-0.service", "vllm-1.service"]
    assert promoted["changed"] is True and again["changed"] is False
    assert json.loads(record.read_text())["current"]["id"] == query["desired"]["id"]
    assert (second["is_current"], second["stale_units"]) == (True, [])
    assert target["rollback"]["target"] is None and target["rollback"]["failed_release"]["id"] == query["desired"]["id"]


def test_rolled_back_in_check_mode_writes_nothing(repo, tmp_path):
    record = tmp_path / "releases.json"
    release = {"id": "aaaaaaaaaaaa", "vllm_version": "0.5.4", "venv": "/v/a", "model": {"path": "/m"}, "args": [],
               "replicas": [{"unit": "vllm-0.service"}]}
    record.write_text(json.dumps({"schema": 1, "current": release, "previous": None, "last_failure": None}))
    before = record.read_text()
    code, results = run_play(repo, tmp_path, f"""\
        - name: Record a rollback
          vllm_release:
            path: {record}
            current: {json.dumps(release)}
            failure:
              release: {json.dumps(dict(release, id="bbbbbbbbbbbb"))}
              serving: true
              message: vllm-0.service failed
        """, "--check", "--diff")
    assert code == 0, results
    assert results[0]["changed"] is True
    assert results[0]["last_failure"]["release"]["id"] == "bbbbbbbbbbbb"
    assert '"restored": "aaaaaaaaaaaa"' in results[0]["diff"]["after"]
    assert record.read_text() == before


def test_prune_keeps_the_newest_and_the_recorded_venvs(repo, tmp_path):
    root = tmp_path / "venvs"
    for age, name in enumerate(["old-current", "a", "b", "c", "newest"]):
        (root / name).mkdir(parents=True)
        os.utime(root / name, (1_700_000_000 + age, 1_700_000_000 + age))
    record = tmp_path / "releases.json"
    record.write_text(json.dumps({"schema": 1, "current": {"id": "x", "venv": str(root / "old-current")},
                                  "previous": None, "last_failure": None}))
    code, results = run_play(repo, tmp_path, f"""\
        - name: Prune in check mode
          vllm_release:
            path: {record}
            venvs_root: {root}
            keep: 2
          check_mode: true
        - name: Prune
          vllm_release:
            path: {record}
            venvs_root: {root}
            keep: 2
            protect: ["{root / 'a'}"]
        """)
    assert code == 0, results
    assert results[0]["removed"] == [str(root / "a"), str(root / "b")]
    assert results[1]["removed"] == [str(root / "b")]
    assert sorted(p.name for p in root.iterdir()) == ["a", "c", "newest", "old-current"]


def fake_python(tmp_path, version: str) -> str:
    """An interpreter stand-in that reports `version` whatever it is asked."""
    path = tmp_path / f"python-{version}"
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return str(path)


def test_venv_spec_checks_the_interpreter_against_the_python_pin(repo, tmp_path, plan_file):
    debian, too_new = fake_python(tmp_path, "3.11.2"), fake_python(tmp_path, "3.13.0")
    code, results = run_play(repo, tmp_path, f"""\
        - name: Spec on Debian 12's Python
          vllm_venv_spec:
            plan: "{{{{ lookup('ansible.builtin.file', '{plan_file}') | from_json }}}}"
            python: {debian}
        - name: Spec on a Python newer than 0.8.5.post1 supports
          vllm_venv_spec:
            plan: "{{{{ lookup('ansible.builtin.file', '{plan_file}') | from_json }}}}"
            python: {too_new}
          ignore_errors: true
        """)
    spec, refused = results
    assert spec["packages"] == ["torch==2.6.0", "vllm==0.8.5.post1", "xformers==0.0.29.post2"]
    assert (spec["python_version"], spec["python_minor"], spec["flash_attention_excluded"]) == ("3.11.2", "3.11", True)
    assert spec["name"].startswith("0.8.5.post1-") and len(spec["name"]) == len("0.8.5.post1-") + 8
    assert spec["notes"] == []  # 0.8.5.post1 pins no FlashAttention package (0.5.4's vllm-flash-attn: test_release.py)
    assert refused["failed"] is True
    assert refused["msg"] == (f"vLLM 0.8.5.post1 needs Python >=3.9,<3.13; {too_new} on {os.uname().nodename} is "
                              "3.13.0. Set vllm_runtime_python to a matching interpreter")


def test_release_info_reads_the_report_names_the_servers_and_the_rollback_target(repo, tmp_path):
    record, report = tmp_path / "releases.json", tmp_path / "handover.json"
    current = {"id": "bbbbbbbbbbbb", "venv": "/v/b", "replicas": [{"name": "vllm-0"}, {"name": "vllm-1"}]}
    previous = {"id": "aaaaaaaaaaaa", "venv": "/v/a", "replicas": [{"name": "vllm-0"}]}
    record.write_text(json.dumps({"schema": 1, "current": current, "previous": previous, "last_failure": None}))
    report.write_text(json.dumps({"schema": 1, "replicas": {"vllm-0": {"passed": True}}}))
    code, results = run_play(repo, tmp_path, f"""\
        - name: Read with the node's name
          vllm_release_info:
            path: {record}
            report_path: {report}
            node: node1
        - name: Read without a report, for a release being switched to
          vllm_release_info:
            path: {record}
            report_path: {tmp_path / 'none.json'}
            failed_id: cccccccccccc
        """, "--check")
    assert code == 0, results
    named, bare = results
    assert named["changed"] is False and named["servers"] == ["node1-vllm-0", "node1-vllm-1"]
    assert named["report"]["replicas"]["vllm-0"]["passed"] is True
    assert named["rollback"] == {"target": previous, "failed_release": current}
    assert (bare["servers"], bare["report"]) == ([], None)
    assert bare["rollback"] == {"target": current, "failed_release": None}


def test_a_promotion_with_keep_protects_the_new_current_and_previous_venvs(repo, tmp_path):
    root = tmp_path / "venvs"
    for age, name in enumerate(["older", "a", "b", "newest"]):
        (root / name).mkdir(parents=True)
        os.utime(root / name, (1_700_000_000 + age, 1_700_000_000 + age))
    record = tmp_path / "releases.json"
    record.write_text(json.dumps({"schema": 1, "current": {"id": "a", "venv": str(root / "older")},
                                  "previous": None, "last_failure": None}))
    code, results = run_play(repo, tmp_path, f"""\
        - name: Promote b and keep one venv
          vllm_release:
            path: {record}
            current: {{id: b, venv: "{root / 'b'}"}}
            venvs_root: {root}
            keep: 1
        """, "--diff")
    assert code == 0, results
    assert results[0]["changed"] is True and results[0]["previous"]["id"] == "a"
    assert results[0]["removed"] == [str(root / "a")]
    assert sorted(p.name for p in root.iterdir()) == ["b", "newest", "older"]
