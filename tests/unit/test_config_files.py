"""config_files (library/config_files.py, module_utils/revive_config_files.py): a role's files in one module run.

The pure part on a temporary directory (parse's refusals, writes, attributes, removal, check mode, validate, no
window in which a root-only file is readable), then the module through ansible-playbook: the same task twice
changes nothing the second time, check mode changes nothing on disk, a template lookup's content is byte-identical to
what ansible.builtin.template writes, and one run of the module keeps several files.
"""
from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.revive_config_files import (ConfigFileError, Directory, File, Outcome, apply,
                                                         parse)

BIN = os.path.dirname(sys.executable)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def entry(dest: Path, content: str | None = "a\n", **extra) -> dict:
    return {"dest": str(dest), "content": content, "owner": "root", "group": "root", "mode": "0644", **extra}


# --- parse: every mistake refused before anything is touched -----------------------------------------------------

@pytest.mark.parametrize("directories, files, words", [
    ([], [{"dest": "relative/x", "content": "a", "owner": "root", "group": "root", "mode": "0644"}],
     ["files[0]", "dest", "absolute"]),
    ([], [{"dest": "/etc/x/", "content": "a", "owner": "root", "group": "root", "mode": "0644"}],
     ["trailing slash"]),
    ([], [{"dest": "/etc/../x", "content": "a", "owner": "root", "group": "root", "mode": "0644"}], [".."]),
    ([], [{"dest": "/etc/x", "content": "a", "owner": "root", "group": "root", "mode": "644"}], []),
    ([], [{"dest": "/etc/x", "content": "a", "owner": "root", "group": "root", "mode": 420}],
     ["mode is 420", "quoted"]),
    ([], [{"dest": "/etc/x", "content": "a", "owner": "root", "group": "root", "mode": "0o644"}],
     ["files[0] (/etc/x)", "mode", "octal"]),
    ([], [{"dest": "/etc/x", "content": "a", "owner": "root", "group": "root", "mode": "0999"}], ["octal"]),
    ([{"path": "/etc/d", "owner": "root", "group": "root", "mode": "rwx"}], [], ["directories[0]", "octal"]),
    ([], [{"dest": "/etc/x", "content": None, "owner": "root", "group": "root", "mode": "0644"}],
     ["content is missing", "state: absent"]),
    ([], [{"dest": "/etc/x", "content": "a", "state": "absent", "owner": "root", "group": "root", "mode": "0644"}],
     ["absent but content"]),
    ([], [{"dest": "/etc/x", "content": "a", "validate": "haproxy -c -f", "owner": "root", "group": "root",
           "mode": "0644"}], ["validate", "%s"]),
    ([], [{"dest": "/etc/x", "content": "x" * (1024 * 1024 + 1), "owner": "root", "group": "root", "mode": "0644"}],
     ["more than", "ansible.builtin.copy"]),
    ([], [{"dest": "/etc/x", "content": "a", "owner": "root", "group": "root", "mode": "0644"},
          {"dest": "/etc/x", "content": "b", "owner": "root", "group": "root", "mode": "0644"}],
     ["/etc/x given more than once"]),
    ([], [{"dest": "/etc/x", "name": "n", "content": "a", "owner": "root", "group": "root", "mode": "0644"},
          {"dest": "/etc/y", "name": "n", "content": "b", "owner": "root", "group": "root", "mode": "0644"}],
     ["name", "n given more than once"]),
])
def test_parse_refuses_each_mistake_naming_the_entry(directories, files, words):
    if not words:   # "644" is an octal string: taken as 0o644, as copy takes it
        assert parse(directories, files)[1][0].mode == int(files[0]["mode"], 8)
        return
    with pytest.raises(ConfigFileError) as error:
        parse(directories, files)
    for word in words:
        assert word in str(error.value)


# --- apply on a directory ------------------------------------------------------------------------------------------

