"""Generate hash locks with uv (controller side): a release's lock block in, data/locks/<file> out.

Release mode (`lock_release`): the release's pins (data/vllm-releases.yml, less `cuda` and `python`) and
`lock.requirements` (exact pins, extras allowed: 0.5.4's ray[default]==2.34.0) are the requirements,
`lock.constraints` the constraints, resolved by
    uv pip compile requirements.in -c constraints.txt [--excludes excludes.txt] --python-version X.Y
        --python-platform P --only-binary :all: --generate-hashes --exclude-newer <date>T00:00:00Z
        --index-url URL --no-header --quiet -o lock.txt
`lock.supplied` distributions are gone from the index, so they are excluded from the resolution (uv drops
the package and does not look for it); with a supply directory their wheels are hashed from its files
and their own Requires-Dist are resolved with the pins, without one they are recorded as `missing`.

Wheelhouse mode (`lock_wheelhouse`, the lab): the same, against `--no-index --find-links DIR`.

Reproducible: the same inputs give the same bytes (no timestamps; uv runs with --no-config, without UV_*
settings, in a fresh directory with relative file names, so `# via -r requirements.in` annotations and
the resolution do not depend on where or by whom it ran). The format is module_utils/revive_lockfile.py's.
"""
from __future__ import annotations

import email.parser
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from packaging.requirements import InvalidRequirement, Requirement  # ansible-core's own dependency
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version
from ansible.module_utils.revive_lockfile import (
    SOURCE_SEPARATOR,
    Lock,
    LockEntry,
    LockError,
    canonical_name,
    lock_file_name,
    parse_lock,
    render_header,
)

DEFAULT_INDEX = "https://pypi.org/simple"
# Release pins that are not distributions pip installs.
NOT_PACKAGES = ("cuda", "python")
# uv settings that only change transport, not the resolution; every other UV_* variable is dropped.
UV_TRANSPORT_ENV = ("UV_CACHE_DIR", "UV_NATIVE_TLS", "UV_HTTP_TIMEOUT", "UV_CONCURRENT_DOWNLOADS")
UV_TIMEOUT_S = 1800
REQUIREMENTS_FILE = "requirements.in"
CONSTRAINTS_FILE = "constraints.txt"
EXCLUDES_FILE = "excludes.txt"
OUTPUT_FILE = "lock.txt"


class LockGenError(Exception):
    """The lock cannot be generated from these inputs; the message says what, where and how to fix it."""


class ResolveError(LockGenError):
    """uv ran and found no solution (or did not finish); its own explanation is in the message."""


@dataclass(frozen=True)
class Constraint:
    requirement: str
    source: str


@dataclass(frozen=True)
class AddedRequirement:
    """A requirement of the release's lock block installed beside its pins (requirements.in), with its source."""

    requirement: str
    source: str


@dataclass(frozen=True)
class Supplied:
    """A distribution the index no longer serves; `entry` is None when no file for it was supplied."""

    requirement: str
    source: str
    entry: Optional[LockEntry]
    files: Tuple[str, ...] = ()
    requires: Tuple[str, ...] = ()


@dataclass(frozen=True)
class LockJob:
    """Everything one lock is generated from; the header records all of it."""

    release: Optional[str]
    python: str
    platform: Optional[str]
    index: str
    index_flags: Tuple[str, ...]
    exclude_newer: Optional[str]
    requirements: Tuple[str, ...]
    constraints: Tuple[Constraint, ...]
    supplied: Tuple[Supplied, ...]
    command: str
    offline: bool = False
    added: Tuple[AddedRequirement, ...] = ()

    @property
    def missing(self) -> Tuple[Supplied, ...]:
        return tuple(item for item in self.supplied if item.entry is None)


@dataclass(frozen=True)
class LockResult:
    path: str
    lock: Lock
    changed: bool
    job: LockJob


# --- inputs ------------------------------------------------------------------------------------------

