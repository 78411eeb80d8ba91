"""The vllm_runtime role on this machine from a wheelhouse of stand-in wheels: the distribution's interpreter
from vars/, the venv named by version and pins, FlashAttention left out on Volta, `import vllm` checked, a
second run unchanged, old release venvs pruned but never the recorded ones."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_venv_build import auto_lock, make_wheel
from test_wheelsource import fake_index  # noqa: F401 (a pytest fixture: the loopback index)

BIN = os.path.dirname(sys.executable)
DEBIAN_PYTHON = "/usr/bin/python3.11"  # roles/vllm_runtime/vars/Debian.yml
SPEC_TASK = "Work out the venv's pins and name; check the interpreter against the release's Python pin"


ASK_TASK = "Ask whether the release venv must be built (a kept venv needs no wheels)"
COPY_TASK = "Copy this node's locked wheels from the controller (fleet cache or wheelhouse)"
# The copy includes _common's wheels_to_node: one tar per node, unpacked on it.
UNPACK_TASK = "Unpack them into the node's wheelhouse"

def run_role(repo, tmp_path, release: dict, *flags: str, **role_vars) -> tuple:
    (tmp_path / "release.json").write_text(json.dumps(release))
    params = {"vllm_runtime_release": "{{ lookup('ansible.builtin.file', '%s') | from_json }}" % (tmp_path / "release.json"),
              "vllm_runtime_lock_dir": str(tmp_path / "locks"),
              "vllm_runtime_venvs_root": str(tmp_path / "venvs"),
              "vllm_runtime_node_wheelhouse": str(tmp_path / "node/wheelhouse"),
              "vllm_runtime_record_path": str(tmp_path / "releases.json"), **role_vars}
    play = tmp_path / "play.yml"
    play.write_text(textwrap.dedent(f"""\
        - name: Runtime
          hosts: localhost
          gather_facts: true
          gather_subset: [min]
          roles:
            - role: vllm_runtime
              vars: {json.dumps(params)}
          post_tasks:
            - name: Show the published venv
              ansible.builtin.debug:
                var: vllm_runtime_venv
        """))
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play),
                           *flags], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stdout)
    # Task names without the "vllm_runtime : " prefix.
    tasks = {task["task"]["name"].split(" : ", 1)[-1]: task["hosts"]["localhost"] for task in report["plays"][0]["tasks"]}
    return proc.returncode, tasks, report["stats"]["localhost"]


@pytest.fixture
def release_wheelhouse(tmp_path) -> Path:
    """Stand-in wheels and their locks, as `bin/lab wheelhouse` makes them: one per interpreter the tests use."""
    house = tmp_path / "wheelhouse"
    house.mkdir()
    make_wheel(house, "vllm", "0.5.4+sim", "__version__ = '0.5.4+sim'\n", requires=("torch==2.4.0",))
    make_wheel(house, "torch", "2.4.0+sim", "__version__ = '2.4.0+sim'\n")
    make_wheel(house, "vllm_flash_attn", "2.6.1+sim", "__version__ = '2.6.1+sim'\n")
    (tmp_path / "locks").mkdir()
    for minor in {"3.11", "%d.%d" % sys.version_info[:2]}:
        auto_lock(house, ("vllm==0.5.4",), tmp_path / "locks" / f"vllm-0.5.4-py{minor}.txt")
    return house


RELEASE = {"vllm_version": "0.5.4", "gpu": {"compute_capability": "7.0"},
           "pins": {"vllm": "0.5.4", "torch": "2.4.0", "vllm-flash-attn": "2.6.1", "cuda": "12.1",
                    "python": ">=3.8,<3.13"}}
# The stand-in wheels are pure Python: any interpreter will do, so the tests use the one running them.
ANY_PYTHON = dict(RELEASE, pins=dict(RELEASE["pins"], python=">=3.8"))


def test_on_debian_the_venv_is_made_from_python_3_11(repo, tmp_path, release_wheelhouse):
    source = {"type": "wheelhouse", "wheelhouse": str(release_wheelhouse)}
    _, tasks, _ = run_role(repo, tmp_path, RELEASE, "--check", vllm_runtime_pip_source=source)
    assert tasks["Gathering Facts"]["ansible_facts"]["ansible_distribution"] == "Debian"
    spec = tasks[SPEC_TASK]
    # Where Debian's python3.11 is missing the task fails naming it; either way it is the one chosen.
    assert spec.get("python") == DEBIAN_PYTHON or f"the interpreter {DEBIAN_PYTHON} does not run" in spec["msg"]
    assert not (tmp_path / "venvs").exists()


def test_the_role_builds_the_release_venv_and_keeps_it(repo, tmp_path, release_wheelhouse):
    source = {"type": "wheelhouse", "wheelhouse": str(release_wheelhouse)}
    code, tasks, stats = run_role(repo, tmp_path, ANY_PYTHON, vllm_runtime_pip_source=source,
                                  vllm_runtime_python=sys.executable)
    assert code == 0, tasks
    spec = tasks[SPEC_TASK]
    assert spec["packages"] == ["torch==2.4.0", "vllm==0.5.4"]
    venv = tasks["Show the published venv"]["vllm_runtime_venv"]
    assert venv["path"] == f"{tmp_path}/venvs/{spec['name']}" and spec["name"].startswith("0.5.4-")
    assert (venv["python"], venv["vllm_version"], venv["changed"]) == (f"{venv['path']}/bin/python", "0.5.4+sim", True)
    built = tasks["Build the release venv"]
    assert tasks[ASK_TASK]["changed"] is True and tasks[UNPACK_TASK]["changed"] is True
    assert built["distributions"]["vllm"] == "0.5.4+sim" and "vllm-flash-attn" not in built["distributions"]
    assert os.path.realpath(f"{venv['path']}/bin/python") == os.path.realpath(sys.executable)

    code, tasks, stats = run_role(repo, tmp_path, ANY_PYTHON, vllm_runtime_pip_source=source,
                                  vllm_runtime_python=sys.executable)
    assert (code, stats["changed"]) == (0, 0), tasks
    # The kept venv needs no wheels and no build: the second run asks, copies none (the first one copied them) and
    # does not run pip_venv a second time; what it publishes comes from the ask.
    assert tasks[ASK_TASK]["changed"] is False and tasks[ASK_TASK]["decision"] == "unchanged", tasks[ASK_TASK]
    assert tasks[COPY_TASK].get("skipped") is True, tasks[COPY_TASK]
    assert tasks["Build the release venv"].get("skipped") is True, tasks["Build the release venv"]
    assert tasks["Create the node's wheelhouse for this lock"].get("skipped") is True
    kept = tasks["Show the published venv"]["vllm_runtime_venv"]
    assert (kept["path"], kept["python"], kept["vllm_version"], kept["changed"]) == (
        venv["path"], venv["python"], "0.5.4+sim", False)


def test_old_venvs_go_but_not_the_recorded_ones(repo, tmp_path, release_wheelhouse):
    venvs = tmp_path / "venvs"
    for age, name in enumerate(["0.5.3-recorded", "0.5.3-aaaaaaaa", "0.5.3-bbbbbbbb"]):
        (venvs / name).mkdir(parents=True)
        os.utime(venvs / name, (1_700_000_000 + age, 1_700_000_000 + age))
    (tmp_path / "releases.json").write_text(json.dumps({"schema": 1, "current": {"id": "r", "venv": str(venvs / "0.5.3-recorded")},
                                                        "previous": None, "last_failure": None}))
    source = {"type": "wheelhouse", "wheelhouse": str(release_wheelhouse)}
    code, tasks, _ = run_role(repo, tmp_path, ANY_PYTHON, vllm_runtime_pip_source=source, vllm_runtime_keep_venvs=1,
                              vllm_runtime_python=sys.executable)
    assert code == 0, tasks
    assert tasks["Remove release venvs beyond the newest vllm_runtime_keep_venvs"]["removed"] == [
        str(venvs / "0.5.3-aaaaaaaa"), str(venvs / "0.5.3-bbbbbbbb")]
    assert sorted(p.name for p in venvs.iterdir()) == sorted(["0.5.3-recorded", Path(
        tasks["Show the published venv"]["vllm_runtime_venv"]["path"]).name])


def test_flash_attn_in_a_volta_lock_is_refused_before_anything_is_built(repo, tmp_path, release_wheelhouse):
    lock = tmp_path / "locks" / ("vllm-0.5.4-py%d.%d.txt" % sys.version_info[:2])
    lock.write_text(lock.read_text() + f"flash-attn==2.5.8 --hash=sha256:{'1' * 64}\n")
    source = {"type": "wheelhouse", "wheelhouse": str(release_wheelhouse)}
    code, tasks, _ = run_role(repo, tmp_path, ANY_PYTHON, vllm_runtime_pip_source=source,
                              vllm_runtime_python=sys.executable)
    assert code != 0
    failed = tasks["Refuse FlashAttention in the lock of a GPU below compute capability 8.0"]
    assert failed["msg"].startswith(f"The lock {lock} pins flash-attn, which GPUs of compute capability 7.0 cannot use")
    assert not (tmp_path / "venvs").exists() and not (tmp_path / "node").exists()


def test_a_release_without_a_lock_is_refused_with_the_command_that_makes_one(repo, tmp_path, release_wheelhouse):
    source = {"type": "wheelhouse", "wheelhouse": str(release_wheelhouse)}
    release = dict(ANY_PYTHON, vllm_version="0.5.5", pins=dict(ANY_PYTHON["pins"], vllm="0.5.5"))
    code, tasks, _ = run_role(repo, tmp_path, release, vllm_runtime_pip_source=source,
                              vllm_runtime_python=sys.executable)
    minor = "%d.%d" % sys.version_info[:2]
    assert code != 0
    assert tasks["Refuse a release without a lock for this interpreter"]["msg"].startswith(
        f"There is no lock {tmp_path}/locks/vllm-0.5.5-py{minor}.txt for vLLM 0.5.5 on Python {minor}")
    assert f"`bin/revive lock 0.5.5 --python {minor}`" in tasks["Refuse a release without a lock for this interpreter"]["msg"]
    assert not (tmp_path / "venvs").exists() and not (tmp_path / "node").exists()


def test_a_wheelhouse_missing_a_locked_wheel_is_refused_before_the_node_changes(repo, tmp_path, release_wheelhouse):
    (release_wheelhouse / "torch-2.4.0+sim-py3-none-any.whl").unlink()
    source = {"type": "wheelhouse", "wheelhouse": str(release_wheelhouse)}
    code, tasks, _ = run_role(repo, tmp_path, ANY_PYTHON, vllm_runtime_pip_source=source,
                              vllm_runtime_python=sys.executable)
    assert code != 0
    check = tasks["Check that the package source offers every locked wheel"]
    assert "torch==2.4.0+sim" in (check.get("msg", "") + json.dumps(check.get("results", [])))
    assert not (tmp_path / "venvs").exists() and not (tmp_path / "node").exists()


def test_the_fleet_cache_downloads_each_wheel_once_and_the_node_installs_from_it(repo, tmp_path, release_wheelhouse,
                                                                                  fake_index):
    """An index source with the fleet cache on: the controller fetches the lock's wheels once (a loopback index
    stands in for PyPI), shows the download's progress, copies exactly those wheels to the node's per-lock
    directory and pip installs from there; a second run downloads and changes nothing."""
    for wheel in sorted(release_wheelhouse.glob("*.whl")):
        fake_index.add(wheel.name.split("-")[0].replace("_", "-"), wheel.name, wheel.read_bytes())
    source = {"type": "mirror", "index_url": fake_index.simple, "trusted_host": "127.0.0.1"}
    cache = tmp_path / "cache"
    minor = "%d.%d" % sys.version_info[:2]
    settings = dict(vllm_runtime_pip_source=source, vllm_runtime_python=sys.executable, vllm_runtime_fleet_cache="always",
                    vllm_runtime_fleet_cache_dir=str(cache), vllm_runtime_fleet_cache_poll_s=1)
    code, tasks, _ = run_role(repo, tmp_path, ANY_PYTHON, **settings)
    assert code == 0, tasks
    cached = sorted(p.name for p in (cache / f"vllm-0.5.4-py{minor}").glob("*.whl"))
    assert cached == ["torch-2.4.0+sim-py3-none-any.whl", "vllm-0.5.4+sim-py3-none-any.whl"]
    node = tmp_path / "node" / "wheelhouse" / f"vllm-0.5.4-py{minor}"
    assert sorted(p.name for p in node.iterdir()) == cached  # only the lock's wheels, no progress file
    assert "fleet cache" in json.dumps(tasks["Show the download's progress"])
    assert len([r for r in fake_index.file_requests() if r["path"].endswith(".whl")]) == 2
    built = tasks["Build the release venv"]
    assert tasks[ASK_TASK]["changed"] is True and tasks[UNPACK_TASK]["changed"] is True
    assert built["distributions"]["vllm"] == "0.5.4+sim"
    assert "--find-links" in built["pip_argv"] and str(node) in built["pip_argv"]

    code, tasks, stats = run_role(repo, tmp_path, ANY_PYTHON, **settings)
    assert (code, stats["changed"]) == (0, 0), tasks
    assert len([r for r in fake_index.file_requests() if r["path"].endswith(".whl")]) == 2  # nothing fetched again