def test_writes_then_changes_nothing_then_rewrites_only_what_differs(tmp_path):
    directories, files = parse([{"path": str(tmp_path / "etc/sub"), "owner": "root", "group": "root",
                                 "mode": "0750"}],
                               [entry(tmp_path / "etc/sub/a.conf", "one\n", name="a"),
                                entry(tmp_path / "etc/sub/b.conf", "two\n", mode="0600", name="b")])
    first = apply(directories, files)
    assert first.changed and first.files["a"]["changed"] and first.files["b"]["changed"]
    assert (tmp_path / "etc/sub/a.conf").read_text() == "one\n"
    assert mode_of(tmp_path / "etc/sub") == 0o750 and mode_of(tmp_path / "etc/sub/b.conf") == 0o600
    second = apply(directories, files)
    assert not second.changed and second.actions == [] and not second.files["a"]["changed"]

    (tmp_path / "etc/sub/a.conf").chmod(0o666)
    (tmp_path / "etc/sub").chmod(0o755)
    third = apply(*parse([{"path": str(tmp_path / "etc/sub"), "owner": "root", "group": "root", "mode": "0750"}],
                         [entry(tmp_path / "etc/sub/a.conf", "one\n", name="a"),
                          entry(tmp_path / "etc/sub/b.conf", "TWO\n", mode="0600", name="b")]))
    assert third.files["a"]["changed"] and third.files["b"]["changed"]
    assert third.actions == [f"set mode of directory {tmp_path}/etc/sub", f"set mode of {tmp_path}/etc/sub/a.conf",
                             f"rewrite {tmp_path}/etc/sub/b.conf"]
    assert mode_of(tmp_path / "etc/sub/a.conf") == 0o644 and (tmp_path / "etc/sub/b.conf").read_text() == "TWO\n"


