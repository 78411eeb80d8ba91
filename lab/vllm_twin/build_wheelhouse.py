#!/usr/bin/env python3
"""Build the lab wheelhouse: one vLLM twin wheel per simulated release, placeholders for each release's
other pins, nvidia-ml-py, and a hash lock per release and lab Python.

    lab/vllm_twin/build_wheelhouse.py --dest .lab/wheelhouse      (or the directory as the only argument)

Writes into DEST, for every release in SIMULATED_RELEASES:
* vllm-<release>+sim-py3-none-any.whl: lab/vllm_twin/src/vllm plus copies of the BUNDLED_MODULE_UTILS,
  module_utils/revive_model.py, revive_kv.py, revive_topology.py and revive_perf.py, under
  vllm/_revive/module_utils/ (the twin reuses the project's model facts, KV sizing, topology tables and
  performance model: its `# GPU blocks` line is the planner's KV estimate and its step timing the planner's
  model), and vllm/_twin/release.json, which fixes the release the wheel simulates
  (vllm/_twin/release.py): its version, commit, behaviour switches and its data from data/vllm-releases.yml
  (the CLI table its parser is built from, the metric names it serves, KV sizing family, head sizes,
  quantization minimums; check_behaviour refuses a release the twin cannot simulate as the data says).
  Requires-Dist names the release's placeholders at their exact `+sim` versions, the extra requirements of
  the release's lock block (`lock.requirements`: 0.5.4's ray[default]==2.34.0, the real thing) and
  nvidia-ml-py==13.615.71, so a resolver finds the whole set.
  `vllm==0.8.5.post1` picks it: a version specifier without a local label matches `0.8.5.post1+sim`
  (PEP 440).
* One placeholder wheel `<name>-<pin>+sim` for every other pin data/vllm-releases.yml lists for the release
  (0.5.4: torch 2.4.0, xformers 0.0.27.post2, vllm-flash-attn 2.6.1; 0.8.5.post1: torch 2.6.0, xformers
  0.0.29.post2). Importing one works and says it is a simulation; touching anything in it raises an
  ImportError that says so.
* nvidia-ml-py-13.615.71 (`pip download --no-deps`, from PyPI once; kept when already present).
* The real wheels of each extra lock requirement and of its dependency closure, exactly as the release's real
  lock data/locks/vllm-<release>-py<X.Y>.txt pins them (for the lab nodes' CPython 3.11, from PyPI once,
  hash-checked against that lock: lab/labctl/prepare.py download_locked_wheels; present wheels are kept). The
  closure comes from the lock's `# via` annotations (revive_lockfile.dependency_closure says why that is
  sound), so the lab runs the Ray a node of the release runs, at the same versions.
* locks/vllm-<release>-py<X.Y>.txt for every Python of LAB_PYTHONS (lab nodes: Debian 12, Python 3.11):
  `bin/revive lock --wheelhouse DEST --requirement vllm==<release>+sim --requirement <pin>+sim ...
  [--requirement <closure pin> ...] --python X.Y --out FILE` (module_utils/revive_lockgen.py), every wheel
  of the install pinned by hash. The closure pins are requirements because the wheelhouse holds other
  versions of some of them (prometheus-client 0.26.0 of the nvitop-exporter lock): without them the
  resolver would take the newest, not the real lock's. A node installs it with `pip install
  --require-hashes --only-binary :all: --no-deps -r LOCK --no-index --find-links DEST`.

Wheels are assembled with zipfile (METADATA, WHEEL, RECORD), byte-for-byte reproducible: sorted entries,
fixed timestamps and modes. Other `+sim` wheels in DEST (of releases no longer built) are removed.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import importlib
import io
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SOURCE = HERE / "src" / "vllm"
MODULE_UTILS = REPO / "module_utils"
BUNDLED_MODULE_UTILS = ("revive_model.py", "revive_kv.py", "revive_topology.py", "revive_perf.py")
RELEASES = REPO / "data" / "vllm-releases.yml"
REVIVE = REPO / "bin" / "revive"
SIMULATED_RELEASES = ("0.5.4", "0.6.6.post1", "0.7.3", "0.8.5.post1", "0.9.2")
LAB_PYTHONS = ("3.11",)   # Debian 12's python3 on the lab nodes
NVML_PIN = "nvidia-ml-py==13.615.71"
EPOCH = (1980, 1, 1, 0, 0, 0)
GENERATOR = "revive build_wheelhouse"
# Pins of the release that are not Python packages pip installs.
NOT_PACKAGES = ("cuda", "python")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_bytes(distribution: str, version: str, files: Dict[str, bytes], metadata_extra: Sequence[str],
                summary: str) -> bytes:
    """A pure-Python wheel, reproducible: same inputs, same bytes."""
    dist_info = f"{distribution}-{version}.dist-info"
    metadata = "\n".join(["Metadata-Version: 2.1", f"Name: {distribution.replace('_', '-')}", f"Version: {version}",
                          f"Summary: {summary}", "Requires-Python: >=3.9", *metadata_extra]) + "\n"
    wheel = "\n".join(["Wheel-Version: 1.0", f"Generator: {GENERATOR}", "Root-Is-Purelib: true",
                       "Tag: py3-none-any"]) + "\n"
    entries = dict(files)
    entries[f"{dist_info}/METADATA"] = metadata.encode()
    entries[f"{dist_info}/WHEEL"] = wheel.encode()
    record_name = f"{dist_info}/RECORD"
    record_lines = [f"{name},{_record_hash(data)},{len(data)}" for name, data in sorted(entries.items())]
    record_lines.append(f"{record_name},,")
    entries[record_name] = ("\n".join(record_lines) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(entries, key=lambda n: (n.startswith(dist_info), n)):
            info = zipfile.ZipInfo(name, date_time=EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, entries[name])
    return buffer.getvalue()


def _module_utils(name: str):
    sys.path.insert(0, str(HERE / "src"))
    try:
        from vllm._revive import module_utils
    finally:
        sys.path.pop(0)
    return module_utils(name)


_LOADED: Dict[Tuple[str, int], Any] = {}


def release_entry(version: str, path: Path = RELEASES):
    """The release of data/vllm-releases.yml (through module_utils/revive_releases.py). The file is parsed once
    per content (pure-Python YAML takes about a second for it; a build asks for every release's entry several
    times)."""
    key = (str(path), path.stat().st_mtime_ns)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = _module_utils("revive_releases").load_release_file(str(path))
    return _LOADED[key].release(version)


def _twin_module(name: str):
    sys.path.insert(0, str(HERE / "src"))
    try:
        module = importlib.import_module(f"vllm._twin.{name}")
    finally:
        sys.path.pop(0)
    return module


def _release_module():
    return _twin_module("release")


def table_arguments(entry) -> List[Dict[str, Any]]:
    """The release's CLI table as release.json holds it (the YAML values, so int choices stay ints)."""
    keys = ("flags", "action", "type", "default", "choices", "nargs", "deprecated")
    return [{key: raw[key] for key in keys if key in raw} for raw in entry.raw["cli"]["arguments"]]


