"""The project's module_utils (model facts, KV sizing, topology, performance model) inside the twin.

The twin reuses module_utils/revive_model.py, revive_kv.py, revive_topology.py and revive_perf.py instead
of re-implementing them, so the planner and the twin share one code: the twin's `# GPU blocks` line is the
planner's KV estimate, and its step timing comes from the planner's performance model (revive_perf.py).
They are imported as `ansible.module_utils.revive_*`, the names modules use (how AnsiballZ bundles them).
The wheel carries copies of these four files (BUNDLED_MODULE_UTILS of lab/vllm_twin/build_wheelhouse.py)
in vllm/_revive/module_utils/; a source checkout uses the repository's module_utils/. Either directory is
appended to `ansible.module_utils.__path__`; where ansible is not installed (lab nodes) a bare namespace
stands in, as bin/revive_cli/__init__.py does.
"""
from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from types import ModuleType

BUNDLED = Path(__file__).resolve().parent / "module_utils"
CHECKOUT = Path(__file__).resolve().parents[5] / "module_utils"


def module_utils_dir() -> Path:
    if (BUNDLED / "revive_kv.py").is_file():
        return BUNDLED
    return CHECKOUT


def _install() -> None:
    try:
        import ansible.module_utils as package
    except ImportError:
        ansible = types.ModuleType("ansible")
        ansible.__path__ = []  # type: ignore[attr-defined]
        package = types.ModuleType("ansible.module_utils")
        package.__path__ = []  # type: ignore[attr-defined]
        ansible.module_utils = package  # type: ignore[attr-defined]
        sys.modules["ansible"] = ansible
        sys.modules["ansible.module_utils"] = package
    directory = str(module_utils_dir())
    if directory not in package.__path__:
        package.__path__.append(directory)


def module_utils(name: str) -> ModuleType:
    """`ansible.module_utils.<name>`, e.g. module_utils("revive_kv")."""
    _install()
    return importlib.import_module(f"ansible.module_utils.{name}")
