"""nvitop-exporter on the GPU nodes (roles/monitoring, monitoring_gpu_exporter=nvitop): its hash lock
(data/locks/nvitop-exporter.txt) holds every pin the role asks for, nvidia-ml-py in step with the probe venv; the lab
wheelhouse (lab/labctl/prepare.py) fetches every pin of it for the lab nodes' CPython 3.11; the role's install block
builds the venv from the wheelhouse in check mode (nothing), then for real, then again with changed=0; and the
unit's exact command line runs the locked nvitop-exporter against the fake NVML and serves the series
monitoring/rules/gpu.yml reads, with the labels it reads them by."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.revive_lockfile import parse_lock

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab"))

from labctl import prepare  # noqa: E402

BIN = os.path.dirname(sys.executable)
ROLE = REPO / "roles" / "monitoring"
LOCK = REPO / "data" / "locks" / "nvitop-exporter.txt"
PINS = {"nvitop-exporter": "1.7.2", "nvitop": "1.7.2", "nvidia-ml-py": "13.615.71", "prometheus-client": "0.26.0",
        "psutil": "7.2.2"}


def read_lock(path: Path):
    return parse_lock(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))


def role_defaults() -> dict:
    return yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


def node_python() -> str | None:
    """A Python 3.11 (the lab nodes' Debian 12) or 3.10 (Ubuntu 22.04) with venv, or None."""
    candidates = [shutil.which("python3.11"), shutil.which("python3.10")]
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(str(p) for p in root.glob("3.1[01].*/bin/python3")) if root.is_dir() else []
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "import venv, ensurepip"], capture_output=True).returncode == 0:
            return candidate
    return None


def wheelhouse_complete() -> bool:
    return prepare.WHEELHOUSE.is_dir() and all(prepare.wheel_present(prepare.WHEELHOUSE, pin)
                                               for pin in prepare.lock_requirements(LOCK.read_text()))


@pytest.fixture(scope="module")
def node_venv_python() -> str:
    """The node-side Python, with the lab wheelhouse holding the lock's wheels: a check that needs them fails, never
    skips, and says how to provide them."""
    python = node_python()
    if python is None:
        pytest.fail("no Python 3.11/3.10 with venv and ensurepip for the node-side venv (Debian 12: apt-get install "
                    "python3.11-venv, or pyenv install 3.10)")
    if not wheelhouse_complete():
        pytest.fail(f"the lab wheelhouse {prepare.WHEELHOUSE} lacks wheels of {LOCK.relative_to(REPO)}: run "
                    "bin/lab wheelhouse (make unit and make test do)")
    return python


# --- the lock ---------------------------------------------------------------------------------------------------

def test_the_lock_pins_exactly_the_exporter_and_its_dependencies():
    lock = read_lock(LOCK)
    assert {entry.key: entry.version for entry in lock.entries} == PINS
    assert all(entry.hashes for entry in lock.entries)
    # every wheel of each version (uv's --generate-hashes): psutil's abi3 wheels serve 3.10 and 3.11 alike
    assert len(lock.get("psutil").hashes) > 10


def test_the_lock_holds_every_pin_the_role_installs():
    lock = read_lock(LOCK)
    packages = role_defaults()["monitoring_nvitop_exporter_packages"]
    assert packages == ["nvitop-exporter==1.7.2", "nvidia-ml-py==13.615.71"]
    for package in packages:
        name, version = package.split("==")
        assert lock.get(name) is not None and lock.get(name).version == version, package
    assert role_defaults()["monitoring_nvitop_exporter_pip_lock"].endswith("/data/locks/nvitop-exporter.txt")


def test_nvidia_ml_py_is_the_probe_venvs():
    probe = read_lock(REPO / "data" / "locks" / "probe-venv.txt")
    assert read_lock(LOCK).get("nvidia-ml-py").version == probe.get("nvidia-ml-py").version


