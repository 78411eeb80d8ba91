"""Which wheel a node installs: wheel file names (PEP 427), tags (PEP 425/600) and Requires-Python.

Part of the wheel source check and the fleet cache (module_utils/revive_wheelsource.py). The target is a
CPython minor version ("3.10") and a manylinux platform ("manylinux_2_35_x86_64", or uv's spelling
"x86_64-manylinux_2_35"): the node's glibc. A wheel installs there when one of its tags is among the
target's, which are ordered like pip's (packaging.tags): most specific first, so the lowest rank is the
wheel pip prefers.

- interpreters: cpXY-cpXY, cpXY-abi3, cpXY-none, then cpXW-abi3 for older minors W; pyXY/py3/pyXW-none;
  anything-none-any last;
- platforms: manylinux_X_Y for every glibc from the target's down (newest first), with the legacy aliases
  manylinux2014 (2.17), manylinux2010 (2.12) and manylinux1 (2.5) at their glibc. linux_x86_64 (a local
  build, tied to the machine it was built on) and musllinux never count.

Stdlib only, Python >= 3.9: it runs on nodes.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Tuple

_LEGACY = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}
# Lowest glibc minor that manylinux wheels exist for, per architecture (packaging.tags does the same).
_OLDEST_MINOR = {"x86_64": 5, "i686": 5}
_DEFAULT_OLDEST_MINOR = 17


class TargetError(ValueError):
    """A Python version or platform that names no install target; the message says what to write."""


@dataclass(frozen=True)
class Target:
    """Where the wheels will be installed: CPython `python` (major, minor) on glibc `glibc` for `arch`."""

    python: Tuple[int, int]
    glibc: Tuple[int, int]
    arch: str

    @property
    def python_text(self) -> str:
        return f"{self.python[0]}.{self.python[1]}"

    @property
    def platform(self) -> str:
        return f"manylinux_{self.glibc[0]}_{self.glibc[1]}_{self.arch}"

    def describe(self) -> str:
        return f"CPython {self.python_text} on {self.platform}"


def parse_python(text: str) -> Tuple[int, int]:
    match = re.match(r"^\s*(?:cp|py|python)?(\d)\.?(\d+)(?:\.\d+)?\s*$", str(text))
    if not match or match.group(1) != "3":
        raise TargetError(f"python {text!r} is not a CPython 3 minor version: write e.g. 3.10 (the node's "
                          "interpreter of the venv: Ubuntu 22.04 has 3.10, Debian 12 has 3.11)")
    return int(match.group(1)), int(match.group(2))


def parse_platform(text: str) -> Tuple[Tuple[int, int], str]:
    """((glibc major, minor), arch) of 'manylinux_2_35_x86_64', 'x86_64-manylinux_2_35' or 'manylinux2014_x86_64'."""
    value = str(text).strip()
    match = re.match(r"^manylinux_(\d+)_(\d+)_([a-z0-9_]+)$", value) or \
        re.match(r"^(?P<arch>[a-z0-9_]+)-manylinux_(?P<major>\d+)_(?P<minor>\d+)$", value)
    if match and "arch" in match.groupdict():
        return (int(match.group("major")), int(match.group("minor"))), match.group("arch")
    if match:
        return (int(match.group(1)), int(match.group(2))), match.group(3)
    legacy = re.match(r"^(manylinux2014|manylinux2010|manylinux1)_([a-z0-9_]+)$", value)
    if legacy:
        return _LEGACY[legacy.group(1)], legacy.group(2)
    raise TargetError(f"platform {text!r} is not a manylinux platform: write the node's glibc and architecture as "
                      "manylinux_2_35_x86_64 (or x86_64-manylinux_2_35); Ubuntu 22.04 has glibc 2.35, Debian 12 "
                      "2.36 (`ldd --version`). linux_x86_64 and musllinux wheels are never installed")


def make_target(python: str, platform: str) -> Target:
    glibc, arch = parse_platform(platform)
    return Target(python=parse_python(python), glibc=glibc, arch=arch)


# --- the target's tags, most specific first ------------------------------------------------------------

def platform_tags(target: Target) -> List[str]:
    major, newest = target.glibc
    aliases = {version: name for name, version in _LEGACY.items()}
    oldest = _OLDEST_MINOR.get(target.arch, _DEFAULT_OLDEST_MINOR) if major == 2 else 0
    tags: List[str] = []
    for minor in range(newest, oldest - 1, -1):
        tags.append(f"manylinux_{major}_{minor}_{target.arch}")
        if (major, minor) in aliases:
            tags.append(f"{aliases[(major, minor)]}_{target.arch}")
    return tags


def supported_tags(target: Target) -> List[Tuple[str, str, str]]:
    """(interpreter, abi, platform) triples the target installs, in pip's order of preference."""
    major, minor = target.python
    platforms = platform_tags(target)
    cp = f"cp{major}{minor}"
    pairs = [(cp, cp), (cp, "abi3"), (cp, "none")]
    pairs += [(f"cp{major}{older}", "abi3") for older in range(minor - 1, 1, -1)]
    pythons = [f"py{major}{minor}", f"py{major}"] + [f"py{major}{older}" for older in range(minor - 1, -1, -1)]
    tags = [(interpreter, abi, platform) for interpreter, abi in pairs for platform in platforms]
    tags += [(python, "none", platform) for python in pythons for platform in platforms]
    tags += [(cp, "none", "any")] + [(python, "none", "any") for python in pythons]
    return tags


