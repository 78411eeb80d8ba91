"""The twin's wheels: reproducible, PEP 440-matching `vllm==0.5.4`, carrying the module_utils they reuse,
placeholders for data/vllm-releases.yml's 0.5.4 pins, and an offline install that imports as a simulation;
one wheel per simulated release (0.8.5.post1 too) and the hash locks a node installs them from; 0.5.4's twin
requires the real ray[default]==2.34.0 of its lock block, whose wheels the lab lock pins at the real lock's
versions (the wheels themselves come from the lab wheelhouse that `bin/lab wheelhouse` builds: make unit does)."""
from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.revive_lockfile import parse_lock
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))

import build_wheelhouse  # noqa: E402

sys.path.insert(0, str(REPO / "lab"))
from labctl import prepare  # noqa: E402

RAY = "ray[default]==2.34.0"
TWIN_054 = {"vllm": "0.5.4+sim", "torch": "2.4.0+sim", "xformers": "0.0.27.post2+sim",
            "vllm-flash-attn": "2.6.1+sim", "nvidia-ml-py": "13.615.71"}


def test_the_twin_wheel_is_reproducible_and_complete(tmp_path):
    name, data = build_wheelhouse.twin_wheel()
    assert name == "vllm-0.5.4+sim-py3-none-any.whl"
    assert hashlib.sha256(data).digest() == hashlib.sha256(build_wheelhouse.twin_wheel()[1]).digest()
    path = tmp_path / name
    path.write_bytes(data)
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        metadata = wheel.read("vllm-0.5.4+sim.dist-info/METADATA").decode()
        record = wheel.read("vllm-0.5.4+sim.dist-info/RECORD").decode()
        bundled = wheel.read("vllm/_revive/module_utils/revive_kv.py")
    assert "Version: 0.5.4+sim" in metadata and "Requires-Dist: nvidia-ml-py==13.615.71" in metadata
    assert f"Requires-Dist: {RAY}\n" in metadata
    assert "SIMULATION of vLLM 0.5.4" in metadata
    assert bundled == (REPO / "module_utils" / "revive_kv.py").read_bytes()
    assert {"vllm/entrypoints/openai/api_server.py", "vllm/_revive/module_utils/revive_model.py",
            "vllm/_revive/module_utils/revive_topology.py", "vllm/version.py"} <= set(names)
    assert not any("__pycache__" in n for n in names)
    assert all(line.split(",")[0] in names for line in record.splitlines())


def test_placeholders_follow_the_release_pins():
    pins = build_wheelhouse.release_pins()
    assert pins == {"vllm": "0.5.4", "torch": "2.4.0", "xformers": "0.0.27.post2", "vllm-flash-attn": "2.6.1"}
    name, _ = build_wheelhouse.placeholder_wheel("vllm-flash-attn", "2.6.1")
    assert name == "vllm_flash_attn-2.6.1+sim-py3-none-any.whl"


def test_offline_install_of_the_054_pins_imports_as_a_simulation(tmp_path):
    house = tmp_path / "wheelhouse"
    house.mkdir()
    for wheel_name, data in [build_wheelhouse.twin_wheel()] + [
            build_wheelhouse.placeholder_wheel(d, p) for d, p in build_wheelhouse.release_pins().items() if d != "vllm"]:
        (house / wheel_name).write_bytes(data)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    pins = [f"{d}=={p}" for d, p in build_wheelhouse.release_pins().items()]
    # --no-deps: nvidia-ml-py comes from PyPI in build_wheelhouse.py; this test stays offline.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-index",
                    "--no-deps", "--find-links", str(house), *pins], check=True, capture_output=True)
    done = subprocess.run([str(python), "-c", (
        "import vllm, torch, xformers, vllm_flash_attn\n"
        "from vllm._revive import module_utils, module_utils_dir\n"
        "print(vllm.__version__, vllm.__simulated__, torch.__version__, xformers.__version__)\n"
        "print(module_utils('revive_kv').__file__.startswith(str(module_utils_dir())), module_utils_dir().name)\n"
        "try:\n    torch.cuda\nexcept ImportError as exc:\n    print(exc)\n")], capture_output=True, text=True,
        cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "0.5.4+sim True 2.4.0+sim 0.0.27.post2+sim",
        "True module_utils",
        "torch 2.4.0+sim is a placeholder of the revive lab's vLLM twin (lab/vllm_twin/README.md): torch.cuda does "
        "not exist here"]