def test_the_header_records_how_to_regenerate_the_lock():
    lock = read_lock(LOCK)
    command = lock.value("command")
    # tools/check_locks.py runs this line with the control venv's uv (`make check-locks`)
    assert command.startswith("printf 'nvitop-exporter==1.7.2\\nnvidia-ml-py==13.615.71\\n' | uv --no-config pip "
                              "compile - ")
    for option in ("--python-version 3.10", "--only-binary :all:", "--generate-hashes",
                   "--index-url https://pypi.org/simple", f"--exclude-newer {lock.value('exclude-newer')}"):
        assert option in command, option
    assert lock.value("resolver") == "uv 0.13.8" and lock.value("index") == "https://pypi.org/simple"


# --- the lab wheelhouse -----------------------------------------------------------------------------------------

@pytest.fixture
def downloads(monkeypatch):
    """What build_wheelhouse asks pip for: (argv tail, the requirements file's text) per call; no network."""
    calls = []

    def fake_download(argv_tail):
        requirements = argv_tail[argv_tail.index("-r") + 1] if "-r" in argv_tail else None
        calls.append((list(argv_tail), Path(requirements).read_text() if requirements else None))

    monkeypatch.setattr(prepare, "_pip_download", fake_download)
    monkeypatch.setattr(prepare, "TWIN_WHEELHOUSE_BUILDER", Path("/nonexistent/build_wheelhouse.py"))
    return calls


def test_the_wheelhouse_fetches_every_pin_of_the_lock_for_the_lab_nodes(tmp_path, downloads):
    prepare.build_wheelhouse(tmp_path, log=lambda _: None)
    (argv, requirements), = [call for call in downloads if call[1] is not None]
    assert prepare.lock_requirements(requirements).keys() == {f"{name}=={v}" for name, v in PINS.items()}
    # hash-checked: each requirement travels with every hash of the lock
    assert parse_lock(requirements, "requested").entries == read_lock(LOCK).entries
    assert "--require-hashes" in argv and "--dest" in argv and argv[argv.index("--dest") + 1] == str(tmp_path)
    for flag, value in (("--python-version", "3.11"), ("--implementation", "cp"), ("--abi", "cp311")):
        assert argv[argv.index(flag) + 1] == value
    assert {"--platform=manylinux_2_36_x86_64", "--platform=manylinux_2_12_x86_64"} <= set(argv)


def test_the_wheelhouse_skips_the_wheels_it_has(tmp_path, downloads):
    for pin in ("nvitop-1.7.2", "psutil-7.2.2", "nvidia_ml_py-13.615.71"):
        (tmp_path / f"{pin}-py3-none-any.whl").write_bytes(b"")
    prepare.build_wheelhouse(tmp_path, log=lambda _: None)
    (argv, requirements), = [call for call in downloads if call[1] is not None]
    assert sorted(prepare.lock_requirements(requirements)) == ["nvitop-exporter==1.7.2", "prometheus-client==0.26.0"]
    for pin in ("nvitop_exporter-1.7.2", "prometheus_client-0.26.0"):
        (tmp_path / f"{pin}-py3-none-any.whl").write_bytes(b"")
    downloads.clear()
    prepare.build_wheelhouse(tmp_path, log=lambda _: None)
    assert downloads == [], "a complete wheelhouse is rebuilt offline"


# --- the role's install block, through Ansible --------------------------------------------------------------------

def ansible_env(tmp_path) -> dict:
    return dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
                ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
                ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"))


def install_play(tmp_path: Path, extra: dict, *flags: str) -> tuple:
    """The role's preflight and the install block of tasks/gpu_exporter_nvitop.yml (not the unit, and a stand-in for
    the restart handler: they would start a service here), on localhost with the role's defaults and vars;
    (return code, {task: result}, the play's stats)."""
    tasks = yaml.safe_load((ROLE / "tasks" / "gpu_exporter_nvitop.yml").read_text())
    install = [task for task in tasks if task["name"] == "Install nvitop-exporter"]
    assert install and "block" in install[0], "gpu_exporter_nvitop.yml has no 'Install nvitop-exporter' block"
    (tmp_path / "install.yml").write_text(yaml.safe_dump(install, sort_keys=False))
    play = tmp_path / "play.yml"
    play.write_text(textwrap.dedent(f"""\
        - name: nvitop-exporter
          hosts: localhost
          gather_facts: false
          vars_files: [{ROLE}/defaults/main.yml, {ROLE}/vars/main.yml]
          vars: {{role_path: {ROLE}}}
          tasks:
            - name: Preflight
              ansible.builtin.import_tasks: {ROLE}/tasks/exporters_preflight.yml
            - name: Install
              ansible.builtin.import_tasks: {tmp_path / 'install.yml'}
          handlers:
            - name: Restart gpu exporter (not here)
              ansible.builtin.debug: {{msg: restarted}}
              listen: restart gpu exporter
        """))
    args = [os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play), *flags,
            "-e", json.dumps(extra)]
    proc = subprocess.run(args, cwd=REPO, env=ansible_env(tmp_path), capture_output=True, text=True, timeout=300)
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(proc.stdout[-3000:] + proc.stderr[-3000:])
    results = {t["task"]["name"]: t["hosts"]["localhost"] for t in out["plays"][0]["tasks"]}
    return proc.returncode, results, out["stats"]["localhost"]


