"""The part of vllm.utils the twin's command line needs."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence


class FlexibleArgumentParser(argparse.ArgumentParser):
    """argparse, accepting `--foo_bar` for `--foo-bar` as 0.5.4 does (docs/facts/vllm-volta.md §2.1).

    Only the option name is rewritten; the value after `=` is left alone. Everything else (unknown flags,
    bad types, bad choices: exit 2 with argparse's message) is plain argparse, as in 0.5.4.
    """

    def parse_args(self, args: Optional[Sequence[str]] = None, namespace=None):  # type: ignore[override]
        if args is None:
            args = sys.argv[1:]
        processed: List[str] = []
        for arg in args:
            if arg.startswith("--"):
                if "=" in arg:
                    key, value = arg.split("=", 1)
                    processed.append("--" + key[2:].replace("_", "-") + "=" + value)
                else:
                    processed.append("--" + arg[2:].replace("_", "-"))
            else:
                processed.append(arg)
        return super().parse_args(processed, namespace)
