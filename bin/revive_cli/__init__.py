"""Command-line front ends over the project's module_utils (no Ansible run needed)."""
from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
MODULE_UTILS = REPO / "module_utils"


def use_module_utils() -> None:
    """Make `ansible.module_utils.revive_*` importable from the checkout.

    Modules import their shared code as `ansible.module_utils.<name>` (AnsiballZ bundles it that way).
    Outside Ansible the same imports must resolve to ./module_utils; when ansible-core itself is not
    installed (e.g. on a GPU box with only pynvml), a bare namespace stands in for it.
    """
    try:
        import ansible.module_utils as module_utils_pkg
    except ImportError:
        ansible_pkg = types.ModuleType("ansible")
        ansible_pkg.__path__ = []
        module_utils_pkg = types.ModuleType("ansible.module_utils")
        module_utils_pkg.__path__ = []
        ansible_pkg.module_utils = module_utils_pkg
        sys.modules["ansible"] = ansible_pkg
        sys.modules["ansible.module_utils"] = module_utils_pkg
    if str(MODULE_UTILS) not in module_utils_pkg.__path__:
        module_utils_pkg.__path__.append(str(MODULE_UTILS))


def bounded_option(bound: Any, path: str, option: str) -> Callable[[str], Any]:
    """An argparse type for an option with a module_utils/revive_bounds.py Bound (`path`: the input's name in the
    bounds table): a bad value is refused at parse time (exit 2), the message under the option's name."""
    from ansible.module_utils.revive_bounds import InputError

    def parse(text: str) -> Any:
        try:
            return bound.parse(path, text)
        except InputError as exc:
            raise argparse.ArgumentTypeError(exc.message(option)) from None
    return parse
