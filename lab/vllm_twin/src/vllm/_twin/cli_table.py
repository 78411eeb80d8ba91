"""The command line of a release whose parser is built from its CLI table (0.8.5.post1).

release.json carries the release's `cli.arguments` of data/vllm-releases.yml (generated from the real
wheel's argparse objects); each entry becomes one `add_argument` call here, in the table's order, with the
table's flags, action, type, default, choices and nargs. Types and actions are the twin's own functions
with the behaviour of the release's (cited at each); help texts are not in the table, so `--help` lists
the arguments without descriptions (simulated).

The parser class is 0.8.5.post1's FlexibleArgumentParser (v0.8.5.post1:vllm/utils.py:1325-1369):
`--foo_bar` is read as `--foo-bar` (the name only, not a value after `=`); `-O3` reaches argparse as it is
(its rewrite at utils.py:1362 needs a two-character argument and never fires; argparse reads `-O3` as `-O 3`
anyway). `--config FILE` (arguments from a YAML file) is refused with exit 2, since lab nodes carry no
YAML parser (simulated refusal).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from vllm.engine.arg_utils import StoreBoolean, nullable_str
from vllm.entrypoints.openai.cli_args import PromptAdapterPath


def human_readable_int(value: str) -> int:
    """'1k' -> 1000, '1K' -> 1024, '25.6k' -> 25600 (v0.8.5.post1:vllm/engine/arg_utils.py:1676-1713).

    Decimal suffixes k/m/g take decimals, binary K/M/G do not; anything else (a t/T suffix included) must
    be a plain integer, or argparse reports `invalid human_readable_int value`.
    """
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        decimal = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9}
        binary = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        if suffix in binary:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to use "
                    f"{number}{suffix.lower()} instead?")
            return int(number) * binary[suffix]
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    """human_readable_int, plus '-1' or 'auto' meaning -1 (a type of releases after 0.8.5.post1)."""
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    return human_readable_int(value)


@dataclass
class LoRAModulePath:
    """v0.8.5.post1:vllm/entrypoints/openai/serving_models.py:40-43."""

    name: str
    path: str
    base_model_name: Optional[str] = None


class LoRAParserAction(argparse.Action):
    """`--lora-modules name=path ...` or JSON objects (v0.8.5.post1:vllm/entrypoints/openai/cli_args.py:23-56)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None:
            values = []
        if isinstance(values, str):
            raise TypeError("Expected values to be a list")
        modules: List[LoRAModulePath] = []
        for item in values:
            if item in (None, ""):
                continue
            if "=" in item and "," not in item:
                name, path = item.split("=")
                modules.append(LoRAModulePath(name, path))
                continue
            try:
                modules.append(LoRAModulePath(**json.loads(item)))
            except json.JSONDecodeError:
                parser.error(f"Invalid JSON format for --lora-modules: {item}")
            except TypeError as exc:
                parser.error(f"Invalid fields for --lora-modules: {item} - {exc}")
        setattr(namespace, self.dest, modules)


class PromptAdapterParserAction(argparse.Action):
    """`--prompt-adapters name=path ...` (v0.8.5.post1:vllm/entrypoints/openai/cli_args.py:59-77)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None:
            values = []
        if isinstance(values, str):
            raise TypeError("Expected values to be a list")
        adapters = []
        for item in values:
            name, path = item.split("=")
            adapters.append(PromptAdapterPath(name, path))
        setattr(namespace, self.dest, adapters)


TYPES: Dict[str, Callable[[str], Any]] = {
    "str": str, "nullable_str": nullable_str, "int": int, "float": float, "json": json.loads, "bool": bool,
    "human_readable_int": human_readable_int, "human_readable_int_or_auto": human_readable_int_or_auto,
}
# Actions of the table that are classes rather than argparse's strings.
ACTION_CLASSES: Dict[str, type] = {
    "BooleanOptionalAction": argparse.BooleanOptionalAction, "StoreBoolean": StoreBoolean,
    "LoRAParserAction": LoRAParserAction, "PromptAdapterParserAction": PromptAdapterParserAction,
}
VALUELESS = ("store_true", "store_false", "BooleanOptionalAction")


class TableError(Exception):
    """The CLI table holds something the twin cannot turn into an argparse call."""


def _choice(value: Any, kind: Optional[str]) -> Any:
    # The table writes choices as YAML scalars; argparse compares them with the converted value.
    if value is None or value == "None":
        return None
    if kind in ("int", "human_readable_int", "human_readable_int_or_auto"):
        return int(value)
    if kind == "float":
        return float(value)
    return value


def add_table_argument(parser: argparse.ArgumentParser, entry: Dict[str, Any]) -> argparse.Action:
    """One `add_argument` call for one table entry."""
    flags = list(entry["flags"])
    action = entry.get("action", "store")
    kind = entry.get("type")
    kwargs: Dict[str, Any] = {"default": entry.get("default")}
    if action in ACTION_CLASSES:
        kwargs["action"] = ACTION_CLASSES[action]
    elif action in ("store", "store_true", "store_false", "append"):
        kwargs["action"] = action
    else:
        raise TableError(f"{flags[0]}: action {action!r} is not one the twin maps "
                         f"({', '.join(['store', 'store_true', 'store_false', 'append', *ACTION_CLASSES])})")
    if action == "BooleanOptionalAction":
        # argparse derives --no-X itself: register the positive flag(s) only.
        flags = [flag for flag in flags if not flag.startswith("--no-")]
    if action not in VALUELESS and action != "StoreBoolean" and kind is not None:
        if kind not in TYPES:
            raise TableError(f"{flags[0]}: type {kind!r} is not one the twin maps ({', '.join(TYPES)})")
        kwargs["type"] = TYPES[kind]
    if entry.get("choices") is not None:
        kwargs["choices"] = [_choice(c, kind) for c in entry["choices"]]
    if entry.get("nargs") is not None:
        nargs = entry["nargs"]
        kwargs["nargs"] = int(nargs) if str(nargs).isdigit() else nargs
    if action == "StoreBoolean":
        kwargs["const"] = "True"  # `--enable-chunked-prefill` alone means true (the release's const)
    if entry.get("deprecated"):
        kwargs["help"] = f"(deprecated) {entry['deprecated']}"
    return parser.add_argument(*flags, **kwargs)


class TableArgumentParser(argparse.ArgumentParser):
    """0.8.5.post1's FlexibleArgumentParser: underscores in option names."""

    def parse_args(self, args: Optional[Sequence[str]] = None, namespace=None):  # type: ignore[override]
        if args is None:
            args = sys.argv[1:]
        args = list(args)
        if "--config" in args:
            self.error("[twin] --config (arguments from a YAML file) is not simulated; pass the arguments "
                       "on the command line")
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


def build_parser(arguments: List[Dict[str, Any]]) -> TableArgumentParser:
    """The parser of `python -m vllm.entrypoints.openai.api_server` for a table-driven release."""
    parser = TableArgumentParser(description="vLLM OpenAI-Compatible RESTful API server.")
    for entry in arguments:
        add_table_argument(parser, entry)
    return parser
