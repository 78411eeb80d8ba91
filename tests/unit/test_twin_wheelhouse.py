"""The twin's wheels: reproducible, PEP 440-matching `vllm==0.5.4`, carrying the module_utils they reuse,
placeholders for data/vllm-releases.yml's 0.5.4 pins, and an offline install that imports as a simulation."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))

import build_wheelhouse  # noqa: E402


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
