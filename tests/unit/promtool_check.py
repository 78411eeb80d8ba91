"""promtool for the monitoring tests: a check that needs it is never skipped; without it the test fails saying how
to install it (Debian 12's `prometheus` package ships promtool 2.42; .ci/run installs it)."""
from __future__ import annotations

import functools
import shutil

PROMTOOL = shutil.which("promtool")


def requires_promtool(test):
    @functools.wraps(test)
    def run(*args, **kwargs):
        assert PROMTOOL, "promtool is not installed: apt-get install prometheus (Debian 12 ships promtool 2.42 in it)"
        return test(*args, **kwargs)
    return run