def release_data(entry) -> Dict[str, Any]:
    """The fields of the release's entry the twin follows (vllm/_twin/release.py ReleaseData), as release.json
    holds them."""
    raw = entry.raw
    needed = ("metrics_need_disable_frontend_multiprocessing", "paged_attention_head_sizes", "swap_space_limits",
              "chunked_prefill_auto_above", "custom_all_reduce", "bf16_auto_fallback")
    missing = [key for key in needed if key not in raw]
    if missing:
        raise SystemExit(f"data/vllm-releases.yml: {entry.version} has no {', '.join(missing)}; the twin follows them")
    return {"metrics_need_disable_frontend_multiprocessing": bool(raw["metrics_need_disable_frontend_multiprocessing"]),
            "kv_sizing": entry.kv_sizing_by_engine["V0"],
            "paged_attention_head_sizes": list(raw["paged_attention_head_sizes"]),
            "quantization_min_cc": dict(entry.quantization_min_cc), "metrics": list(entry.metrics),
            "swap_space_limits": dict(raw["swap_space_limits"]),
            "chunked_prefill_auto_above": raw["chunked_prefill_auto_above"],
            "custom_all_reduce": dict(raw["custom_all_reduce"]), "bf16_auto_fallback": bool(raw["bf16_auto_fallback"])}


