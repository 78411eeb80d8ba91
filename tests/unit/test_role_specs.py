"""Every role documents every default: meta/argument_specs.yml equals defaults/main.yml, so that
`ansible-doc -t role -r roles <role>` (where each README points) shows every variable with its type and default.

Generic over roles/*: a role added later is checked without editing this file. Two roles differ by design:
revive_defaults declares the site-wide namespace (revive_*, not revive_defaults_*), and an internal role of
tasks_from entry points only (_common: no tasks/main.yml, no defaults) documents every entry point, each option
required.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"
ROLE_DIRS = sorted(path for path in ROLES.iterdir() if path.is_dir() and not path.name.startswith(".")) \
    if ROLES.is_dir() else []
SPEC_TYPES = {"str", "int", "bool", "list", "dict", "float", "path", "raw", "jsonarg", "json", "bytes", "bits"}
# The variable prefix of each role is its name plus "_", except the site-wide settings' home.
PREFIXES = {"revive_defaults": "revive_"}


def _prefix(role: Path) -> str:
    return PREFIXES.get(role.name, f"{role.name}_")


def _internal(role: Path) -> bool:
    """A role of tasks_from entry points only: no tasks/main.yml and no defaults."""
    return not (role / "tasks" / "main.yml").exists() and not (role / "defaults" / "main.yml").exists()


def _load(path: Path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _defaults(role: Path) -> dict:
    path = role / "defaults" / "main.yml"
    return (_load(path) or {}) if path.exists() else {}


def _specs(role: Path) -> dict:
    path = role / "meta" / "argument_specs.yml"
    assert path.exists(), f"{role.name}: meta/argument_specs.yml is missing"
    return (_load(path) or {}).get("argument_specs") or {}


def _options(role: Path) -> dict:
    specs = _specs(role)
    if _internal(role) and "main" not in specs:
        return {}
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
        assert name.startswith(_prefix(role)), f"{role.name}: {name} lacks the role prefix"
        assert option.get("description"), f"{role.name}: {name} has no description"
        assert option.get("type") in SPEC_TYPES, f"{role.name}: {name} has type {option.get('type')!r}"
        if name in defaults:
            assert option.get("default") == defaults[name], \
                f"{role.name}: {name} default {option.get('default')!r} != defaults/main.yml {defaults[name]!r}"
        # null in defaults/main.yml and no default in the spec: no default at all (revive_defaults: required).
        required = name in defaults and defaults[name] is None and "default" not in option
        if option.get("choices") and name in defaults and not required:
            assert defaults[name] in option["choices"], f"{role.name}: default of {name} is not one of its choices"


INTERNAL_ROLES = [role for role in ROLE_DIRS if _internal(role)]


@pytest.mark.parametrize("role", INTERNAL_ROLES, ids=lambda path: path.name)
def test_an_internal_role_documents_every_entry_point_and_requires_every_option(role):
    specs = _specs(role)
    assert specs, f"{role.name}: no entry points in meta/argument_specs.yml"
    for entry, spec in specs.items():
        assert (role / "tasks" / f"{entry}.yml").exists(), f"{role.name}: entry point {entry} has no tasks/{entry}.yml"
        assert spec.get("short_description"), f"{role.name}: entry point {entry} has no short_description"
        for name, option in (spec.get("options") or {}).items():
            assert name.startswith(_prefix(role)), f"{role.name}: {name} lacks the role prefix"
            assert option.get("description"), f"{role.name}: {name} has no description"
            assert option.get("type") in SPEC_TYPES, f"{role.name}: {name} has type {option.get('type')!r}"
            assert option.get("required") is True and "default" not in option, \
                f"{role.name}: {name} of entry point {entry} must be required (an internal role has no defaults)"