# ------------------------------------------------------------------ one wheel per simulated release

def test_each_release_gets_its_twin_wheel_with_its_release_file_and_pins():
    name, data = build_wheelhouse.twin_wheel("0.8.5.post1")
    assert name == "vllm-0.8.5.post1+sim-py3-none-any.whl"
    with zipfile.ZipFile(io.BytesIO(data)) as wheel:
        metadata = wheel.read("vllm-0.8.5.post1+sim.dist-info/METADATA").decode()
        release = json.loads(wheel.read("vllm/_twin/release.json"))
    requires = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    assert requires == ["torch==2.6.0+sim", "xformers==0.0.29.post2+sim", "nvidia-ml-py==13.615.71"]
    assert (release["release"], release["version"], release["behaviour"]["parser"]) == (
        "0.8.5.post1", "0.8.5.post1+sim", "table")
    entry = build_wheelhouse.release_entry("0.8.5.post1")
    assert release["cli"]["arguments"] == build_wheelhouse.table_arguments(entry)
    # the release's data, copied in (no table of the twin repeats it)
    assert release["data"] == build_wheelhouse.release_data(entry)
    assert release["data"]["quantization_min_cc"] == entry.quantization_min_cc
    assert release["data"]["metrics"] == list(entry.metrics)
    with zipfile.ZipFile(io.BytesIO(build_wheelhouse.twin_wheel()[1])) as wheel:
        old = json.loads(wheel.read("vllm/_twin/release.json"))
    assert (old["release"], old["behaviour"]["parser"], old["cli"]["arguments"]) == ("0.5.4", "handwritten", [])
    assert build_wheelhouse.release_pins(version="0.8.5.post1") == {
        "vllm": "0.8.5.post1", "torch": "2.6.0", "xformers": "0.0.29.post2"}
    assert [n for n, _ in build_wheelhouse.release_wheels("0.8.5.post1")] == [
        "vllm-0.8.5.post1+sim-py3-none-any.whl", "torch-2.6.0+sim-py3-none-any.whl",
        "xformers-0.0.29.post2+sim-py3-none-any.whl"]


# ------------------------------------------------------------------ 0.5.4's real Ray

def test_only_the_054_twin_requires_ray_and_the_pin_is_the_release_datas(tmp_path):
    assert build_wheelhouse.twin_requirements("0.5.4") == [
        "torch==2.4.0+sim", "vllm-flash-attn==2.6.1+sim", "xformers==0.0.27.post2+sim", RAY, "nvidia-ml-py==13.615.71"]
    for version in build_wheelhouse.SIMULATED_RELEASES:
        if version != "0.5.4":
            assert not any(r.startswith("ray") for r in build_wheelhouse.twin_requirements(version)), version
            assert build_wheelhouse.closure_pins(version, "3.11") == [], version
    # read from the lock block, not a second copy: another pin there is another Requires-Dist
    data = yaml.safe_load(build_wheelhouse.RELEASES.read_text())
    data["releases"]["0.5.4"]["lock"]["requirements"][0]["requirement"] = "ray[default]==2.35.0"
    edited = tmp_path / "vllm-releases.yml"
    edited.write_text(yaml.safe_dump(data))
    assert build_wheelhouse.release_lock_requirements("0.5.4", edited) == ["ray[default]==2.35.0"]
    data["releases"]["0.5.4"]["lock"]["requirements"][0]["requirement"] = "ray[default]>=2.34"
    edited.write_text(yaml.safe_dump(data))
    with pytest.raises(SystemExit, match=r"lock.requirements\[0\].requirement: 'ray\[default\]>=2.34' must be an "
                                         r"exact pin"):
        build_wheelhouse.release_lock_requirements("0.5.4", edited)


