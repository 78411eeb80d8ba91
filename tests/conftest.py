"""Shared pytest set-up: module_utils importable as `ansible.module_utils.revive_*`, paths to the repo."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bin"))

from revive_cli import use_module_utils  # noqa: E402

use_module_utils()


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