def check_behaviour(version: str, entry) -> None:
    """The twin can simulate the release as data/vllm-releases.yml describes it: it has a Behaviour row for it
    (vllm/_twin/release.py), the release's parser is table-driven only with a CLI table, every name of its
    `metrics:` list is a family the twin knows for that release (vllm/_twin/metrics.py ERAS), and the
    checkout's release data (0.5.4, which runs without a release.json) equals the data."""
    module = _release_module()
    if version not in module.BEHAVIOURS:
        raise SystemExit(f"the twin has no behaviour for vLLM {version} (vllm/_twin/release.py BEHAVIOURS: "
                         f"{', '.join(module.BEHAVIOURS)})")
    behaviour = module.BEHAVIOURS[version]
    if behaviour.parser == "table" and not entry.raw.get("cli", {}).get("arguments"):
        raise SystemExit(f"data/vllm-releases.yml has no CLI table for {version}: the twin's parser is built from it")
    metrics = _twin_module("metrics")
    era = behaviour.metrics_era
    if not entry.metrics:
        raise SystemExit(f"data/vllm-releases.yml lists no metrics for {version}: the twin serves exactly that list")
    unknown = metrics.unknown_families(list(entry.metrics), era)
    if unknown:
        raise SystemExit(f"the twin cannot simulate {', '.join(unknown)} for vLLM {version}: data/vllm-releases.yml "
                         f"lists it, vllm/_twin/metrics.py knows no such family in {version}'s vllm/engine/metrics.py "
                         f"(ERAS[{era!r}])")
    if version == module.CHECKOUT_RELEASE:
        expected = module.data_from(release_data(entry))
        checkout = module.CHECKOUT_DATA
        wrong = [f"{key}: data/vllm-releases.yml says {getattr(expected, key)!r}, vllm/_twin/release.py "
                 f"CHECKOUT_DATA {getattr(checkout, key)!r}" for key in expected.__dataclass_fields__
                 if getattr(expected, key) != getattr(checkout, key)]
        if wrong:
            raise SystemExit(f"the twin's checkout data for {version} disagrees with the release data:\n  "
                             + "\n  ".join(wrong))


def release_json(version: str, path: Path = RELEASES) -> bytes:
    """vllm/_twin/release.json of the release's wheel."""
    entry = release_entry(version, path)
    check_behaviour(version, entry)
    module = _release_module()
    table = module.BEHAVIOURS[version].parser == "table"
    release = module.make(version, table_arguments(entry) if table else None, entry.cli_complete if table else False,
                          module.data_from(release_data(entry)))
    return (json.dumps(release.as_json(), indent=1, sort_keys=True) + "\n").encode()


def twin_files(version: str = "0.5.4") -> Dict[str, bytes]:
    files: Dict[str, bytes] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        files["vllm/" + path.relative_to(SOURCE).as_posix()] = path.read_bytes()
    for name in BUNDLED_MODULE_UTILS:
        source = MODULE_UTILS / name
        if not source.is_file():
            raise SystemExit(f"{source}: missing; the twin bundles it (model facts / KV sizing / topology). "
                             "Run from a complete checkout.")
        files[f"vllm/_revive/module_utils/{name}"] = source.read_bytes()
    files["vllm/_twin/release.json"] = release_json(version)
    return files


def twin_version(version: str) -> str:
    return f"{version}+sim"


def release_lock_requirements(version: str, path: Path = RELEASES) -> List[str]:
    """The extra requirements of the release's lock block (`lock.requirements`, checked as bin/revive lock checks
    them: module_utils/revive_lockgen.py), e.g. ['ray[default]==2.34.0'] for 0.5.4; [] for a release without."""
    lockgen = _module_utils("revive_lockgen")
    try:
        return [added.requirement for added in lockgen.lock_requirements(release_entry(version, path))]
    except lockgen.LockGenError as exc:
        raise SystemExit(str(exc)) from None


def twin_requirements(version: str) -> List[str]:
    """The twin wheel's Requires-Dist: its placeholders at their exact +sim versions, the release's extra lock
    requirements (real distributions, e.g. ray[default]==2.34.0), and nvidia-ml-py."""
    pins = release_pins(version=version)
    return ([f"{name}=={pin}+sim" for name, pin in sorted(pins.items()) if name != "vllm"]
            + release_lock_requirements(version) + [NVML_PIN])


def twin_wheel(version: str = "0.5.4") -> Tuple[str, bytes]:
    summary = (f"SIMULATION of vLLM {version} for the revive lab (no GPU, no model): same CLI, start-up checks, "
               "API and metrics, calibrated latency")
    requires = [f"Requires-Dist: {requirement}" for requirement in twin_requirements(version)]
    data = wheel_bytes("vllm", twin_version(version), twin_files(version), requires, summary)
    return f"vllm-{twin_version(version)}-py3-none-any.whl", data