_RANKS: Dict[Target, Dict[Tuple[str, str, str], int]] = {}


def tag_ranks(target: Target) -> Dict[Tuple[str, str, str], int]:
    if target not in _RANKS:
        _RANKS[target] = {tag: rank for rank, tag in enumerate(supported_tags(target))}
    return _RANKS[target]


# --- wheel file names --------------------------------------------------------------------------------

@dataclass(frozen=True)
class WheelName:
    """A parsed wheel file name; `tags` is the expanded set of its compressed tag triples."""

    filename: str
    name: str
    version: str
    build: Tuple[int, str]
    tags: FrozenSet[Tuple[str, str, str]]
    tag_text: str


def parse_wheel_name(filename: str) -> Optional[WheelName]:
    """The parts of `name-version(-build)?-python-abi-platform.whl`, or None when it is no wheel name."""
    if not filename.endswith(".whl") or any(char in filename for char in "/\\\0") or filename.startswith("."):
        return None
    parts = filename[:-4].split("-")
    if len(parts) not in (5, 6) or not all(parts):
        return None
    build: Tuple[int, str] = (-1, "")
    if len(parts) == 6:
        match = re.match(r"^(\d+)(.*)$", parts[2])
        if not match:
            return None
        build = (int(match.group(1)), match.group(2))
    pythons, abis, platforms = parts[-3].split("."), parts[-2].split("."), parts[-1].split(".")
    tags = frozenset((p, a, pl) for p in pythons for a in abis for pl in platforms)
    return WheelName(filename=filename, name=parts[0], version=parts[1], build=build, tags=tags,
                     tag_text="-".join(parts[-3:]))


def wheel_rank(wheel: WheelName, target: Target) -> Optional[int]:
    """The rank of the wheel's best tag on the target (lower is preferred), None when it does not install."""
    ranks = tag_ranks(target)
    found = [ranks[tag] for tag in wheel.tags if tag in ranks]
    return min(found) if found else None


def why_not_installable(wheel: WheelName, target: Target) -> str:
    """A short reason a wheel does not install on the target (for messages)."""
    platforms = {platform for _, _, platform in wheel.tags}
    interpreters = {(python, abi) for python, abi, _ in wheel.tags}
    usable_platforms = set(platform_tags(target)) | {"any"}
    if not platforms & usable_platforms:
        needs = []
        for platform in sorted(platforms):
            match = re.match(r"^manylinux_(\d+)_(\d+)_(.+)$", platform)
            if match and match.group(3) == target.arch:
                needs.append(f"glibc {match.group(1)}.{match.group(2)}")
            elif platform.startswith("musllinux"):
                needs.append("musl")
            elif platform.startswith("linux_"):
                needs.append("a local build (linux_*, not manylinux)")
            else:
                needs.append(platform)
        return f"platform {'.'.join(sorted(platforms))} needs {' or '.join(needs)}, not {target.platform}"
    if not any((python, abi) in {(t[0], t[1]) for t in tag_ranks(target)} for python, abi in interpreters):
        return f"interpreter {'.'.join(sorted({t[0] for t in wheel.tags}))}-" \
               f"{'.'.join(sorted({t[1] for t in wheel.tags}))} is not CPython {target.python_text}"
    return f"tags {wheel.tag_text} are not among CPython {target.python_text}'s on {target.platform}"


# --- Requires-Python (PEP 345 / 503 data-requires-python) --------------------------------------------

def _release(text: str) -> Optional[Tuple[int, ...]]:
    match = re.match(r"^v?(\d+(?:\.\d+)*)", text.strip())
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def _pad(version: Tuple[int, ...], length: int) -> Tuple[int, ...]:
    return version + (0,) * (length - len(version))


def _clause_allows(clause: str, python: Tuple[int, ...]) -> Optional[bool]:
    match = re.match(r"^\s*(===|~=|==|!=|<=|>=|<|>)\s*(\S+)\s*$", clause)
    if not match:
        return None
    operator, text = match.groups()
    wildcard = text.endswith(".*")
    version = _release(text[:-2] if wildcard else text)
    if version is None:
        return None
    if wildcard and operator in ("==", "!="):
        prefix = python[:len(version)] == version if len(python) >= len(version) else \
            _pad(python, len(version)) == version
        return prefix if operator == "==" else not prefix
    length = max(len(version), len(python))
    have, want = _pad(python, length), _pad(version, length)
    if operator == "~=":
        if len(version) < 2:
            return None
        return have >= want and _pad(python, len(version))[:len(version) - 1] == version[:-1]
    return {"==": have == want, "===": have == want, "!=": have != want, "<=": have <= want,
            ">=": have >= want, "<": have < want, ">": have > want}[operator]


def python_allows(requires_python: Optional[str], target: Target) -> bool:
    """Whether Requires-Python admits the target's minor version as pip evaluates it (as X.Y.0 ... padded).

    A specifier that cannot be read admits it (pip ignores an invalid Requires-Python too)."""
    if not requires_python or not requires_python.strip():
        return True
    for clause in requires_python.split(","):
        if not clause.strip():
            continue
        allowed = _clause_allows(clause, target.python)
        if allowed is False:
            return False
    return True
