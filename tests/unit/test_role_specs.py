"""Every role documents every default: meta/argument_specs.yml equals defaults/main.yml (style.md §2).

Generic over roles/*: a role added later is checked without editing this file.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
ROLE_DIRS = sorted(path for path in ROLES.iterdir() if path.is_dir() and not path.name.startswith(".")) \
    if ROLES.is_dir() else []
SPEC_TYPES = {"str", "int", "bool", "list", "dict", "float", "path", "raw", "jsonarg", "json", "bytes", "bits"}


def _load(path: Path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _defaults(role: Path) -> dict:
    path = role / "defaults" / "main.yml"
    return (_load(path) or {}) if path.exists() else {}


def _options(role: Path) -> dict:
    path = role / "meta" / "argument_specs.yml"
    assert path.exists(), f"{role.name}: meta/argument_specs.yml is missing"
    specs = (_load(path) or {}).get("argument_specs") or {}
    assert "main" in specs, f"{role.name}: meta/argument_specs.yml has no 'main' entry point"
    return specs["main"].get("options") or {}


def test_there_are_roles_to_check():
    assert ROLE_DIRS, f"no roles under {ROLES}"


@pytest.mark.parametrize("role", ROLE_DIRS, ids=lambda path: path.name)
def test_argument_spec_keys_equal_defaults_keys(role):
    defaults, options = set(_defaults(role)), set(_options(role))
    assert defaults - options == set(), f"{role.name}: defaults not documented in meta/argument_specs.yml"
    assert options - defaults == set(), f"{role.name}: argument specs without a default in defaults/main.yml"


@pytest.mark.parametrize("role", ROLE_DIRS, ids=lambda path: path.name)
def test_every_option_is_described_typed_prefixed_and_defaulted_as_in_defaults(role):
    defaults = _defaults(role)
    for name, option in _options(role).items():
        assert name.startswith(f"{role.name}_"), f"{role.name}: {name} lacks the role prefix"
        assert option.get("description"), f"{role.name}: {name} has no description"
        assert option.get("type") in SPEC_TYPES, f"{role.name}: {name} has type {option.get('type')!r}"
        if name in defaults:
            assert option.get("default") == defaults[name], \
                f"{role.name}: {name} default {option.get('default')!r} != defaults/main.yml {defaults[name]!r}"
        if option.get("choices") and name in defaults:
            assert defaults[name] in option["choices"], f"{role.name}: default of {name} is not one of its choices"
