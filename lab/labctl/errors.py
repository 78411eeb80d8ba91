"""The one exception the lab raises for a condition the user can fix; the CLI prints it without a traceback."""
from __future__ import annotations


class LabError(Exception):
    """What went wrong, where, and how to fix it, in one message."""
