"""Shared pytest set-up: module_utils importable as `ansible.module_utils.revive_*`, paths to the repo."""
from __future__ import annotations

import shutil
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


def _installed(tool: str, package: str = "prometheus") -> str:
    path = shutil.which(tool)
    if not path:
        pytest.fail(f"{tool} is not installed: the monitoring tests need it (Debian 12: apt-get install {package}; "
                    "prometheus ships prometheus and promtool 2.42; .ci/run installs it)")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    """Prometheus's promtool: a check that needs it is never skipped."""
    return _installed("promtool")


@pytest.fixture(scope="session")
def prometheus() -> str:
    return _installed("prometheus")


@pytest.fixture(scope="session")
def amtool() -> str:
    """Alertmanager's amtool (Debian's prometheus-alertmanager): the Alertmanager configuration is always checked."""
    return _installed("amtool", "prometheus-alertmanager")


@pytest.fixture(scope="session")
def blackbox_exporter() -> str:
    """The blackbox exporter (Debian's prometheus-blackbox-exporter), for its --config.check."""
    return _installed("prometheus-blackbox-exporter", "prometheus-blackbox-exporter")
