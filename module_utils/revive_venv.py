"""A Python virtual environment with exact pins, built once and trusted only when complete.

Used by library/pip_venv.py: the preflight's probe venv (nvidia-ml-py) and the runtime's release venvs
(vllm, torch, xformers; issue 6). Rules:

- Pins are exact (`name==version`); versions are compared as PEP 440 does, so `==0.5.4` is satisfied by
  `0.5.4+sim` (a specifier without a local label ignores the candidate's label) and the label is reported.
- The source is the public index, an internal mirror (index URL, optionally a trusted plain-HTTP host) or
  a wheelhouse directory on the node (`--no-index --find-links`).
- pip installs exactly a lock (module_utils/revive_lockfile.py format: every distribution `==`-pinned with
  the sha256 of its files) and nothing else: `--require-hashes --only-binary :all: --no-deps -r LOCK`. No
  resolution happens on the node, no sdist is ever built there (building one runs its code as root), and
  the lock must pin every requested package at its version. A lock that names distributions it could not
  hash (`# missing:`) is refused.
- Completion marker: `<venv>/.revive-venv.json`, holding the pins, is written last. A venv without it (a
  failed or interrupted build) is never used: it is removed and built again. A complete venv whose
  installed versions still match the pins is left alone.
- Commands are argv lists run through an injected runner (AnsibleModule.run_command in the module).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ansible.module_utils import revive_lockfile as lockfile
from ansible.module_utils.revive_files import write_json_atomic

MARKER = ".revive-venv.json"
MARKER_SCHEMA = 1
PUBLIC_INDEX = "https://pypi.org/simple"
SOURCE_TYPES = ("index", "mirror", "wheelhouse")

# (rc, stdout, stderr) for an argv; AnsibleModule.run_command has this shape.
Runner = Callable[[List[str]], Tuple[int, str, str]]

# What the venv's interpreter reports about itself and its distributions; run with -I so that nothing in
# the working directory or PYTHONPATH can shadow what is installed.
_INSPECT = (
    "import json, sys\n"
    "from importlib import metadata\n"
    "dists = {}\n"
    "for d in metadata.distributions():\n"
    "    name = d.metadata['Name']\n"
    "    if name:\n"
    "        dists[name] = d.version\n"
    "print(json.dumps({'version': '%d.%d.%d' % sys.version_info[:3], 'prefix': sys.prefix,"
    " 'base_prefix': sys.base_prefix, 'distributions': dists}))\n"
)
_IMPORT_VERSION = (
    "import importlib, json, sys\n"
    "module = importlib.import_module(sys.argv[1])\n"
    "print(json.dumps({'version': getattr(module, '__version__', None), 'file': getattr(module, '__file__', None)}))\n"
)
_PYTHON_VERSION = "import sys; print('%d.%d.%d' % sys.version_info[:3])"


class VenvError(Exception):
    """The venv cannot be made or trusted; the message says what, where and how to fix it."""


# --- names, versions and pins (PEP 503, PEP 440) -------------------------------------------------------

def canonical_name(name: str) -> str:
    """PEP 503 normalisation: `Nvidia_ML.py` and `nvidia-ml-py` are the same project."""
    return re.sub(r"[-_.]+", "-", name).lower()


_VERSION = re.compile(
    r"""^\s*v?
    (?:(?P<epoch>\d+)!)?
    (?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre_l>alpha|beta|preview|pre|rc|a|b|c)[-_.]?(?P<pre_n>\d+)?)?
    (?:-(?P<post_n1>\d+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d+)?)?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$""",
    re.VERBOSE | re.IGNORECASE,
)
_PRE_LETTERS = {"alpha": "a", "a": "a", "beta": "b", "b": "b", "c": "rc", "pre": "rc", "preview": "rc", "rc": "rc"}


@dataclass(frozen=True)
class Version:
    """A parsed PEP 440 version: `public` compares equal for equal versions, `local` is the label or None."""

    text: str
    public: tuple
    local: Optional[str]


def parse_version(text: str) -> Version:
    match = _VERSION.match(text)
    if not match:
        # Not PEP 440 (legacy): only the exact text can match.
        return Version(text, ("legacy", text.strip()), None)
    release = tuple(int(part) for part in match.group("release").split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    pre = (_PRE_LETTERS[match.group("pre_l").lower()], int(match.group("pre_n") or 0)) if match.group("pre_l") else None
    post_n = match.group("post_n1") or match.group("post_n2")
    post = int(post_n or 0) if (match.group("post_n1") or match.group("post_l")) else None
    dev = int(match.group("dev_n") or 0) if match.group("dev_l") else None
    local = match.group("local")
    local = re.sub(r"[-_]", ".", local.lower()) if local else None
    return Version(text, (int(match.group("epoch") or 0), release, pre, post, dev), local)


def satisfies_pin(installed: str, pinned: str) -> bool:
    """`installed` matches `==pinned` (PEP 440: a pin without a local label ignores the installed label)."""
    have, want = parse_version(installed), parse_version(pinned)
    if have.public != want.public:
        return False
    return want.local is None or have.local == want.local


@dataclass(frozen=True)
class Pin:
    name: str
    version: str

    @property
    def key(self) -> str:
        return canonical_name(self.name)

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


_PIN = re.compile(r"^\s*(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*==\s*(?P<version>[^\s;=<>!~*,]+)\s*$")


def parse_pin(text: str) -> Pin:
    match = _PIN.match(text)
    if not match:
        raise VenvError(f"package {text!r} is not an exact pin: write name==version (e.g. nvidia-ml-py==13.615.71); "
                        "ranges, wildcards, extras and markers are not accepted, so every node gets the same build")
    return Pin(match.group("name"), match.group("version"))


def parse_pins(texts: List[str]) -> List[Pin]:
    pins = [parse_pin(text) for text in texts]
    seen: Dict[str, Pin] = {}
    for pin in pins:
        if pin.key in seen:
            raise VenvError(f"packages pin {pin.name} twice ({seen[pin.key]} and {pin}); keep one")
        seen[pin.key] = pin
    if not pins:
        raise VenvError("packages is empty: give at least one name==version")
    return pins


def parse_lock(text: str, where: str) -> List[Pin]:
    """The pins of a complete hash lock (module_utils/revive_lockfile.py, the format bin/revive lock writes)."""
    try:
        lock = lockfile.parse_lock(text, where)
        lock.require_complete()
    except lockfile.LockError as error:
        raise VenvError(str(error)) from None
    return [Pin(entry.name, entry.version) for entry in lock.entries]


def check_lock_covers(pins: List[Pin], lock_pins: List[Pin], where: str) -> None:
    locked = {pin.key: pin for pin in lock_pins}
    problems = []
    for pin in pins:
        found = locked.get(pin.key)
        if found is None:
            problems.append(f"{pin} is not in it")
        elif not satisfies_pin(found.version, pin.version):
            problems.append(f"it pins {found} where packages ask {pin}")
    if problems:
        raise VenvError(f"lock {where} does not match the packages: " + "; ".join(problems) +
                        ". Regenerate the lock for these pins (e.g. `pip-compile --generate-hashes`)")


# --- the source ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    type: str = "index"
    index_url: Optional[str] = None
    trusted_host: Optional[str] = None
    wheelhouse: Optional[str] = None

    def describe(self) -> str:
        if self.type == "wheelhouse":
            return f"wheelhouse {self.wheelhouse}"
        return f"{self.type} {self.index_url or PUBLIC_INDEX}"


# The `source` option of every module that reads packages (pip_venv, pip_source_check, wheel_cache).
SOURCE_ARGUMENT_SPEC = {
    "type": {"type": "str", "choices": list(SOURCE_TYPES), "default": "index"},
    "index_url": {"type": "str"},
    "trusted_host": {"type": "str"},
    "wheelhouse": {"type": "path"},
}


def source_from_params(params: Optional[dict]) -> Source:
    params = dict(params or {})
    kind = params.get("type") or "index"
    if kind not in SOURCE_TYPES:
        raise VenvError(f"source.type {kind!r} is not one of {', '.join(SOURCE_TYPES)}")
    source = Source(kind, params.get("index_url") or None, params.get("trusted_host") or None,
                    params.get("wheelhouse") or None)
    if kind == "mirror" and not source.index_url:
        raise VenvError("source.type mirror needs source.index_url (the mirror's simple index, e.g. "
                        "https://pypi.internal.example/simple)")
    if kind == "wheelhouse" and not source.wheelhouse:
        raise VenvError("source.type wheelhouse needs source.wheelhouse (a directory of wheels on the node)")
    return source


def source_args(source: Source) -> List[str]:
    if source.type == "wheelhouse":
        return ["--no-index", "--find-links", source.wheelhouse or ""]
    args = ["--index-url", source.index_url or PUBLIC_INDEX]
    if source.trusted_host:
        args += ["--trusted-host", source.trusted_host]
    return args


def venv_python(path: str) -> str:
    return os.path.join(path, "bin", "python")


def pip_install_argv(path: str, source: Source, lock: str) -> List[str]:
    """`python -m pip install` of exactly the lock in the venv.

    --isolated: no pip.conf or PIP_* variable changes the source; --require-hashes: every file must match the
    lock; --only-binary :all:: never build an sdist (its setup code would run as root); --no-deps: nothing the
    lock does not name (check_lock_covers has made sure it holds every requested pin).
    """
    argv = [venv_python(path), "-m", "pip", "install", "--isolated", "--disable-pip-version-check", "--no-input",
            "--progress-bar", "off"]
    argv += source_args(source)
    argv += ["--require-hashes", "--only-binary", ":all:", "--no-deps", "-r", lock]
    return argv


# --- the venv as found ---------------------------------------------------------------------------------

@dataclass
class Found:
    """What is at the venv path now."""

    exists: bool
    is_venv: bool = False
    marker: Optional[dict] = None
    marker_error: Optional[str] = None
    python_version: Optional[str] = None
    distributions: Dict[str, str] = field(default_factory=dict)
    python_error: Optional[str] = None


def read_marker(path: str) -> Tuple[Optional[dict], Optional[str]]:
    marker_path = os.path.join(path, MARKER)
    if not os.path.exists(marker_path):
        return None, None
    try:
        with open(marker_path, encoding="utf-8") as handle:
            marker = json.load(handle)
    except (OSError, ValueError) as error:
        return None, f"completion marker {marker_path} is unreadable ({error})"
    if not isinstance(marker, dict) or marker.get("schema") != MARKER_SCHEMA or not isinstance(marker.get("pins"), list):
        return None, f"completion marker {marker_path} is not one this module wrote"
    return marker, None


def inspect_venv(path: str, run: Runner) -> Found:
    if not os.path.lexists(path):
        return Found(exists=False)
    found = Found(exists=True, is_venv=os.path.isfile(os.path.join(path, "pyvenv.cfg")))
    if not found.is_venv:
        return found
    found.marker, found.marker_error = read_marker(path)
    python = venv_python(path)
    if not os.path.exists(python):
        found.python_error = f"{python} is missing"
        return found
    rc, out, err = run([python, "-I", "-c", _INSPECT])
    if rc != 0:
        found.python_error = f"{python} does not run ({_tail(err or out, 3)})"
        return found
    try:
        report = json.loads(out)
    except ValueError:
        found.python_error = f"{python} printed no report: {_tail(out, 3)}"
        return found
    found.python_version = report["version"]
    found.distributions = {canonical_name(name): version for name, version in report["distributions"].items()}
    return found


def installed_versions(pins: List[Pin], distributions: Dict[str, str]) -> Dict[str, Optional[str]]:
    return {pin.name: distributions.get(pin.key) for pin in pins}


def mismatches(pins: List[Pin], distributions: Dict[str, str]) -> List[str]:
    out = []
    for pin in pins:
        have = distributions.get(pin.key)
        if have is None:
            out.append(f"{pin.name} is not installed")
        elif not satisfies_pin(have, pin.version):
            out.append(f"{pin.name} is {have}, not {pin.version}")
    return out


def minor(version: Optional[str]) -> Optional[str]:
    return ".".join(version.split(".")[:2]) if version else None


# --- the decision -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    action: str  # unchanged | create | rebuild
    reason: str


def decide(found: Found, pins: List[Pin], lock_pins: List[Pin], base_python_version: str, path: str) -> Decision:
    """Leave, create or rebuild the venv at `path` (pure: everything it needs is in `found`)."""
    if not found.exists:
        return Decision("create", f"{path} does not exist")
    if not found.is_venv:
        if os.path.isdir(path) and not os.listdir(path):
            return Decision("create", f"{path} is an empty directory")
        raise VenvError(f"{path} exists and is not a virtual environment (no pyvenv.cfg); refusing to delete it. "
                        "Move it away or choose another path")
    if found.marker is None:
        why = found.marker_error or f"no completion marker {MARKER}: a previous build failed or was interrupted"
        return Decision("rebuild", f"half-built venv: {why}")
    if found.python_error:
        return Decision("rebuild", f"the venv's interpreter is broken: {found.python_error}")
    if minor(found.python_version) != minor(base_python_version):
        return Decision("rebuild", f"the venv runs Python {found.python_version}, the requested interpreter is "
                                   f"Python {base_python_version}")
    wanted = sorted(str(pin) for pin in pins)
    if sorted(found.marker.get("pins", [])) != wanted:
        return Decision("rebuild", f"pins changed: built for {', '.join(sorted(found.marker['pins']))}; "
                                   f"asked for {', '.join(wanted)}")
    wrong = mismatches(pins + [p for p in lock_pins if p.key not in {q.key for q in pins}], found.distributions)
    if wrong:
        return Decision("rebuild", "installed versions no longer match the pins: " + "; ".join(wrong))
    return Decision("unchanged", "installed versions match the pins")


# --- effects ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VenvSpec:
    path: str
    python: str
    packages: List[str]
    lock: str
    source: Source = Source()
    verify_import: Optional[str] = None
    verify_version: Optional[str] = None


@dataclass
class VenvResult:
    changed: bool
    action: str
    reason: str
    path: str
    python: str
    python_version: Optional[str]
    installed: Dict[str, Optional[str]]
    distributions: Dict[str, str]
    pip_argv: List[str]
    import_version: Optional[str] = None
    local_label: Optional[str] = None
    pins_before: List[str] = field(default_factory=list)
    pins_after: List[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "changed": self.changed, "decision": self.action, "reason": self.reason, "path": self.path,
            "python": self.python, "python_version": self.python_version, "installed": self.installed,
            "distributions": self.distributions, "pip_argv": self.pip_argv, "import_version": self.import_version,
            "local_label": self.local_label,
        }


def base_python_version(python: str, run: Runner, host: str) -> str:
    try:
        rc, out, err = run([python, "-I", "-c", _PYTHON_VERSION])
    except OSError as error:
        rc, out, err = 127, "", str(error)
    if rc != 0:
        raise VenvError(f"the interpreter {python!r} does not run on {host} ({_tail(err or out, 2)}); "
                        "install it or set python to one that exists (e.g. /usr/bin/python3)")
    return out.strip()


def expected_import_version(spec: VenvSpec, pins: List[Pin]) -> str:
    if spec.verify_version:
        return spec.verify_version
    by_name = {pin.key: pin for pin in pins}
    pin = by_name.get(canonical_name(spec.verify_import or ""))
    if pin is None:
        raise VenvError(f"verify_import {spec.verify_import!r} is not the name of a pinned package; give verify_version "
                        "(the version its __version__ must match)")
    return pin.version


def verify_import(spec: VenvSpec, pins: List[Pin], run: Runner, host: str) -> Tuple[str, Optional[str]]:
    """Import the module in the venv; its __version__ must satisfy the expected pin. Returns (version, label)."""
    want = expected_import_version(spec, pins)
    python = venv_python(spec.path)
    rc, out, err = run([python, "-I", "-c", _IMPORT_VERSION, spec.verify_import or ""])
    if rc != 0:
        raise VenvError(f"`import {spec.verify_import}` fails in {spec.path} on {host}: {_tail(err or out, 6)}. "
                        "The venv is kept for inspection and rebuilt on the next run")
    try:
        report = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise VenvError(f"`import {spec.verify_import}` in {spec.path} on {host} printed no version report: "
                        f"{_tail(out, 3)}") from None
    have = report.get("version")
    if not isinstance(have, str):
        raise VenvError(f"{spec.verify_import} in {spec.path} on {host} has no __version__ (imported from "
                        f"{report.get('file')}); drop verify_import or verify another module")
    if not satisfies_pin(have, want):
        raise VenvError(f"{spec.verify_import}.__version__ is {have} in {spec.path} on {host}, expected {want} "
                        f"(imported from {report.get('file')}): the source served another build. Check the "
                        "wheelhouse or mirror for stray wheels")
    return have, parse_version(have).local


def remove_venv(path: str) -> None:
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def write_marker(path: str, marker: dict) -> None:
    """Atomically, and last: its presence is what makes the venv usable."""
    write_json_atomic(os.path.join(path, MARKER), marker, sort_keys=True)


def ensure_venv(spec: VenvSpec, run: Runner, check_mode: bool, host: str) -> VenvResult:
    pins = parse_pins(spec.packages)
    # In check mode the task copying the wheelhouse or the lock may not have run for real: what is missing is
    # only fatal when something is to be built.
    lock_pins: List[Pin] = []
    if not spec.lock:
        raise VenvError("no lock given: a node installs only from a hash lock (bin/revive lock generates one)")
    if os.path.exists(spec.lock) or not check_mode:
        try:
            with open(spec.lock, encoding="utf-8") as handle:
                lock_text = handle.read()
        except OSError as error:
            raise VenvError(f"cannot read lock {spec.lock} on {host} ({error}); copy the lock to the node first") from None
        lock_pins = parse_lock(lock_text, spec.lock)
        check_lock_covers(pins, lock_pins, spec.lock)
    if spec.source.type == "wheelhouse" and not os.path.isdir(spec.source.wheelhouse or "") and not check_mode:
        raise VenvError(f"wheelhouse {spec.source.wheelhouse} is not a directory on {host}; copy the wheels there "
                        "first (the roles copy the controller's wheelhouse; in the lab build it with "
                        "`bin/lab wheelhouse`)")
    base_version = base_python_version(spec.python, run, host)
    found = inspect_venv(spec.path, run)
    decision = decide(found, pins, lock_pins, base_version, spec.path)
    argv = pip_install_argv(spec.path, spec.source, spec.lock)
    result = VenvResult(
        changed=decision.action != "unchanged", action=decision.action, reason=decision.reason, path=spec.path,
        python=venv_python(spec.path), python_version=found.python_version,
        installed=installed_versions(pins, found.distributions), distributions=found.distributions,
        pip_argv=argv, pins_before=sorted(found.marker.get("pins", [])) if found.marker else [],
        pins_after=sorted(str(pin) for pin in pins))
    if decision.action == "unchanged" and spec.verify_import:
        try:
            result.import_version, result.local_label = verify_import(spec, pins, run, host)
        except VenvError as error:
            # Metadata says complete but the package does not import: as untrustworthy as a half-built venv.
            result.changed, result.action, result.reason = True, "rebuild", f"the complete venv fails its check: {error}"
    if result.action == "unchanged":
        return result
    if check_mode:
        return result
    if result.action == "rebuild":
        remove_venv(spec.path)
    build(spec, argv, run, host)
    built = inspect_venv(spec.path, run)
    if built.python_error:
        raise VenvError(f"the new venv {spec.path} on {host} does not work: {built.python_error}")
    wrong = mismatches(pins + [p for p in lock_pins if p.key not in {q.key for q in pins}], built.distributions)
    if wrong:
        raise VenvError(f"after installing into {spec.path} on {host} from {spec.source.describe()}: " + "; ".join(wrong) +
                        ". The source serves other versions than the pins; the venv stays incomplete (no marker)")
    if spec.verify_import:
        result.import_version, result.local_label = verify_import(spec, pins, run, host)
    result.python_version = built.python_version
    result.distributions = built.distributions
    result.installed = installed_versions(pins, built.distributions)
    write_marker(spec.path, {
        "schema": MARKER_SCHEMA, "pins": sorted(str(pin) for pin in pins),
        "lock_pins": sorted(str(pin) for pin in lock_pins), "python": spec.python,
        "python_version": built.python_version, "source": spec.source.describe(),
        "installed": {pin.name: built.distributions.get(pin.key) for pin in pins},
    })
    return result


def build(spec: VenvSpec, argv: List[str], run: Runner, host: str) -> None:
    rc, out, err = run([spec.python, "-m", "venv", spec.path])
    if rc != 0:
        hint = ("install the python3-venv package (Debian/Ubuntu)" if "ensurepip" in (err + out) or "venv" in (err + out)
                else "check the interpreter and the directory's permissions")
        raise VenvError(f"`{spec.python} -m venv {spec.path}` failed on {host}: {_tail(err or out, 4)}; {hint}")
    rc, out, err = run(argv)
    if rc != 0:
        raise VenvError(f"pip could not install the lock {spec.lock} ({', '.join(spec.packages)}) into {spec.path} "
                        f"on {host} from {spec.source.describe()}:\n"
                        f"{_tail(err or out, 12)}\nThe venv has no completion marker, so it is never used and is "
                        "rebuilt on the next run; fix the source (a missing wheel, a hash, the index URL) and run again")


def _tail(text: str, lines: int) -> str:
    kept = [line for line in (text or "").strip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:]) if kept else "no output"