@pytest.fixture
def install_vars(tmp_path) -> dict:
    return {"monitoring_gpu_exporter": "nvitop", "monitoring_nodes": [], "monitoring_frontdoors": [],
            "monitoring_nvitop_exporter_pip_source": {"type": "wheelhouse", "wheelhouse": str(prepare.WHEELHOUSE)},
            "monitoring_nvitop_exporter_venv": str(tmp_path / "opt" / "nvitop-exporter"),
            "monitoring_nvitop_exporter_node_wheelhouse": str(tmp_path / "cache" / "wheelhouse"),
            "monitoring_nvitop_exporter_python": node_python() or "/usr/bin/python3.11"}


def test_the_role_builds_the_venv_from_the_lock_in_check_mode_then_for_real_then_unchanged(tmp_path, install_vars,
                                                                                          node_venv_python):
    if os.geteuid() != 0:
        pytest.fail("run the unit tests as root (CI does): the role's copies are owned by root")
    install_vars["monitoring_nvitop_exporter_python"] = node_venv_python
    venv = Path(install_vars["monitoring_nvitop_exporter_venv"])
    code, results, stats = install_play(tmp_path, install_vars, "--check")
    build = "Build nvitop-exporter's venv (kept while its pins match; a half-built one is rebuilt)"
    assert code == 0, results
    assert results[build]["changed"] and results[build]["decision"] == "create"
    assert not venv.exists() and not (tmp_path / "cache").exists()

    code, results, stats = install_play(tmp_path, install_vars)
    assert code == 0, results
    assert results[build]["decision"] == "create" and results[build]["import_version"] == "1.7.2"
    assert "Restart gpu exporter (not here)" in results, "a new venv restarts the unit"
    assert (venv / "bin" / "nvitop-exporter").is_file()
    # only the lock's wheels travel to the node, and the lock beside them
    copied = sorted(p.name for p in (tmp_path / "cache" / "wheelhouse").iterdir())
    assert len(copied) == len(PINS) and all(name.endswith(".whl") for name in copied)
    assert (tmp_path / "cache" / "locks" / "nvitop-exporter.txt").read_text() == LOCK.read_text()

    code, results, stats = install_play(tmp_path, install_vars)
    assert code == 0 and stats["changed"] == 0, results
    # a kept venv: the ask says so, and neither the wheels nor the build run again
    ask = "Ask whether nvitop-exporter's venv must be built (a kept venv needs no wheels)"
    assert results[ask]["decision"] == "unchanged" and results[ask]["import_version"] == "1.7.2", results[ask]
    assert results[build].get("skipped") is True and "Restart gpu exporter (not here)" not in results
    assert results["Create the node's wheelhouse for nvitop-exporter"].get("skipped") is True


def test_the_preflight_refuses_a_missing_wheelhouse_before_touching_the_node(tmp_path, install_vars):
    missing = dict(install_vars, monitoring_nvitop_exporter_pip_source={"type": "wheelhouse",
                                                                        "wheelhouse": str(tmp_path / "none")})
    code, results, _ = install_play(tmp_path, missing, "--check")
    assert code != 0
    refusal = results["_common : Refuse a missing wheelhouse before touching any node"]
    assert "bin/lab wheelhouse" in refusal["msg"] and "nvitop-exporter.txt" in refusal["msg"]
    assert "Copy nvitop-exporter's hash lock to the node's lock directory" not in results