def _exact_pin(text: str, where: str) -> Tuple[str, str]:
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise LockGenError(f"{where}: {text!r} is not a requirement ({exc})") from None
    specs = list(requirement.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version or requirement.marker \
            or requirement.extras:
        raise LockGenError(f"{where}: {text!r} must be an exact pin name==version (a supplied file has one version)")
    return requirement.name, specs[0].version


def added_requirement(item: Any, where: str, pins: Sequence[str] = ()) -> AddedRequirement:
    """One entry of a lock block's `requirements`: a mapping with an exact pin name[extras]==version (extras
    allowed, no marker: a lock is resolved for one platform, and every node of a Ray cluster needs the same
    version), a reason and a source; `pins` are the release's own pins, which it must not repeat."""
    if not isinstance(item, dict) or not all(str(item.get(key) or "").strip()
                                             for key in ("requirement", "reason", "source")):
        raise LockGenError(f"{where}: expected a mapping with requirement, reason and source, e.g. "
                           "{requirement: \"ray[default]==2.34.0\", reason: ..., source: ...}")
    text = str(item["requirement"]).strip()
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0]
        raise LockGenError(f"{where}.requirement: {text!r} is not a requirement ({reason}); write "
                           "name[extras]==version") from None
    specs = list(requirement.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version or requirement.marker:
        raise LockGenError(f"{where}.requirement: {text!r} must be an exact pin name[extras]==version without a "
                           "marker (the lock installs one version on every node), e.g. ray[default]==2.34.0")
    if canonical_name(requirement.name) in {canonical_name(pin) for pin in pins}:
        raise LockGenError(f"{where}.requirement: {requirement.name} is already one of the release's pins; drop it "
                           "here or change the pin")
    return AddedRequirement(requirement=text, source=str(item["source"]).strip())


def _check_python(python: str) -> str:
    if not re.fullmatch(r"3\.\d+", str(python)):
        raise LockGenError(f"python {python!r}: expected a minor version like 3.10")
    return str(python)


def _uv_exclude_newer(value: str) -> str:
    # uv reads a bare date in the local time zone; midnight UTC makes the cut the same on every machine.
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        return f"{value}T00:00:00Z"
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})", value):
        return value
    raise LockGenError(f"exclude_newer {value!r}: expected a date YYYY-MM-DD or an RFC 3339 timestamp")


def lock_inputs(release: Any) -> Dict[str, Any]:
    """The release's lock block, checked for what the generator reads."""
    where = f"data/vllm-releases.yml releases.{release.version}.lock"
    block = release.get("lock")
    if not isinstance(block, dict):
        raise LockGenError(f"vLLM {release.version} has no lock block in data/vllm-releases.yml; add one "
                           "(exclude_newer, platform, pythons, constraints, supplied) to lock it")
    for key in ("exclude_newer", "platform", "pythons"):
        if not block.get(key):
            raise LockGenError(f"{where}.{key}: missing or empty")
    for key in ("constraints", "supplied"):
        for n, item in enumerate(block.get(key) or []):
            if not isinstance(item, dict) or not item.get("requirement") or not item.get("source"):
                raise LockGenError(f"{where}.{key}[{n}]: expected a mapping with requirement, reason and source")
    lock_requirements(release, block)
    return block


def lock_requirements(release: Any, block: Optional[Dict[str, Any]] = None) -> Tuple[AddedRequirement, ...]:
    """The release's extra requirements (`lock.requirements`, optional), checked; () without any."""
    where = f"data/vllm-releases.yml releases.{release.version}.lock.requirements"
    block = block if block is not None else (release.get("lock") or {})
    items = block.get("requirements") or []
    if not isinstance(items, list):
        raise LockGenError(f"{where}: expected a list of mappings with requirement, reason and source")
    pins = [name for name in release.pins if name not in NOT_PACKAGES]
    added = tuple(added_requirement(item, f"{where}[{n}]", pins) for n, item in enumerate(items))
    names = [canonical_name(Requirement(a.requirement).name) for a in added]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise LockGenError(f"{where}: {', '.join(twice)} is listed more than once; keep one entry per distribution")
    return added


