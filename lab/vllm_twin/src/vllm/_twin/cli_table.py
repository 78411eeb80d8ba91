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
from vllm.utils import FlexibleArgumentParser


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


# 0.8.5.post1's defaults of the arguments the twin reads (its argparse defaults, the real wheel's parser):
# set on the namespace when a partial table (cli.complete false) lacks the argument.
MISSING_DEFAULTS: Dict[str, Any] = {
    "allow_credentials": False, "allowed_headers": ["*"], "allowed_methods": ["*"], "allowed_origins": ["*"],
    "api_key": None, "block_size": None, "cpu_offload_gb": 0, "disable_custom_all_reduce": False,
    "disable_frontend_multiprocessing": False, "disable_log_requests": False, "disable_log_stats": False,
    "disable_uvicorn_access_log": False, "distributed_executor_backend": None, "download_dir": None,
    "dtype": "auto", "enable_chunked_prefill": None, "enable_prefix_caching": None, "enable_prompt_adapter": None,
    "enforce_eager": False, "gpu_memory_utilization": 0.9, "guided_decoding_backend": "auto", "host": None,
    "kv_cache_dtype": "auto", "load_format": "auto", "max_log_len": None, "max_logprobs": 20,
    "max_model_len": None, "max_num_batched_tokens": None, "max_num_seqs": None, "model": "facebook/opt-125m",
    "num_gpu_blocks_override": None, "pipeline_parallel_size": 1, "port": 8000, "preemption_mode": None,
    "quantization": None, "response_role": "assistant", "revision": None, "root_path": None,
    "scheduler_delay_factor": 0.0, "seed": None, "served_model_name": None, "skip_tokenizer_init": False,
    "ssl_ca_certs": None, "ssl_cert_reqs": 0, "ssl_certfile": None, "ssl_keyfile": None, "swap_space": 4,
    "tensor_parallel_size": 1, "tokenizer": None, "tokenizer_mode": "auto", "tokenizer_revision": None,
    "trust_remote_code": False, "uvicorn_log_level": "info",
}


class TableError(Exception):
    """The CLI table holds something the twin cannot turn into an argparse call."""


def _choice(value: Any, kind: Optional[str]) -> Any:
    # The table writes choices as YAML scalars; argparse compares them with the converted value. `null` is
    # the None object (--quantization's choices end with None); "None" is the string some releases append
    # (0.8.5.post1's get_kwargs, arg_utils.py:186-189), which a nullable type's None never matches.
    if value is None:
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


class TableArgumentParser(FlexibleArgumentParser):
    """0.8.5.post1's FlexibleArgumentParser: underscores in option names (the twin's shared parser), and a
    clear refusal of --config, which the twin does not simulate."""

    def parse_args(self, args: Optional[Sequence[str]] = None, namespace=None):  # type: ignore[override]
        args = list(sys.argv[1:] if args is None else args)
        if "--config" in args:
            self.error("[twin] --config (arguments from a YAML file) is not simulated; pass the arguments "
                       "on the command line")
        return super().parse_args(args, namespace)


def build_parser(arguments: List[Dict[str, Any]]) -> TableArgumentParser:
    """The parser of `python -m vllm.entrypoints.openai.api_server` for a table-driven release."""
    parser = TableArgumentParser(description="vLLM OpenAI-Compatible RESTful API server.")
    for entry in arguments:
        add_table_argument(parser, entry)
    return parser