def test_the_closure_pins_are_the_real_locks():
    real = parse_lock(build_wheelhouse.real_lock_path("0.5.4", "3.11").read_text(), "real")
    pins = build_wheelhouse.closure_pins("0.5.4", "3.11")
    assert "ray==2.34.0" in pins and len(pins) == len(set(pins))
    assert all(str(real.get(pin.split("==")[0])) == pin for pin in pins)
    # ray[default]'s own dependencies are in; vLLM's that Ray does not need are not
    names = {pin.split("==")[0] for pin in pins}
    assert {"aiohttp-cors", "colorful", "grpcio", "opencensus", "py-spy", "smart-open", "virtualenv", "memray",
            "prometheus-client", "pydantic", "msgpack", "protobuf"} <= names
    assert not names & {"vllm", "torch", "xformers", "transformers", "fastapi", "uvicorn", "numpy"}


def wheel_pin(filename: str) -> tuple:
    name, version, _, _ = parse_wheel_filename(filename)
    return canonicalize_name(name), str(version)


def ray_wheels_from_the_lab_wheelhouse(house: Path) -> list:
    """Links to the lab wheelhouse's wheels of 0.5.4's Ray closure, so a build in `house` fetches nothing (they are
    downloaded once by `bin/lab wheelhouse`; make unit runs it first)."""
    pins = build_wheelhouse.closure_pins("0.5.4", "3.11")
    absent = [pin for pin in pins if not prepare.wheel_present(prepare.WHEELHOUSE, pin)]
    if absent:
        pytest.fail(f"the lab wheelhouse {prepare.WHEELHOUSE} lacks {', '.join(absent)} (0.5.4's Ray): run "
                    "bin/lab wheelhouse (make unit and make test do)")
    wanted = {tuple(pin.split("==")) for pin in pins}
    linked = []
    for wheel in sorted(prepare.WHEELHOUSE.glob("*.whl")):
        if wheel_pin(wheel.name) in wanted:
            (house / wheel.name).symlink_to(wheel)
            linked.append(wheel.name)
    return linked