def find_supplied(requirement: str, source: str, supply_dir: Optional[str], where: str) -> Supplied:
    """Hash the supply directory's wheels of an exact pin; without a directory, the pin is missing."""
    name, version = _exact_pin(requirement, where)
    if supply_dir is None:
        return Supplied(requirement=requirement, source=source, entry=None)
    if not os.path.isdir(supply_dir):
        raise LockGenError(f"--supply {supply_dir}: not a directory; give the directory holding the wheel of "
                           f"{requirement}")
    found: List[str] = []
    seen: List[str] = []
    for file_name in sorted(os.listdir(supply_dir)):
        if not file_name.endswith(".whl"):
            continue
        try:
            wheel_name, wheel_version, _, _ = parse_wheel_filename(file_name)
        except InvalidWheelFilename:
            continue
        if canonical_name(wheel_name) == canonical_name(name):
            seen.append(file_name)
            if wheel_version == Version(version):
                found.append(file_name)
    if not found:
        raise LockGenError(
            f"--supply {supply_dir}: no wheel of {requirement} in it (wheels of {name} there: "
            f"{', '.join(seen) or 'none'}); put {name}-{version}-<tags>.whl there (the install is binary-only)")
    hashes = []
    requires: List[str] = []
    for file_name in found:
        path = os.path.join(supply_dir, file_name)
        with open(path, "rb") as handle:
            hashes.append("sha256:" + hashlib.sha256(handle.read()).hexdigest())
        requires.extend(wheel_requires(path))
    return Supplied(requirement=requirement, source=source,
                    entry=LockEntry(name=name, version=version, hashes=tuple(sorted(set(hashes)))),
                    files=tuple(found), requires=tuple(sorted(set(requires))))


def wheel_requires(path: str) -> List[str]:
    """The wheel's Requires-Dist that apply without extras (they must be in the lock too)."""
    try:
        with zipfile.ZipFile(path) as wheel:
            names = [n for n in wheel.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if len(names) != 1:
                raise LockGenError(f"{path}: expected one <name>-<version>.dist-info/METADATA, found {len(names)}")
            metadata = email.parser.Parser().parsestr(wheel.read(names[0]).decode("utf-8"))
    except zipfile.BadZipFile as exc:
        raise LockGenError(f"{path}: not a wheel ({exc}); supply the .whl file itself") from None
    requires = []
    for text in metadata.get_all("Requires-Dist") or []:
        try:
            marker = Requirement(text).marker
        except InvalidRequirement as exc:
            raise LockGenError(f"{path}: its METADATA has a malformed Requires-Dist {text!r} ({exc})") from None
        if marker is None or "extra" not in str(marker):
            requires.append(text.strip())
    return requires


def regenerate_command(*words: str) -> str:
    return " ".join(shlex.quote(word) for word in ("bin/revive", "lock") + words)


def release_job(release: Any, python: str, supply_dir: Optional[str] = None,
                index_url: str = DEFAULT_INDEX) -> LockJob:
    """The lock job of one release for one Python minor version."""
    block = lock_inputs(release)
    where = f"data/vllm-releases.yml releases.{release.version}.lock"
    python = _check_python(python)
    pythons = [str(p) for p in block["pythons"]]
    if python not in pythons:
        raise LockGenError(f"vLLM {release.version} is locked for Python {', '.join(pythons)}, not {python}; "
                           f"add it to {where}.pythons to lock it")
    supplied = tuple(find_supplied(str(item["requirement"]), str(item["source"]).strip(), supply_dir,
                                   f"{where}.supplied[{n}]")
                     for n, item in enumerate(block.get("supplied") or []))
    added = lock_requirements(release, block)
    requirements = [f"{name}=={version}" for name, version in release.pins.items() if name not in NOT_PACKAGES]
    requirements.extend(item.requirement for item in added)
    for item in supplied:
        requirements.extend(r for r in item.requires if r not in requirements)
    words = [release.version, "--python", python]
    if supplied and supply_dir is not None:
        words += ["--supply", supply_dir]  # only where it changes the lock, so other locks stay byte-identical
    if index_url != DEFAULT_INDEX:
        words += ["--index-url", index_url]
    return LockJob(
        release=release.version, python=python, platform=str(block["platform"]), index=index_url,
        index_flags=("--index-url", index_url), exclude_newer=str(block["exclude_newer"]),
        requirements=tuple(requirements),
        constraints=tuple(Constraint(str(item["requirement"]), str(item["source"]).strip())
                          for item in block.get("constraints") or []),
        supplied=supplied, command=regenerate_command(*words), added=added)


def wheelhouse_job(requirements: Sequence[str], wheelhouse: str, python: str, out: str,
                   platform: Optional[str] = None) -> LockJob:
    """The lock job of a requirement set against a local wheelhouse only (the lab)."""
    if not requirements:
        raise LockGenError("give at least one --requirement to lock against the wheelhouse")
    if not os.path.isdir(wheelhouse):
        raise LockGenError(f"--wheelhouse {wheelhouse}: not a directory (build it first, e.g. "
                           "lab/vllm_twin/build_wheelhouse.py --dest DIR)")
    release = None
    for text in requirements:
        match = re.fullmatch(r"\s*vllm\s*==\s*([^\s;]+)\s*", text)
        if match:
            release = match.group(1)
    words = ["--wheelhouse", wheelhouse]
    for text in requirements:
        words += ["--requirement", text]
    words += ["--python", _check_python(python)]
    if platform:
        words += ["--platform", platform]
    words += ["--out", out]
    return LockJob(
        release=release, python=python, platform=platform, index=f"none (--no-index --find-links {wheelhouse})",
        index_flags=("--no-index", "--find-links", wheelhouse), exclude_newer=None,
        requirements=tuple(requirements), constraints=(), supplied=(), command=regenerate_command(*words),
        offline=True)


# --- uv -----------------------------------------------------------------------------------------------

def find_uv() -> str:
    """The uv next to this interpreter (the control venv's), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "uv")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("uv")
    if found:
        return found
    raise LockGenError(f"uv is neither next to {sys.executable} nor on PATH; install the pinned one into the "
                       "control venv: .venv/bin/pip install -r requirements.txt (it pins uv==0.13.8)")


def uv_version(uv: str) -> str:
    """'uv 0.13.8' (the first two words of `uv --version`), recorded as the lock's resolver."""
    proc = subprocess.run([uv, "--version"], capture_output=True, text=True, timeout=60)
    words = proc.stdout.split()
    if proc.returncode != 0 or len(words) < 2:
        raise LockGenError(f"{uv} --version failed (rc {proc.returncode}): {proc.stderr.strip() or proc.stdout}")
    return f"{words[0]} {words[1]}"


def input_files(job: LockJob) -> Dict[str, str]:
    """The files uv reads, by their name in its working directory."""
    files = {REQUIREMENTS_FILE: "".join(f"{r}\n" for r in job.requirements)}
    if job.constraints:
        files[CONSTRAINTS_FILE] = "".join(f"{c.requirement}\n" for c in job.constraints)
    if job.supplied:
        # Excluded packages are dropped from the resolution with their own dependencies (uv --excludes):
        # the index has no file of them, so resolving them would fail (vllm-project/vllm#23983).
        files[EXCLUDES_FILE] = "".join(f"{canonical_name(_exact_pin(s.requirement, 'supplied')[0])}\n"
                                       for s in job.supplied)
    return files


def uv_argv(job: LockJob, uv: str = "uv") -> List[str]:
    argv = [uv, "--no-config", "pip", "compile", REQUIREMENTS_FILE]
    if job.constraints:
        argv += ["-c", CONSTRAINTS_FILE]
    if job.supplied:
        argv += ["--excludes", EXCLUDES_FILE]
    argv += ["--python-version", job.python]
    if job.platform:
        argv += ["--python-platform", job.platform]
    argv += ["--only-binary", ":all:", "--generate-hashes"]
    if job.exclude_newer:
        argv += ["--exclude-newer", _uv_exclude_newer(job.exclude_newer)]
    argv += list(job.index_flags)
    if job.offline:
        argv.append("--offline")
    return argv + ["--no-header", "--quiet", "-o", OUTPUT_FILE]


def uv_env() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in UV_TRANSPORT_ENV}


