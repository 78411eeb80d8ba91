#!/usr/bin/env python3
"""The table of every module's numeric option ranges in docs/inputs.md, made from the modules' `BOUNDS`.

    .venv/bin/python tools/module_bounds.py           # rewrite the table between its markers
    .venv/bin/python tools/module_bounds.py --check   # exit 1 if the document differs (tests/unit/test_module_bounds.py)
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "inputs.md"
BEGIN, END = "<!-- module bounds: tools/module_bounds.py -->", "<!-- end of module bounds -->"


def _bounds(name: str) -> dict:
    spec = importlib.util.spec_from_file_location(f"bounds_of_{name}", REPO / "library" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, "BOUNDS", {})


def table() -> str:
    rows = ["| module | option | allowed |", "|---|---|---|"]
    for path in sorted((REPO / "library").glob("*.py")):
        if path.stem == "vllm_plan":   # the planner's inputs: the table above
            continue
        for option, bound in _bounds(path.stem).items():
            rows.append(f"| `{path.stem}` | `{option}` | {bound.allowed()}"
                        f"{'; may be left out: ' + bound.leave_out if bound.optional else ''} |")
    return "\n".join(rows)


def render(text: str) -> str:
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "bin"))
    from revive_cli import use_module_utils
    use_module_utils()
    current = DOC.read_text()
    wanted = render(current)
    if args.check:
        if wanted != current:
            print(f"{DOC}: the module bounds table is out of date; run tools/module_bounds.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