def test_missing_parents_get_the_directory_s_mode_not_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        apply(*parse([{"path": str(tmp_path / "a/b/c"), "owner": "root", "group": "root", "mode": "0755"}], []))
    finally:
        os.umask(old)
    assert [mode_of(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o755, 0o755, 0o755]


def test_purge_removes_only_matching_files_no_entry_keeps(tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    for name in ("kept.yml", "retired.yml", "notes.txt"):
        (rules / name).write_text(name)
    (rules / "sub.yml").mkdir()
    directories, files = parse([{"path": str(rules), "owner": "root", "group": "root", "mode": "0755",
                                 "purge": "*.yml"}], [entry(rules / "kept.yml", "kept.yml")])
    dry = apply(directories, files, check_mode=True)
    assert dry.actions == [f"remove {rules}/retired.yml (not kept, matches *.yml)"] and (rules / "retired.yml").exists()
    assert apply(directories, files).changed
    assert sorted(os.listdir(rules)) == ["kept.yml", "notes.txt", "sub.yml"]
    assert not apply(directories, files).changed
    with pytest.raises(ConfigFileError, match="purge is '../\\*.yml'"):
        parse([{"path": str(rules), "owner": "root", "group": "root", "mode": "0755", "purge": "../*.yml"}], [])


def test_a_missing_final_newline_is_a_difference(tmp_path):
    (tmp_path / "f").write_text("x\n")
    assert apply(*parse([], [entry(tmp_path / "f", "x")])).changed
    assert (tmp_path / "f").read_bytes() == b"x"


def test_check_mode_reports_what_it_would_do_and_touches_nothing(tmp_path):
    (tmp_path / "old").write_text("old\n")
    before = sorted(os.listdir(tmp_path))
    outcome = apply(*parse([{"path": str(tmp_path / "new"), "owner": "root", "group": "root", "mode": "0755"}],
                           [entry(tmp_path / "new/f"), entry(tmp_path / "old", None, state="absent"),
                            entry(tmp_path / "g", owner="revive-no-such-user")]),
                    check_mode=True, want_diff=True)
    assert outcome.changed and outcome.actions == [f"create directory {tmp_path}/new", f"write {tmp_path}/new/f",
                                                   f"remove {tmp_path}/old", f"write {tmp_path}/g"]
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / "old").read_text() == "old\n"
    assert [d["prepared"].splitlines()[2:] for d in outcome.diff] == [["@@ -0,0 +1 @@", "+a"],
                                                                      ["@@ -1 +0,0 @@", "-old"],
                                                                      ["@@ -0,0 +1 @@", "+a"]]
    assert outcome.diff[1]["prepared"].splitlines()[1] == f"+++ {tmp_path}/old (removed)"


def test_removes_a_file_given_absent_and_leaves_an_absent_one_alone(tmp_path):
    (tmp_path / "gone").write_text("x")
    files = parse([], [entry(tmp_path / "gone", None, state="absent", name="gone")])[1]
    assert apply([], files).files["gone"]["changed"] and not (tmp_path / "gone").exists()
    assert not apply([], files).changed


def test_an_unknown_owner_fails_before_anything_changes(tmp_path):
    with pytest.raises(ConfigFileError, match="owner 'revive-no-such-user' does not exist"):
        apply(*parse([{"path": str(tmp_path / "d"), "owner": "root", "group": "root", "mode": "0755"}],
                     [entry(tmp_path / "d/f"), entry(tmp_path / "g", owner="revive-no-such-user")]))
    assert os.listdir(tmp_path) == []


def test_a_file_in_a_missing_directory_says_so(tmp_path):
    with pytest.raises(ConfigFileError, match="directory .* does not exist: add it to the task's directories"):
        apply(*parse([], [entry(tmp_path / "nowhere/f")]))


def test_a_failing_validate_leaves_the_old_file_and_no_temporary(tmp_path):
    (tmp_path / "cfg").write_text("good\n")
    checker = tmp_path / "check.sh"
    checker.write_text('#!/bin/sh\ngrep -q good "$1" || { echo "line 1: bad word" >&2; exit 3; }\n')
    checker.chmod(0o755)
    outcome = Outcome()
    with pytest.raises(ConfigFileError) as error:
        apply(*parse([], [entry(tmp_path / "cfg", "bad\n", validate=f"{checker} %s", name="cfg")]), outcome=outcome)
    assert outcome.files["cfg"]["changed"] is False and outcome.actions == []
    assert "fails its check" in str(error.value) and "exit 3" in str(error.value) and "line 1: bad word" in str(
        error.value)
    assert sorted(os.listdir(tmp_path)) == ["cfg", "check.sh"] and (tmp_path / "cfg").read_text() == "good\n"
    assert apply(*parse([], [entry(tmp_path / "cfg", "good too\n", validate=f"{checker} %s")])).changed


def test_the_temporary_file_has_the_final_mode_before_the_content_is_checked(tmp_path):
    seen = tmp_path / "seen"
    checker = tmp_path / "check.sh"
    checker.write_text(f'#!/bin/sh\nstat -c %a "$1" > {seen}\n')
    checker.chmod(0o755)
    apply(*parse([], [entry(tmp_path / "secret", "k\n", mode="0600", validate=f"{checker} %s")]))
    assert seen.read_text().strip() == "600"


def test_a_directory_where_a_file_should_be_is_refused_and_a_symlink_replaced(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(ConfigFileError, match="is not a regular file"):
        apply(*parse([], [entry(tmp_path / "d")]))
    (tmp_path / "masked.service").symlink_to("/dev/null")   # a unit masked by hand, as template replaces it
    outcome = apply(*parse([], [entry(tmp_path / "masked.service", "[Unit]\n")]))
    assert outcome.actions == [f"replace the symlink {tmp_path}/masked.service"]
    assert not (tmp_path / "masked.service").is_symlink() and (tmp_path / "masked.service").read_text() == "[Unit]\n"
    (tmp_path / "link").symlink_to(tmp_path / "d")
    assert apply(*parse([], [entry(tmp_path / "link", None, state="absent")])).changed
    assert not os.path.lexists(tmp_path / "link") and (tmp_path / "d").is_dir()
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigFileError, match="is not a directory"):
        apply([Directory(owner="root", group="root", mode=0o755, path=str(tmp_path / "f"))], [])
    assert File(owner="root", group="root", mode=0o644, name="n", dest="/x", content=None).content is None


# --- through Ansible -----------------------------------------------------------------------------------------------

def run(repo: Path, tmp_path: Path, tasks: list, *args: str) -> tuple[int, dict]:
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{"name": "Files", "hosts": "localhost", "gather_facts": False,
                                         "tasks": tasks}], sort_keys=False))
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
                           *args], cwd=repo, env=env, capture_output=True, text=True)
    return proc.returncode, json.loads(proc.stdout)


def results(report: dict) -> dict:
    return {task["task"]["name"]: task["hosts"]["localhost"] for play in report["plays"] for task in play["tasks"]}