def stand_in_nvml_wheel(house: Path) -> Path:
    """nvidia-ml-py 13.615.71 repackaged from this interpreter's installed copy, so the test stays offline
    (build_wheelhouse.py keeps a wheel of that name instead of downloading it from PyPI)."""
    dist = importlib.metadata.distribution("nvidia-ml-py")
    assert dist.version == "13.615.71"
    files = {str(f): f.read_binary() for f in dist.files if str(f) in ("pynvml.py", "example.py")}
    assert "pynvml.py" in files
    path = house / "nvidia_ml_py-13.615.71-py3-none-any.whl"
    path.write_bytes(build_wheelhouse.wheel_bytes("nvidia_ml_py", "13.615.71", files, [],
                                                  "Python Bindings for the NVIDIA Management Library (test stand-in)"))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A wheelhouse built by build_wheelhouse.build, offline: nvidia-ml-py stood in, 0.5.4's Ray linked from the lab
    wheelhouse, and pip download refused (a complete wheelhouse fetches nothing)."""
    house = tmp_path_factory.mktemp("built") / "wheelhouse"
    house.mkdir()
    stand_in_nvml_wheel(house)
    ray_wheels = ray_wheels_from_the_lab_wheelhouse(house)

    def no_download(argv_tail):
        raise AssertionError(f"pip download {argv_tail}: the wheelhouse already holds every wheel")

    original, prepare._pip_download = prepare._pip_download, no_download
    try:
        written = build_wheelhouse.build(house)
    finally:
        prepare._pip_download = original
    return house, written, ray_wheels


def test_the_054_lab_lock_pins_ray_and_its_closure_at_the_real_locks_versions(built):
    house, written, ray_wheels = built
    assert not any("==" in name for name in written), "nothing was downloaded"
    closure = {pin.split("==")[0]: pin.split("==")[1] for pin in build_wheelhouse.closure_pins("0.5.4", "3.11")}
    assert len(ray_wheels) == len(closure)
    lock_path = house / "locks" / "vllm-0.5.4-py3.11.txt"
    lock = parse_lock(lock_path.read_text(), str(lock_path))
    assert {entry.key: entry.version for entry in lock.entries} == dict(closure, **TWIN_054)
    assert lock.get("ray").version == "2.34.0"
    real = parse_lock(build_wheelhouse.real_lock_path("0.5.4", "3.11").read_text(), "real")
    files = {wheel_pin(name): house / name for name in ray_wheels}
    for name, version in closure.items():
        digest = "sha256:" + hashlib.sha256(files[(name, version)].read_bytes()).hexdigest()
        # the lab lock hashes the very file the lab holds, which is one of the files the real lock allows
        assert lock.get(name).hashes == (digest,) and digest in real.get(name).hashes, name
    for version in build_wheelhouse.SIMULATED_RELEASES:
        if version != "0.5.4":
            other = parse_lock((house / "locks" / f"vllm-{version}-py3.11.txt").read_text(), version)
            assert other.get("ray") is None and not set(closure) & {entry.key for entry in other.entries}, version


def test_the_wheelhouse_locks_install_on_a_node_with_the_nodes_argv(built, tmp_path):
    house, written, _ = built
    assert {"locks/vllm-0.5.4-py3.11.txt", "locks/vllm-0.8.5.post1-py3.11.txt"} <= set(written)
    assert {f"locks/vllm-{version}-py3.11.txt" for version in build_wheelhouse.SIMULATED_RELEASES} <= set(written)
    assert {f"vllm-{version}+sim-py3-none-any.whl" for version in build_wheelhouse.SIMULATED_RELEASES} <= set(written)
    lock_path = house / "locks" / "vllm-0.8.5.post1-py3.11.txt"
    lock = parse_lock(lock_path.read_text(), str(lock_path))
    pinned = {entry.name: (entry.version, set(entry.hashes)) for entry in lock.entries}
    files = {"vllm": "vllm-0.8.5.post1+sim-py3-none-any.whl", "torch": "torch-2.6.0+sim-py3-none-any.whl",
             "xformers": "xformers-0.0.29.post2+sim-py3-none-any.whl",
             "nvidia-ml-py": "nvidia_ml_py-13.615.71-py3-none-any.whl"}
    assert set(pinned) == set(files)
    for name, file_name in files.items():
        digest = "sha256:" + hashlib.sha256((house / file_name).read_bytes()).hexdigest()
        assert digest in pinned[name][1], name
    assert pinned["vllm"][0] == "0.8.5.post1+sim"
    # a node: Debian 12's Python 3.11 where present, the exact argv of the runtime role
    interpreter = shutil.which("python3.11") or sys.executable
    venv = tmp_path / "venv"
    subprocess.run([interpreter, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "--require-hashes", "--only-binary", ":all:",
                           "--no-deps", "-r", str(lock_path), "--no-index", "--find-links", str(house)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    version = subprocess.run([str(python), "-c", "import vllm, torch, xformers, pynvml\n"
                              "print(vllm.__version__, torch.__version__, xformers.__version__)"],
                             capture_output=True, text=True, cwd=tmp_path)
    assert version.stdout.split() == ["0.8.5.post1+sim", "2.6.0+sim", "0.0.29.post2+sim"], version.stderr
    helped = subprocess.run([str(python), "-m", "vllm.entrypoints.openai.api_server", "--help"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: api_server.py [-h] [--host HOST] [--port PORT]")
    assert "--disable-log-requests" in helped.stdout and "--swap-space SWAP_SPACE" in helped.stdout


def test_a_wheel_is_rewritten_only_when_its_bytes_change_and_never_in_place(tmp_path):
    # Scenarios side by side share the lab wheelhouse: a create re-running the builder must not touch a wheel that
    # another lab's node is copying, and a changed one arrives whole (a new inode through a rename).
    wheel = tmp_path / "w.whl"
    build_wheelhouse.replace_if_changed(wheel, b"one")
    first = wheel.stat()
    os.utime(wheel, (1_700_000_000, 1_700_000_000))
    build_wheelhouse.replace_if_changed(wheel, b"one")
    assert wheel.stat().st_mtime == 1_700_000_000 and wheel.stat().st_ino == first.st_ino
    build_wheelhouse.replace_if_changed(wheel, b"two")
    assert wheel.read_bytes() == b"two" and wheel.stat().st_ino != first.st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.whl"]