# --- the unit's command line against the locked exporter ------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def unit_argv(tmp_path, venv: Path, port: int) -> list:
    """ExecStart of the role's rendered unit for node1, the venv and port given."""
    dest = tmp_path / "nvitop-exporter.service"
    play = tmp_path / "render.yml"
    play.write_text(textwrap.dedent(f"""\
        - name: Render
          hosts: localhost
          gather_facts: false
          vars_files: [{ROLE}/defaults/main.yml, {ROLE}/vars/main.yml]
          vars: {{role_path: {ROLE}}}
          tasks:
            - name: Render
              ansible.builtin.template: {{src: {ROLE}/templates/nvitop-exporter.service.j2, dest: {dest}, mode: "0644"}}
        """))
    extra = {"monitoring_gpu_exporter": "nvitop", "monitoring_gpu_exporter_port": port, "inventory_hostname": "node1",
             "monitoring_nvitop_exporter_venv": str(venv)}
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play),
                           "-e", json.dumps(extra)], cwd=REPO, env=ansible_env(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    line = next(line for line in dest.read_text().splitlines() if line.startswith("ExecStart="))
    return line.removeprefix("ExecStart=").split()


@pytest.fixture(scope="module")
def locked_venv(tmp_path_factory, node_venv_python) -> Path:
    """The lock installed as a node installs it, offline from the lab wheelhouse."""
    venv = tmp_path_factory.mktemp("nvitop") / "venv"
    subprocess.run([node_venv_python, "-m", "venv", str(venv)], check=True, timeout=120)
    proc = subprocess.run([str(venv / "bin" / "pip"), "install", "--isolated", "--quiet", "--no-index",
                           "--find-links", str(prepare.WHEELHOUSE), "--require-hashes", "--only-binary", ":all:",
                           "--no-deps", "-r", str(LOCK)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return venv


def scrape(url: str, process: subprocess.Popen, deadline_s: float = 30) -> str:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
            if "gpu_utilization_Percentage{" in text:
                return text
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"nvitop-exporter served no GPU series (exit {process.poll()}):\n"
                        + (process.stdout.read() if process.poll() is not None else ""))
        time.sleep(0.5)


def test_the_units_command_line_serves_the_series_the_rules_read(tmp_path, locked_venv):
    fakenvml = REPO / "lab" / "fakenvml" / "libnvidia-ml.so.1"
    if not fakenvml.exists():
        pytest.fail("build the fake NVML first: make fakenvml (make unit does)")
    port = free_port()
    argv = unit_argv(tmp_path, locked_venv, port)
    assert argv == [str(locked_venv / "bin" / "nvitop-exporter"), "--bind-address", "0.0.0.0", "--port", str(port),
                    "--hostname", "node1", "--interval", "5.0"]
    env = dict(os.environ, LD_LIBRARY_PATH=str(fakenvml.parent),
               FAKE_NVML_PROFILE=str(REPO / "lab" / "profiles" / "v100-pcie-8x.json"),
               FAKE_NVML_UTILIZATION=str(tmp_path / "no-utilization.json"))
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        text = scrape(f"http://127.0.0.1:{port}/metrics", process)
    finally:
        process.terminate()
        process.wait(timeout=30)
    rules = (REPO / "monitoring" / "rules" / "gpu.yml").read_text()
    for name in ("gpu_utilization_Percentage", "gpu_memory_used_MiB", "gpu_memory_total_MiB"):
        assert re.search(rf"\b{name}\b", rules), f"monitoring/rules/gpu.yml no longer reads {name}"
        series = re.findall(rf"^{name}\{{(.*)\}} (\S+)$", text, re.M)
        assert len(series) == 8, f"{name}: {len(series)} series, want one per GPU of v100-pcie-8x"
        labels = [dict(re.findall(r'(\w+)="([^"]*)"', body)) for body, _ in series]
        assert sorted(label["index"] for label in labels) == [str(i) for i in range(8)]
        assert all(set(label) == {"hostname", "index", "devicename", "uuid"} for label in labels), labels[0]
        assert all(label["hostname"] == "node1" and label["devicename"] == "Tesla V100-PCIE-32GB"
                   and label["uuid"].startswith("GPU-") for label in labels)
        assert all(value != "NaN" for _, value in series), name