def test_through_ansible_one_run_for_all_files_then_no_change_and_check_mode(repo, tmp_path):
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates/unit.j2").write_text(
        "{{ ansible_managed | comment }}\n[Service]\n{% for port in ports %}\nPort={{ port }}\n{% endfor %}\n\n")
    out = tmp_path / "out"
    tasks = [
        {"name": "Reference", "ansible.builtin.template": {"src": str(tmp_path / "templates/unit.j2"),
                                                          "dest": str(tmp_path / "reference"), "mode": "0644"},
         "vars": {"ports": [1, 2]}},
        {"name": "Keep", "config_files": {
            "directories": [{"path": str(out / "conf.d"), "mode": "0750"}],
            "files": [{"name": "unit", "dest": str(out / "conf.d/unit"),
                       "content": "{{ lookup('ansible.builtin.template', '" + str(tmp_path / "templates/unit.j2")
                                  + "') }}"},
                      {"dest": str(out / "conf.d/static"), "mode": "0600",
                       "content": "{{ lookup('ansible.builtin.file', '" + str(tmp_path / "templates/unit.j2")
                                  + "', rstrip=false) }}"}]},
         "vars": {"ports": [1, 2]}, "register": "kept"},
        {"name": "Say which changed", "ansible.builtin.debug": {"msg": "{{ kept.files.unit is changed }}"}},
    ]
    rc, report = run(repo, tmp_path, tasks, "--diff")
    assert rc == 0, json.dumps(report)[-2000:]
    first = results(report)
    assert first["Keep"]["changed"] and first["Say which changed"]["msg"] is True
    assert (out / "conf.d/unit").read_bytes() == (tmp_path / "reference").read_bytes()
    assert (out / "conf.d/static").read_bytes() == (tmp_path / "templates/unit.j2").read_bytes()
    assert mode_of(out / "conf.d") == 0o750 and mode_of(out / "conf.d/static") == 0o600
    assert first["Keep"]["diff"][0]["prepared"].splitlines()[3].startswith("+#")   # shown, though content is no_log

    rc, report = run(repo, tmp_path, tasks)
    assert rc == 0 and report["stats"]["localhost"]["changed"] == 0
    assert results(report)["Say which changed"]["msg"] is False

    (out / "conf.d/unit").write_text("drifted\n")
    rc, report = run(repo, tmp_path, tasks, "--check")
    assert rc == 0 and results(report)["Keep"]["changed"] and results(report)["Keep"]["actions"] == [
        f"rewrite {out}/conf.d/unit"]
    assert (out / "conf.d/unit").read_text() == "drifted\n"


def test_through_ansible_a_bad_mode_fails_naming_the_file_without_a_traceback(repo, tmp_path):
    rc, report = run(repo, tmp_path, [{"name": "Keep", "config_files": {
        "files": [{"dest": str(tmp_path / "f"), "content": "x", "mode": 0o644}]}}])
    failed = results(report)["Keep"]
    assert rc != 0 and failed["failed"] and "Traceback" not in json.dumps(failed)
    assert failed["msg"].startswith(f"files[0] ({tmp_path}/f): mode is 420: it must be an octal string")
    assert not (tmp_path / "f").exists()


def test_ansible_doc_renders_config_files(repo):
    env = dict(os.environ, ANSIBLE_CONFIG=str(repo / "ansible.cfg"))
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "-M", "library", "config_files"], cwd=repo, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "a task that writes a secret" in " ".join(proc.stdout.split()) and "validate" in proc.stdout


def test_a_content_stays_out_of_the_node_s_log(repo, tmp_path, monkeypatch):
    """content is no_log (like copy's), and the module writes no "Invoked with ..." line to the node's log: Ansible's
    masking of a no_log suboption misses it there (the line shows the files' list escaped). In-process, with
    AnsibleModule's own logging captured."""
    import importlib.util
    import ansible.module_utils.basic as basic
    spec = importlib.util.spec_from_file_location("config_files_module", repo / "library/config_files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    logged = []
    monkeypatch.setattr(basic.AnsibleModule, "log", lambda self, msg, log_args=None: logged.append(msg))
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", json.dumps({"ANSIBLE_MODULE_ARGS": {"files": [
        {"dest": str(tmp_path / "key"), "mode": "0600", "content": "TOKEN=revive-s3cr3t-value\n"}]}}).encode())
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy", raising=False)
    with pytest.raises(SystemExit), redirect_stdout(io.StringIO()) as out:
        module.main()
    assert json.loads(out.getvalue())["changed"] is True
    assert logged == [] and "revive-s3cr3t-value" not in out.getvalue()
    assert (tmp_path / "key").read_text() == "TOKEN=revive-s3cr3t-value\n" and mode_of(tmp_path / "key") == 0o600