def compile_body(job: LockJob, uv: str) -> str:
    """Run uv in a fresh directory and return its output (requirements, hashes, `# via` annotations)."""
    # A fresh directory: uv would take an existing -o file's pins as preferences.
    with tempfile.TemporaryDirectory(prefix="revive-lock-") as work:
        for name, text in input_files(job).items():
            with open(os.path.join(work, name), "w", encoding="utf-8") as handle:
                handle.write(text)
        argv = uv_argv(job, uv)
        try:
            proc = subprocess.run(argv, cwd=work, env=uv_env(), capture_output=True, text=True, timeout=UV_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ResolveError(f"uv did not finish in {UV_TIMEOUT_S} s locking {job.command}") from None
        if proc.returncode != 0:
            raise ResolveError(f"uv could not resolve `{job.command}` (rc {proc.returncode}; ran "
                               f"{shlex.join(argv)}):\n{proc.stderr.strip()}")
        with open(os.path.join(work, OUTPUT_FILE), encoding="utf-8") as handle:
            return handle.read()


# --- the file -----------------------------------------------------------------------------------------

def header_for(job: LockJob, resolver: str) -> Dict[str, List[str]]:
    header: Dict[str, List[str]] = {
        "python": [job.python],
        "platform": [job.platform or "host (uv's default: the running interpreter's)"],
        "index": [job.index],
        "exclude-newer": [job.exclude_newer or "none"],
        "requirement": [f"{r.requirement}{SOURCE_SEPARATOR}{r.source}" for r in job.added],
        "constraint": [f"{c.requirement}{SOURCE_SEPARATOR}{c.source}" for c in job.constraints],
        "supplied": [f"{s.requirement}{SOURCE_SEPARATOR}{s.source}" for s in job.supplied if s.entry],
        "missing": [f"{s.requirement}{SOURCE_SEPARATOR}{s.source}" for s in job.missing],
        "resolver": [resolver],
        "command": [job.command],
    }
    if job.release:
        header["release"] = [job.release]
    return header


def _blocks(body: str) -> List[Tuple[str, str]]:
    """uv's output cut into (canonical name, text) per requirement, in its order."""
    blocks: List[Tuple[str, List[str]]] = []
    for line in body.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):
            blocks.append((canonical_name(re.split(r"[=<>!~;\[ \\]", line, maxsplit=1)[0]), [line]))
        elif blocks:
            blocks[-1][1].append(line)
        elif line.strip():
            raise LockGenError(f"uv's output starts with {line!r} instead of a requirement (was --no-header lost?)")
    return [(name, "\n".join(lines).rstrip() + "\n") for name, lines in blocks]