PLACEHOLDER_MODULE = '''"""{name} {version}: a PLACEHOLDER of the revive lab, not {name}.

The lab's vLLM is a simulation (vllm {twin}); this package only satisfies the pin {name}=={pin} so the
runtime role's locked install works offline. Nothing in it works.
"""
__version__ = "{version}"
__simulated__ = True


def __getattr__(attribute):
    raise ImportError("{name} {version} is a placeholder of the revive lab's vLLM twin "
                      "(lab/vllm_twin/README.md): {name}." + attribute + " does not exist here")
'''


def import_name(distribution: str) -> str:
    return {"vllm-flash-attn": "vllm_flash_attn"}.get(distribution, distribution.replace("-", "_"))


def placeholder_wheel(distribution: str, pin: str, release: str = "0.5.4",
                      shared_with: Sequence[str] = ()) -> Tuple[str, bytes]:
    """The placeholder of one pin; `shared_with`: the other simulated releases that pin the same version (one
    wheel of that name serves them all, and says so)."""
    version = f"{pin}+sim"
    module = import_name(distribution)
    twin = ", ".join(twin_version(r) for r in [release, *shared_with])
    source = PLACEHOLDER_MODULE.format(name=distribution, version=version, pin=pin, twin=twin)
    normalized = re.sub(r"[-_.]+", "_", distribution).lower()
    data = wheel_bytes(normalized, version, {f"{module}/__init__.py": source.encode()}, [],
                       f"PLACEHOLDER for {distribution}=={pin} in the revive lab (the vLLM twin needs nothing)")
    return f"{normalized}-{version}-py3-none-any.whl", data


def release_pins(path: Path = RELEASES, version: str = "0.5.4") -> Dict[str, str]:
    """The release's pins of data/vllm-releases.yml that pip installs (cuda and python are not packages)."""
    pins = release_entry(version, path).pins
    return {name: str(pin) for name, pin in pins.items() if name not in NOT_PACKAGES}


def release_wheels(version: str) -> List[Tuple[str, bytes]]:
    """The twin wheel of a release and its placeholders."""
    outputs = [twin_wheel(version)]
    for distribution, pin in sorted(release_pins(version=version).items()):
        if distribution != "vllm":
            outputs.append(placeholder_wheel(distribution, pin, version))
    return outputs


def real_lock_path(version: str, python: str) -> Path:
    """The release's committed hash lock, data/locks/vllm-<version>-py<X.Y>.txt."""
    return REPO / "data" / "locks" / f"vllm-{version}-py{python}.txt"


def closure_pins(version: str, python: str) -> List[str]:
    """`name==version` of every distribution the release's extra lock requirements pull in, the requirements
    included, as the release's real lock pins them (revive_lockfile.dependency_closure over its `# via`
    annotations); [] for a release without extra requirements. Exits naming the lock and the fix when the lock
    is missing or does not pin a requirement (regenerate it with bin/revive lock)."""
    requirements = release_lock_requirements(version)
    if not requirements:
        return []
    lock = real_lock_path(version, python)
    if not lock.is_file():
        raise SystemExit(f"{lock.relative_to(REPO)}: missing; the lab needs it for {', '.join(requirements)} of "
                         f"vLLM {version} (`bin/revive lock {version} --python {python}` writes it)")
    lockfile = _module_utils("revive_lockfile")
    try:
        closure = lockfile.dependency_closure(lock.read_text(encoding="utf-8"), requirements,
                                              str(lock.relative_to(REPO)))
    except lockfile.LockError as exc:
        raise SystemExit(str(exc)) from None
    return [str(entry) for entry in closure]


def lock_requirements(version: str, python: str = LAB_PYTHONS[0]) -> List[str]:
    """What the release's lock is resolved from: the twin wheel and its placeholders, all at +sim, and the
    closure of the release's extra lock requirements at the real lock's versions."""
    pins = release_pins(version=version)
    return ([f"vllm=={twin_version(version)}"]
            + [f"{name}=={pin}+sim" for name, pin in sorted(pins.items()) if name != "vllm"]
            + closure_pins(version, python))


def _prepare():
    """lab/labctl/prepare.py: the lab nodes' wheel target and the hash-checked download of a lock's wheels."""
    sys.path.insert(0, str(REPO / "lab"))
    try:
        from labctl import prepare
    finally:
        sys.path.pop(0)
    return prepare


