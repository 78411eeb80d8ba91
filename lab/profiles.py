"""The lab's GPU hardware profiles (lab/profiles/<name>.json): list them and resolve a name to a file.

bin/lab uses this to install a profile into a GPU node and to answer an unknown name with the known ones:

    sys.path.insert(0, str(REPO / "lab")); import profiles
    path = profiles.profile_path("v100-pcie-8x")      # raises UnknownProfile listing the known names
"""
from __future__ import annotations

from pathlib import Path

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"


class UnknownProfile(ValueError):
    """A profile name that has no lab/profiles/<name>.json."""


def known_profiles(directory: Path = PROFILES_DIR) -> list[str]:
    """Profile names, sorted: every <name>.json in the profiles directory."""
    return sorted(path.stem for path in directory.glob("*.json"))


def profile_path(name: str, directory: Path = PROFILES_DIR) -> Path:
    """The JSON file of profile `name`; UnknownProfile("unknown GPU profile 'x'; known: a, b, c") otherwise."""
    path = directory / f"{name}.json"
    if "/" in name or not path.is_file():
        known = ", ".join(known_profiles(directory)) or f"none (no *.json in {directory})"
        raise UnknownProfile(f"unknown GPU profile {name!r}; known: {known}")
    return path
