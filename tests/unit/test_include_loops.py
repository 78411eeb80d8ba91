"""No include in a loop whose items differ per host (docs/performance.md §4).

ansible-core groups the hosts of an include into one included file only when its loop item is the same
(playbook/included_file.py: IncludedFile.__eq__ compares the loop variables); hosts with different items get task
files of their own, and the linear strategy runs a task only on the hosts whose next task is that very task - so
the hosts run their included tasks one host after the other. vllm_service's switch restarted each replica through
such an include: on 8 nodes 253 of site.yml's 514 s were nodes waiting for each other. A loop over a module task
runs on every host at once (`loop_control.break_when` ends it at the first failure).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
INCLUDES = {f"{prefix}{action}" for prefix in ("", "ansible.builtin.", "ansible.legacy.")
            for action in ("include_tasks", "include_role")}
# (file, task name): why its items are the same on every host
SAME_ITEMS_ON_EVERY_HOST = {
    ("roles/vllm_runtime/tasks/wheels.yml", "Follow the fleet cache's downloads"):
        "its items are the result of a run_once task, which every host of the play gets the same",
}


def tasks_in(node) -> Iterator[dict]:
    """Every task of a task list, a play or a list of plays, blocks' rescue and always included."""
    if isinstance(node, list):
        for item in node:
            yield from tasks_in(item)
    elif isinstance(node, dict):
        if "hosts" in node or "import_playbook" in node or "ansible.builtin.import_playbook" in node:
            for key in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                yield from tasks_in(node.get(key) or [])
        elif "block" in node:
            for key in ("block", "rescue", "always"):
                yield from tasks_in(node.get(key) or [])
        else:
            yield node


def looped_includes(path: Path, root: Path = REPO) -> List[Tuple[str, str]]:
    found = []
    for task in tasks_in(yaml.safe_load(path.read_text()) or []):
        looped = "loop" in task or any(key.startswith("with_") for key in task)
        if looped and INCLUDES & set(task):
            found.append((str(path.relative_to(root)), task.get("name", "(unnamed)")))
    return found


def task_files() -> List[Path]:
    files = [*REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("roles/*/handlers/*.yml"), *REPO.glob("playbooks/*.yml"),
             *REPO.glob("playbooks/tasks/*.yml"), REPO / "site.yml"]
    assert len(files) > 50, files
    return sorted(files)


def test_no_include_loops_over_items_that_differ_per_host():
    found = [hit for path in task_files() for hit in looped_includes(path)]
    unexplained = [hit for hit in found if hit not in SAME_ITEMS_ON_EVERY_HOST]
    assert not unexplained, (
        f"include in a loop: {unexplained} - each host's items make task files of their own, which the linear "
        "strategy runs one host at a time. Loop the module task itself (loop_control.break_when stops at the "
        "first failure), or, when the items are the same on every host, say why in SAME_ITEMS_ON_EVERY_HOST.")
    stale = set(SAME_ITEMS_ON_EVERY_HOST) - set(found)
    assert not stale, f"SAME_ITEMS_ON_EVERY_HOST names includes that no longer loop: {stale}"


@pytest.mark.parametrize("text, hits", [
    ("- name: a\n  ansible.builtin.include_tasks: x.yml\n  loop: [1, 2]\n", 1),
    ("- block:\n    - name: b\n      include_role: {name: r}\n      with_items: [1]\n  rescue: []\n", 1),
    ("- hosts: all\n  tasks:\n    - name: c\n      ansible.builtin.include_tasks: x.yml\n      loop: [1]\n", 1),
    ("- name: d\n  ansible.builtin.systemd_service: {name: x}\n  loop: [1, 2]\n", 0),
    ("- name: e\n  ansible.builtin.include_tasks: x.yml\n", 0),
])
def test_the_scan_finds_a_looped_include(tmp_path, text, hits):
    path = tmp_path / "tasks.yml"
    path.write_text(text)
    assert len(looped_includes(path, tmp_path)) == hits
