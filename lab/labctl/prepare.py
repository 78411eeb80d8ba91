"""What the playbooks need from the lab besides its hosts: a wheelhouse and a model on the model-store host.

- `bin/lab wheelhouse`: the controller directory .lab/wheelhouse that roles copy to nodes, which reach no
  package index (an air-gapped site's wheelhouse, in the lab): the probe venv's pins (read from the
  gpu_preflight role's defaults, so they cannot drift), every pin of the nvitop-exporter lock
  (data/locks/nvitop-exporter.txt, the monitoring role's venv) as the lab nodes' wheels (CPython 3.11, Debian 12,
  x86_64), hash-checked, and, once lab/vllm_twin/build_wheelhouse.py exists, the vLLM twin's wheels (it is called
  with the wheelhouse directory as its only argument; for a release whose lock block has extra requirements,
  0.5.4's ray[default]==2.34.0, it downloads their closure from the release's real lock through
  download_locked_wheels here). A wheel already there is not downloaded again, so a complete wheelhouse is
  rebuilt offline.
- `bin/lab seed-model`: the lab model - the tiny llama-2-7b-chat fixture of tests/fixtures/models.py (8 heads
  of 64, so it can be planned) - under /srv/models/<name>/<revision> on the model-store host, written into
  the host's root from here, atomically, and only when its content differs.
"""
from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from .errors import LabError
from .state import LabState

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / ".lab/wheelhouse"
PREFLIGHT_DEFAULTS = REPO / "roles/gpu_preflight/defaults/main.yml"
TWIN_WHEELHOUSE_BUILDER = REPO / "lab/vllm_twin/build_wheelhouse.py"
NVITOP_EXPORTER_LOCK = REPO / "data/locks/nvitop-exporter.txt"
# The lab nodes' interpreter and platform (Debian 12: CPython 3.11, glibc 2.36). pip download does not widen a
# manylinux_2_X tag to the older ones the node's pip accepts (psutil's wheel is manylinux_2_12), so all are named,
# and not to their legacy aliases either (PEP 600: manylinux2014 = 2_17, manylinux2010 = 2_12, manylinux1 = 2_5),
# which some wheels carry alone (ray-2.34.0-cp311-cp311-manylinux2014_x86_64.whl).
NODE_PYTHON = "3.11"
NODE_WHEEL_TARGET = ("--python-version", NODE_PYTHON, "--implementation", "cp",
                     "--abi", f"cp{NODE_PYTHON.replace('.', '')}",
                     *(f"--platform=manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)),
                     *(f"--platform={legacy}_x86_64" for legacy in ("manylinux2014", "manylinux2010", "manylinux1")))

# Keep equal to inventory/lab/group_vars/all/revive.yml (a unit test checks).
MODEL_NAME = "tiny-chat"
MODEL_REVISION = "rev1"
MODEL_FIXTURE = "llama-2-7b-chat"
MODEL_STORE = "model-store"
MODEL_STORE_ROOT = "srv/models"


def probe_pins() -> list[str]:
    defaults = yaml.safe_load(PREFLIGHT_DEFAULTS.read_text())
    return list(defaults["gpu_preflight_probe_packages"])


def wheel_present(directory: Path, pin: str) -> bool:
    """A wheel for `name==version` is in `directory` (wheel file names use the normalised name with `_`)."""
    name, version = pin.split("==", 1)
    stem = f"{name.replace('-', '_').replace('.', '_').lower()}-{version}-"
    return any(path.name.lower().startswith(stem) and path.suffix == ".whl" for path in directory.glob("*.whl"))


def lock_requirements(text: str) -> dict[str, str]:
    """`name==version` -> its requirement with every `--hash` of a hash lock (uv's format: a pin line, then
    indented `--hash=sha256:...` continuation lines; `# via` comments and the header are left out)."""
    requirements: dict[str, str] = {}
    pin = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not line[0].isspace():
            pin = stripped.rstrip("\\").strip()
            requirements[pin] = ""
        requirements[pin] += line.rstrip() + "\n"
    return requirements


def _pip_download(argv_tail: list[str]) -> None:
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
            "--only-binary=:all:", *argv_tail]
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(f"`{' '.join(argv)}` failed:\n{(proc.stderr or proc.stdout).strip()}\n"
                       "The wheelhouse needs PyPI once; afterwards it is reused offline.")


