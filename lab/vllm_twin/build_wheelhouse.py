#!/usr/bin/env python3
"""Build the lab wheelhouse for vLLM 0.5.4: the twin's wheel, placeholders for its pins, nvidia-ml-py.

    lab/vllm_twin/build_wheelhouse.py --dest .lab/wheelhouse      (or the directory as the only argument)

Writes into DEST:
* vllm-0.5.4+sim-py3-none-any.whl: lab/vllm_twin/src/vllm plus copies of module_utils/revive_model.py,
  revive_kv.py and revive_topology.py under vllm/_revive/module_utils/ (the twin reuses the project's
  model facts and KV sizing). Its only dependency is nvidia-ml-py==13.615.71. `pip install vllm==0.5.4`
  picks it: a version specifier without a local label matches `0.5.4+sim` (PEP 440).
* One placeholder wheel `<name>-<pin>+sim` for every other pin data/vllm-releases.yml lists for 0.5.4
  (torch 2.4.0, xformers 0.0.27.post2, vllm-flash-attn 2.6.1), so the runtime role's unchanged
  `pip install vllm==0.5.4 torch==2.4.0 ...` resolves offline. Importing one works and says it is a
  simulation; touching anything in it raises an ImportError that says so.
* nvidia-ml-py-13.615.71 (`pip download --no-deps`, from PyPI once; kept when already present).

Wheels are assembled with zipfile (METADATA, WHEEL, RECORD), byte-for-byte reproducible: sorted entries,
fixed timestamps and modes. Existing wheels of the same name are replaced.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SOURCE = HERE / "src" / "vllm"
MODULE_UTILS = REPO / "module_utils"
BUNDLED_MODULE_UTILS = ("revive_model.py", "revive_kv.py", "revive_topology.py")
RELEASES = REPO / "data" / "vllm-releases.yml"
TWIN_VERSION = "0.5.4+sim"
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


def twin_files() -> Dict[str, bytes]:
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
    return files


def twin_wheel() -> Tuple[str, bytes]:
    summary = ("SIMULATION of vLLM 0.5.4 for the revive lab (no GPU, no model): same CLI, start-up checks, "
               "API and metrics, calibrated latency")
    data = wheel_bytes("vllm", TWIN_VERSION, twin_files(), [f"Requires-Dist: {NVML_PIN}"], summary)
    return f"vllm-{TWIN_VERSION}-py3-none-any.whl", data


PLACEHOLDER_MODULE = '''"""{name} {version}: a PLACEHOLDER of the revive lab, not {name}.

The lab's vLLM is a simulation (vllm {twin}); this package only satisfies the pin {name}=={pin} so the
runtime role's unchanged install works offline. Nothing in it works.
"""
__version__ = "{version}"
__simulated__ = True


def __getattr__(attribute):
    raise ImportError("{name} {version} is a placeholder of the revive lab's vLLM twin "
                      "(lab/vllm_twin/README.md): {name}." + attribute + " does not exist here")
'''


def import_name(distribution: str) -> str:
    return {"vllm-flash-attn": "vllm_flash_attn"}.get(distribution, distribution.replace("-", "_"))


def placeholder_wheel(distribution: str, pin: str) -> Tuple[str, bytes]:
    version = f"{pin}+sim"
    module = import_name(distribution)
    source = PLACEHOLDER_MODULE.format(name=distribution, version=version, pin=pin, twin=TWIN_VERSION)
    normalized = re.sub(r"[-_.]+", "_", distribution).lower()
    data = wheel_bytes(normalized, version, {f"{module}/__init__.py": source.encode()}, [],
                       f"PLACEHOLDER for {distribution}=={pin} in the revive lab (the vLLM twin needs nothing)")
    return f"{normalized}-{version}-py3-none-any.whl", data


def release_pins(path: Path = RELEASES, version: str = "0.5.4") -> Dict[str, str]:
    """The 0.5.4 pins of data/vllm-releases.yml (through module_utils/revive_releases.py)."""
    sys.path.insert(0, str(HERE / "src"))
    from vllm._revive import module_utils
    releases = module_utils("revive_releases")
    pins = releases.load_release_file(str(path)).release(version).pins
    return {name: str(pin) for name, pin in pins.items() if name not in NOT_PACKAGES}


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


def build(dest: Path) -> List[str]:
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    outputs = [twin_wheel()]
    for distribution, pin in sorted(release_pins().items()):
        if distribution == "vllm":
            continue
        outputs.append(placeholder_wheel(distribution, pin))
    for name, data in outputs:
        prefix = name.split("-")[0] + "-"
        for stale in dest.glob(prefix + "*+sim-*.whl"):
            if stale.name != name:
                stale.unlink()
        (dest / name).write_bytes(data)
        written.append(name)
    downloaded = download_nvml(dest)
    if downloaded:
        written.append(downloaded)
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
