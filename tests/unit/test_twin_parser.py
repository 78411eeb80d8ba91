"""The twin's command line equals vLLM 0.5.4's: every argument of the table in docs/facts/vllm-volta.md §2.1 and
of data/vllm-releases.yml's 0.5.4 CLI table, and argparse's exit 2."""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from ansible.module_utils.revive_releases import load_release_file

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin" / "src"))

from vllm.engine.arg_utils import nullable_str  # noqa: E402
from vllm.entrypoints.openai.cli_args import build_parser  # noqa: E402

FACTS = REPO / "docs" / "facts" / "vllm-volta.md"

# One argument, normalised: (flags, action, type, default, choices, nargs)
Row = Tuple[Tuple[str, ...], str, Optional[str], object, Optional[Tuple[str, ...]], Optional[str]]
TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool", json.loads: "json", nullable_str: "nullable_str"}
ACTION_NAMES = {"_StoreAction": "store", "_StoreTrueAction": "store_true", "_AppendAction": "append"}


def parser_rows() -> Dict[str, Row]:
    rows = {}
    for action in build_parser()._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        kind = ACTION_NAMES.get(type(action).__name__, type(action).__name__)
        type_name = None if kind == "store_true" else TYPE_NAMES.get(action.type)
        choices = None if action.choices is None else tuple(str(c) for c in action.choices)
        rows[action.option_strings[0]] = (tuple(action.option_strings), kind, type_name, action.default, choices,
                                          None if action.nargs == 0 else action.nargs)
    return rows


def facts_table_rows(text: str) -> Dict[str, Row]:
    """The §2.1 markdown table: | # | Flag(s) | Action / type | Default | Choices / nargs | Source |."""
    section = re.split(r"^## 2\.2 ", re.split(r"^## 2\.1 ", text, maxsplit=1, flags=re.M)[1], maxsplit=1, flags=re.M)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or not cells[0].isdigit():
            continue
        flags = tuple(re.findall(r"`([^`]+)`", cells[1]))
        match = re.fullmatch(r"(\w+)(?: \(([\w.]+)\))?", cells[2])
        kind, type_name = match.group(1), match.group(2)
        type_name = {"json.loads": "json"}.get(type_name, type_name)
        default = ast.literal_eval(cells[3].strip("`"))
        choices: Optional[Tuple[str, ...]] = None
        nargs = None
        if cells[4].startswith("nargs="):
            nargs = cells[4][len("nargs="):]
        elif cells[4]:
            choices = tuple(c.strip() for c in cells[4].split(","))
        rows[flags[0]] = (flags, kind, type_name, default, choices, nargs)
    return rows


# data/vllm-releases.yml names a type where 0.5.4 declares none (the facts table and the 0.5.4 code
# agree: no `type=`): --distributed-executor-backend "str" (argparse passes the string through either
# way) and --enable-chunked-prefill "bool" (StoreBoolean converts the value itself). Same behaviour, so
# the comparison treats those two annotations as "no type".
EQUIVALENT_YAML_TYPES = {("store", "str"), ("StoreBoolean", "bool")}


def release_rows() -> Dict[str, Row]:
    release = load_release_file(str(REPO / "data" / "vllm-releases.yml")).release("0.5.4")
    rows = {}
    for arg in release.arguments:
        type_name = None if arg.action == "store_true" else arg.type
        if (arg.action, type_name) in EQUIVALENT_YAML_TYPES and arg.flags[0] in (
                "--distributed-executor-backend", "--enable-chunked-prefill"):
            type_name = None
        rows[arg.flags[0]] = (tuple(arg.flags), arg.action, type_name,
                              arg.default, None if arg.choices is None else tuple(arg.choices), arg.nargs)
    return rows


def _differences(expected: Dict[str, Row], actual: Dict[str, Row]) -> List[str]:
    problems = []
    for flag in sorted(set(expected) | set(actual)):
        if flag not in actual:
            problems.append(f"{flag}: missing")
        elif flag not in expected:
            problems.append(f"{flag}: not in the table")
        elif expected[flag] != actual[flag]:
            problems.append(f"{flag}: table {expected[flag]} != {actual[flag]}")
    return problems


@pytest.mark.parametrize("source", ["data/vllm-releases.yml", "docs/facts/vllm-volta.md §2.1"])
def test_parser_equals_the_054_table(source):
    table = release_rows() if source == "data/vllm-releases.yml" else facts_table_rows(FACTS.read_text())
    assert len(table) == 99
    assert _differences(table, parser_rows()) == []


def test_parser_has_the_054_argument_order():
    flags = list(parser_rows())
    assert flags[:3] == ["--host", "--port", "--uvicorn-log-level"]
    assert flags.index("--disable-frontend-multiprocessing") == 19
    assert flags[20] == "--model"
    assert flags[-3:] == ["--engine-use-ray", "--disable-log-requests", "--max-log-len"]


def test_flexible_parser_accepts_underscores_in_names_only():
    args = build_parser().parse_args(["--tensor_parallel_size=8", "--served_model_name", "a_b", "--max_model_len",
                                      "4096"])
    assert (args.tensor_parallel_size, args.served_model_name, args.max_model_len) == (8, ["a_b"], 4096)


def test_nullable_strings_and_store_boolean():
    args = build_parser().parse_args(["--api-key", "None", "--host", "", "--enable-chunked-prefill"])
    assert (args.api_key, args.host, args.enable_chunked_prefill) == (None, None, True)
    assert build_parser().parse_args(["--enable-chunked-prefill", "false"]).enable_chunked_prefill is False


@pytest.mark.parametrize("argv, message", [
    (["--enable-log-requests"], "error: unrecognized arguments: --enable-log-requests"),
    (["--swap-space", "0.5"], "error: argument --swap-space: invalid int value: '0.5'"),
    (["--block-size", "64"], "error: argument --block-size: invalid choice: 64 (choose from 8, 16, 32)"),
    (["--dtype", "bf16"], "error: argument --dtype: invalid choice: 'bf16' (choose from 'auto', 'half', "
                          "'float16', 'bfloat16', 'float', 'float32')"),
    (["--max-model-len", "32k"], "error: argument --max-model-len: invalid int value: '32k'"),
])
def test_invalid_arguments_exit_2_with_argparses_message(argv, message):
    env = dict(os.environ, PYTHONPATH=str(REPO / "lab" / "vllm_twin" / "src"))
    done = subprocess.run([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *argv], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1].endswith(message)
    assert done.stderr.startswith("usage: api_server.py [-h] [--host HOST] [--port PORT]")