def download_locked_wheels(dest: Path, lock: Path, log=print, only: list[str] | None = None) -> list[str]:
    """The lock's wheels for the lab nodes (NODE_WHEEL_TARGET) that `dest` lacks, checked against the lock's
    hashes (pip --require-hashes); returns the pins downloaded ([] when all were there: no network).

    `only`: these `name==version` pins of the lock instead of all of it (the closure of a requirement,
    revive_lockfile.dependency_closure); a pin the lock does not hold is refused before anything is fetched."""
    wanted = lock_requirements(lock.read_text(encoding="utf-8"))
    if only is not None:
        strangers = [pin for pin in only if pin not in wanted]
        if strangers:
            raise LabError(f"{lock}: pins no {', '.join(strangers)}; regenerate the lock (its `# command:` line) or "
                           "ask for pins it holds")
        wanted = {pin: wanted[pin] for pin in only}
    missing = [pin for pin in wanted if not wheel_present(dest, pin)]
    if not missing:
        return []
    with tempfile.TemporaryDirectory(prefix="lab-wheelhouse-") as tmp:
        requirements = Path(tmp) / lock.name
        requirements.write_text("".join(wanted[pin] for pin in missing), encoding="utf-8")
        _pip_download([*NODE_WHEEL_TARGET, "--require-hashes", "--dest", str(dest), "-r", str(requirements)])
    for pin in missing:
        log(f"lab: wheelhouse: downloaded {pin} ({lock.name})")
    return missing


def build_wheelhouse(dest: Path = WHEELHOUSE, log=print) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for pin in probe_pins():
        if wheel_present(dest, pin):
            continue
        _pip_download(["--dest", str(dest), pin])
        log(f"lab: wheelhouse: downloaded {pin}")
    download_locked_wheels(dest, NVITOP_EXPORTER_LOCK, log)
    if TWIN_WHEELHOUSE_BUILDER.exists():
        argv = [sys.executable, str(TWIN_WHEELHOUSE_BUILDER), str(dest)]
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0:
            raise LabError(f"building the vLLM twin's wheels failed (`{' '.join(argv)}`):\n"
                           f"{(proc.stderr or proc.stdout).strip()}")
    wheels = sorted(path.name for path in dest.glob("*.whl"))
    log(f"lab: wheelhouse {dest}: {len(wheels)} wheel(s): {', '.join(wheels)}")
    return dest


def _same_file(a: Path, b: Path, head_only: bool) -> bool:
    if not head_only:
        return filecmp.cmp(a, b, shallow=False)
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read(1 << 20) == fb.read(1 << 20)


def _same_tree(a: Path, b: Path, head_only: bool = False) -> bool:
    """Same file names and bytes; ``head_only``: same sizes and first MiB of each file (a sparse fixture's headers
    and configs: a byte-wise comparison would read its 40 GB of holes)."""
    if sorted(p.name for p in a.iterdir()) != sorted(p.name for p in b.iterdir()):
        return False
    return all(_same_file(path, b / path.name, head_only) for path in a.iterdir())


def seed_model(lab: LabState, name: str = MODEL_NAME, revision: str = MODEL_REVISION, log=print,
               fixture: str = MODEL_FIXTURE, size: str = "tiny") -> Path:
    """Write the lab model into the running model-store host's root; returns its path on that host.

    ``size="sparse"`` writes the fixture at its real dimensions in sparse files (tests/fixtures/models.py): a 20B
    model occupies no disk at the store, but model_sync moves (and hashes) every byte of it onto the node."""
    store = lab.host(MODEL_STORE)
    if store is None:
        raise LabError(f"this lab has no {MODEL_STORE} host (support hosts: "
                       f"{', '.join(lab.shape.support_hosts) or 'none'}); `bin/lab up` with it first")
    sys.path.insert(0, str(REPO / "tests"))
    from fixtures.models import MODEL_CONFIGS, write_model

    if fixture not in MODEL_CONFIGS:
        raise LabError(f"unknown model fixture {fixture!r}: give one of {', '.join(sorted(MODEL_CONFIGS))} "
                       "(tests/fixtures/models.py)")

    parent = Path(store.root) / MODEL_STORE_ROOT / name
    dest = parent / revision
    on_host = f"/{MODEL_STORE_ROOT}/{name}/{revision}"
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{revision}.", dir=parent))
    try:
        write_model(str(staging), fixture, size=size, dtype="F16")
        for path in [staging, *staging.iterdir()]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        if dest.is_dir() and _same_tree(staging, dest, head_only=size == "sparse"):
            log(f"lab: {MODEL_STORE}:{on_host} already holds the lab model")
            return Path(on_host)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(staging, dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    log(f"lab: seeded {MODEL_STORE}:{on_host} ({fixture} {size} fixture, FP16)")
    return Path(on_host)