def download_closure(dest: Path, version: str, python: str) -> List[str]:
    """The real wheels of closure_pins for the lab nodes that `dest` lacks, hash-checked against the release's
    real lock; returns the pins downloaded ([] when all are present: nothing is fetched)."""
    pins = closure_pins(version, python)
    if not pins:
        return []
    prepare = _prepare()
    if python != prepare.NODE_PYTHON:
        raise SystemExit(f"LAB_PYTHONS has {python}, but lab/labctl/prepare.py downloads wheels for the nodes' "
                         f"Python {prepare.NODE_PYTHON} (NODE_PYTHON); keep them equal")
    try:
        return prepare.download_locked_wheels(dest, real_lock_path(version, python), log=lambda _: None, only=pins)
    except prepare.LabError as exc:
        raise SystemExit(str(exc)) from None


def lock_path(dest: Path, version: str, python: str) -> Path:
    return dest / "locks" / f"vllm-{version}-py{python}.txt"


def replace_if_changed(path: Path, data: bytes) -> None:
    """Write `path` only when its bytes differ, through a temporary file and a rename: labs of several Molecule
    scenarios share the wheelhouse and copy from it while another scenario's create runs this builder, so a file
    is never seen half-written and an unchanged one is not touched."""
    if path.is_file() and path.read_bytes() == data:
        return
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_bytes(data)
    os.replace(part, path)


def write_lock(dest: Path, version: str, python: str) -> Path:
    """`bin/revive lock --wheelhouse ...` (module_utils/revive_lockgen.py lock_wheelhouse) for one release; it
    rewrites the lock only when it changes, through a rename (revive_lockgen.write_atomic)."""
    out = lock_path(dest, version, python)
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(REVIVE), "lock", "--wheelhouse", str(dest.resolve())]  # uv runs in a scratch directory
    for requirement in lock_requirements(version, python):
        argv += ["--requirement", requirement]
    argv += ["--python", python, "--out", str(out.resolve())]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"`{' '.join(argv)}` failed (rc {done.returncode}):\n{(done.stderr or done.stdout).strip()}")
    return out


def download_nvml(dest: Path) -> Optional[str]:
    if list(dest.glob("nvidia_ml_py-13.615.71-*.whl")):
        return None
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
            "--only-binary=:all:", "--dest", str(dest), NVML_PIN]
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"`{' '.join(argv)}` failed:\n{(done.stderr or done.stdout).strip()}\nThe wheelhouse needs "
                         "PyPI once for nvidia-ml-py (or put its wheel into the directory yourself).")
    return NVML_PIN


def build(dest: Path, releases: Sequence[str] = SIMULATED_RELEASES, locks: bool = True) -> List[str]:
    dest.mkdir(parents=True, exist_ok=True)
    outputs: List[Tuple[str, bytes]] = [twin_wheel(version) for version in releases]
    # a pin several releases share (0.6.6.post1 and 0.7.3: torch 2.5.1) is one placeholder wheel
    users: Dict[Tuple[str, str], List[str]] = {}
    for version in releases:
        for distribution, pin in release_pins(version=version).items():
            if distribution != "vllm":
                users.setdefault((distribution, pin), []).append(version)
    for (distribution, pin), versions in sorted(users.items()):
        outputs.append(placeholder_wheel(distribution, pin, versions[0], versions[1:]))
    names = {name for name, _ in outputs}
    written = []
    for stale in dest.glob("*+sim-*.whl"):
        if stale.name not in names:
            stale.unlink()
    for name, data in outputs:
        replace_if_changed(dest / name, data)
        written.append(name)
    downloaded = download_nvml(dest)
    if downloaded:
        written.append(downloaded)
    for version in releases:
        for python in LAB_PYTHONS:
            written.extend(download_closure(dest, version, python))
    if locks:
        for version in releases:
            for python in LAB_PYTHONS:
                written.append(str(write_lock(dest, version, python).relative_to(dest)))
    return written


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", nargs="?", type=Path, help="the wheelhouse directory (same as --dest)")
    parser.add_argument("--dest", type=Path, help="the wheelhouse directory")
    args = parser.parse_args(argv)
    dest = args.dest or args.directory
    if dest is None:
        parser.error("give the wheelhouse directory: --dest DIR")
    for name in build(dest):
        print(f"vllm twin wheelhouse {dest}: {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