def supplied_block(item: Supplied) -> str:
    assert item.entry is not None
    lines = [f"{item.entry.name}=={item.entry.version} \\"]
    lines += [f"    --hash={h} \\" for h in item.entry.hashes[:-1]] + [f"    --hash={item.entry.hashes[-1]}"]
    lines.append(f"    # supplied (not on the index: {item.source}): {', '.join(item.files)}")
    return "\n".join(lines) + "\n"


def render_lock(job: LockJob, body: str, resolver: str) -> str:
    """Header + uv's body with the supplied entries in name order; checked by parsing it back."""
    blocks = _blocks(body)
    for item in job.supplied:
        key = canonical_name(_exact_pin(item.requirement, "supplied")[0])
        if any(name == key for name, _ in blocks):
            raise LockGenError(f"uv resolved {key}, which {job.command} excludes as supplied; check the excludes "
                               "(uv --excludes) of the resolver version in use")
        if item.entry is None:
            continue
        position = next((n for n, (name, _) in enumerate(blocks) if name > key), len(blocks))
        blocks.insert(position, (key, supplied_block(item)))
    text = render_header(header_for(job, resolver)) + "".join(block for _, block in blocks)
    try:
        lock = parse_lock(text, f"generated by {job.command}")
    except LockError as exc:
        raise LockGenError(f"the generated lock does not parse: {exc}") from None
    for text_requirement in job.requirements:
        requirement = Requirement(text_requirement)
        if requirement.marker is not None:
            continue  # a supplied wheel's conditional dependency: uv decided whether it applies
        entry = lock.get(requirement.name)
        if entry is None or not requirement.specifier.contains(entry.version, prereleases=True):
            raise LockGenError(f"the lock for `{job.command}` pins {entry or 'nothing'} for {text_requirement}")
    return text


def write_atomic(path: str, text: str) -> bool:
    """Write `text` to `path` through a temporary file and a rename; False when it was already identical."""
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return False
    except FileNotFoundError:
        pass
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


def generate(job: LockJob, out: str, uv: Optional[str] = None) -> LockResult:
    uv = uv or find_uv()
    text = render_lock(job, compile_body(job, uv), uv_version(uv))
    changed = write_atomic(out, text)
    return LockResult(path=out, lock=parse_lock(text, out), changed=changed, job=job)


def lock_release(release: Any, python: str, out_dir: str, supply_dir: Optional[str] = None,
                 index_url: str = DEFAULT_INDEX, uv: Optional[str] = None) -> LockResult:
    """Lock one release for one Python into out_dir/vllm-<version>-py<X.Y>.txt."""
    job = release_job(release, python, supply_dir, index_url)
    return generate(job, os.path.join(out_dir, lock_file_name(release.version, python)), uv)


def lock_wheelhouse(requirements: List[str], wheelhouse: str, python: str, out: str,
                    platform: Optional[str] = None, uv: Optional[str] = None) -> LockResult:
    """Lock a requirement set against a local wheelhouse only (no index, no upload-date cut) into `out`."""
    return generate(wheelhouse_job(requirements, wheelhouse, python, out, platform), out, uv)
