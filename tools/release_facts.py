#!/usr/bin/env python3
"""Facts about a vLLM release read from its real wheels, written into data/vllm-releases.yml.

  release_facts.py cli --python VENV_PYTHON --release 0.8.5.post1 [--lock LOCK] [--write]
      Build the server's own argparse parser under the venv's interpreter, exactly as
      `python -m vllm.entrypoints.openai.api_server` does, and dump every action as the release's `cli:` table.
  release_facts.py kernels --python VENV_PYTHON --release 0.8.5.post1 [--write]
      Read the CUDA fat binaries (ELF sections .nv_fatbin / .nv.fatbin / __nv_relfatbin) of vllm, xformers and
      torch in the venv and list the sm_XX of their cubins and PTX, each entry checked by a second method.

  release_facts.py cli|kernels ... --python VENV_PYTHON --record DIR
      Also keep what the block is made of (the raw per-variant parser dumps / the per-file fatbin scans, and a
      manifest naming the wheel, the tool's commit and the command) in DIR, e.g. tests/data/release-inputs/vllm-V/.
  release_facts.py cli|kernels --from-recorded DIR --release V [--write]
      Make the block from those recordings, without a venv or the network: the same merge and render code.
  release_facts.py check
      Make every recorded release's blocks again and compare them with the committed text between the markers.

Without --write cli and kernels print what they would write. With --write only the text between the release's marker
lines is replaced (other parts of the file are edited by hand), after the whole new file passed the loader
(module_utils/revive_releases.py). This file also runs under the venv's interpreter (Python >= 3.9, stdlib only)
as `release_facts.py _dump-cli OUT.json`; keep it free of newer syntax and third-party imports at top level.
"""
from __future__ import annotations

import argparse
import base64
import datetime
import difflib
import enum
import gzip
import hashlib
import json
import os
import re
import shlex
import struct
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
RELEASES_FILE = REPO / "data" / "vllm-releases.yml"
CLI_BEGIN = "    # >>> generated cli: tools/release_facts.py (do not edit by hand)"
CLI_END = "    # <<< generated cli"
KERNELS_BEGIN = "    # >>> generated kernels: tools/release_facts.py"
KERNELS_END = "    # <<< generated kernels"
ITEM_INDENT = " " * 8                      # `- {...}` lines sit under `cli:` / `arguments:` as in the 0.5.4 table
LINE_LIMIT = 120                           # longer flow lines wrap into block form, as the 0.5.4 block does
DEFAULT_INDEX = "https://pypi.org/simple"


class FactsError(Exception):
    """A fact could not be read from the venv, or could not be written into the release file."""


# ---------------------------------------------------------------------------------------------------------
# CLI: argparse actions -> the table's vocabulary (module_utils/revive_releases.py ARG_TYPES / VALUELESS_ACTIONS)
# ---------------------------------------------------------------------------------------------------------

ACTION_NAMES = {
    "_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
    "_AppendAction": "append", "_StoreConstAction": "store_const", "_AppendConstAction": "append_const",
    "_CountAction": "count", "_ExtendAction": "extend", "BooleanOptionalAction": "BooleanOptionalAction",
}
VALUELESS = ("store_true", "store_false", "BooleanOptionalAction")


@dataclass(frozen=True)
class TypeMapping:
    name: str                                # a type of the table's vocabulary
    exact: bool                              # False: the table accepts a subset (or, where noted, a superset)
    accepts: str                             # what the real callable accepts, for the reader and the report


# Callables seen in vLLM server parsers, by `describe_type`. Exact: the loader's check accepts exactly the same
# strings. Not exact: written with `parser_type:` so a reader sees the approximation; the report lists them.
TYPE_MAP: Dict[str, TypeMapping] = {
    "None": TypeMapping("str", True, "any string (argparse passes it through)"),
    "builtins.str": TypeMapping("str", True, "any string"),
    "builtins.int": TypeMapping("int", True, "int(value)"),
    "builtins.float": TypeMapping("float", True, "float(value)"),
    "json.loads": TypeMapping("json", True, "any JSON text"),
    "vllm.utils.nullable_str": TypeMapping("nullable_str", True, "any string; '' and 'None' mean None"),
    "vllm.engine.arg_utils.nullable_str": TypeMapping("nullable_str", True, "any string; '' and 'None' mean None"),
    "optional_type(builtins.str)": TypeMapping("nullable_str", True, "any string; '' and 'None' mean None"),
    "optional_type(builtins.int)": TypeMapping(
        "int", False, "int(value), or '' / 'None' for None (the table refuses '' and 'None')"),
    "optional_type(builtins.float)": TypeMapping(
        "float", False, "float(value), or '' / 'None' for None (the table refuses '' and 'None')"),
    "optional_type(json.loads)": TypeMapping(
        "json", False, "'' / 'None' (None), a JSON object '{...}', or KEY=INT[,KEY=INT] (deprecated); the table "
        "takes any JSON and refuses KEY=INT"),
    # 0.9.2 (v0.9.2:vllm/engine/arg_utils.py:57-85): parse_type(json.loads) is optional_type(json.loads) without
    # the ''/'None' case; union_dict_and_str passes a string that is not '{...}' through and parses one that is.
    "parse_type(json.loads)": TypeMapping(
        "json", False, "a JSON object '{...}', or KEY=INT[,KEY=INT] (deprecated); the table takes any JSON and "
        "refuses KEY=INT"),
    "vllm.engine.arg_utils.union_dict_and_str": TypeMapping(
        "str", False, "any string; one of the form '{...}' must be a JSON object (the table checks nothing)"),
    "optional_type(vllm.engine.arg_utils.union_dict_and_str)": TypeMapping(
        "str", False, "'' / 'None' (None), or what union_dict_and_str takes (the table checks nothing)"),
    "optional_type(parse_type(json.loads))": TypeMapping(
        "json", False, "'' / 'None' (None), a JSON object '{...}', or KEY=INT[,KEY=INT] (deprecated); the table "
        "takes any JSON and refuses KEY=INT"),
    "parse_dataclass(vllm.config.CompilationConfig)": TypeMapping(
        "json", False, "a JSON object of CompilationConfig fields (from_cli: pydantic validate_json); -O3 / -O 3 "
        "are rewritten to -O.level first by FlexibleArgumentParser (the table takes any JSON, and not -O3)"),
    # 0.10.x: CompilationConfig moved to vllm/config/compilation.py; parse_dataclass unchanged
    # (v0.10.1.1:vllm/engine/arg_utils.py:186-193)
    "parse_dataclass(vllm.config.compilation.CompilationConfig)": TypeMapping(
        "json", False, "a JSON object of CompilationConfig fields (pydantic validate_json); -O3 / -O 3 are "
        "rewritten to -O.level first by FlexibleArgumentParser (the table takes any JSON, and not -O3)"),
    "optional_type(parse_dataclass(vllm.config.KVTransferConfig))": TypeMapping(
        "json", False, "'' / 'None' (None), or a JSON object of KVTransferConfig fields (the table takes any JSON)"),
    "optional_type(parse_dataclass(vllm.config.KVEventsConfig))": TypeMapping(
        "json", False, "'' / 'None' (None), or a JSON object of KVEventsConfig fields (the table takes any JSON)"),
    # v0.7.3:vllm/engine/arg_utils.py:53-85 (0.6.x - 0.7.x --limit-mm-per-prompt): '' is None, else KEY=INT[,KEY=INT]
    "vllm.engine.arg_utils.nullable_kvs": TypeMapping(
        "str", False, "'' (None) or KEY=INT[,KEY=INT], keys lower-cased, a key twice with two values refused; no "
        "vocabulary type matches, the table checks nothing"),
    "vllm.engine.arg_utils.human_readable_int": TypeMapping(
        "human_readable_int", True, "int(value), or NUMBER[kmg] (x1000^n) / INT[KMG] (x1024^n)"),
    "vllm.config.PoolerConfig.from_json": TypeMapping(
        "json", False, "a JSON object of PoolerConfig fields (the table takes any JSON)"),
    "vllm.config.KVTransferConfig.from_cli": TypeMapping(
        "json", False, "a JSON object of KVTransferConfig fields (pydantic model_validate_json; the table takes "
        "any JSON)"),
    "vllm.config.CompilationConfig.from_cli": TypeMapping(
        "str", False, "'0'-'3' (optimisation level) or a Python literal dict of CompilationConfig fields "
        "(ast.literal_eval); no vocabulary type matches, the table checks nothing"),
}


# Custom actions that parse the value themselves (no type=): what they accept, in the table's vocabulary.
ACTION_TYPES: Dict[str, TypeMapping] = {
    # v0.7.3:vllm/utils.py:1137-1146 (also 0.5.4 - 0.8.x): 'true' / 'false' in any case, nargs='?' with const 'True'
    "StoreBoolean": TypeMapping("bool", True, "'true' or 'false', any case; bare flag = True"),
}


def describe_type(kind: Any) -> str:
    """A stable name for an argparse `type=` callable: 'builtins.int', 'optional_type(builtins.str)'."""
    if kind is None:
        return "None"
    qualname = getattr(kind, "__qualname__", type(kind).__qualname__)
    module = getattr(kind, "__module__", None) or type(kind).__module__
    code = getattr(kind, "__code__", None)
    # vllm.engine.arg_utils.optional_type(return_type) returns a closure named _optional_type (0.8.x on), and
    # parse_type(return_type) one named _parse_type (0.9.x: v0.9.2:vllm/engine/arg_utils.py:57-68)
    for wrapper in ("optional_type", "parse_type"):
        if qualname.endswith(f"{wrapper}.<locals>._{wrapper}") and code is not None and kind.__closure__:
            cells = dict(zip(code.co_freevars, (cell.cell_contents for cell in kind.__closure__)))
            if "return_type" in cells:
                return f"{wrapper}({describe_type(cells['return_type'])})"
    # 0.9.x wraps a config dataclass field in a closure with the class as a default argument
    # (v0.9.2:vllm/engine/arg_utils.py:209-218 parse_dataclass: cls.from_cli, else pydantic validate_json)
    if qualname.endswith("_compute_kwargs.<locals>.parse_dataclass") and getattr(kind, "__defaults__", None):
        target = kind.__defaults__[0]
        return f"parse_dataclass({target.__module__}.{target.__qualname__})"
    return f"{module}.{qualname}"


def map_type(kind: Any, flag: str) -> Tuple[str, TypeMapping]:
    described = describe_type(kind)
    if described not in TYPE_MAP:
        raise FactsError(
            f"{flag}: argparse type {described} is not in TYPE_MAP (tools/release_facts.py); read what it accepts "
            "in the release's source and map it to the closest type of module_utils/revive_releases.py ARG_TYPES "
            "(exact only if the loader's check accepts the same strings)")
    return described, TYPE_MAP[described]


def json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    return str(value)


DEPRECATED_HELP = re.compile(r"\[DEPRECATED\]|\b(?:this|the) (?:parameter|flag|option|argument) is deprecated",
                             re.IGNORECASE)


def deprecation(action: argparse.Action) -> Optional[str]:
    """The help's first sentence when it marks the flag deprecated (or argparse's deprecated=True, 3.13)."""
    text = " ".join((action.help or "").split())
    if DEPRECATED_HELP.search(text):
        return re.split(r"(?<=\.)\s+(?=[A-Z])", text)[0]  # a new sentence starts upper-case ("i.e. block" does not)
    if getattr(action, "deprecated", False) is True:
        return "deprecated (argparse deprecated=True)"
    return None


def dump_actions(parser: argparse.ArgumentParser) -> List[Dict[str, Any]]:
    """Every action of `parser` except -h/--help, in the table's vocabulary, in the parser's order."""
    rows: List[Dict[str, Any]] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flags = list(action.option_strings)
        if not flags and action.nargs == "?" and action.dest == "model_tag":
            continue  # 0.10.x: optional positional model tag (cli_args.py make_arg_parser); the planner passes --model
        if not flags:
            raise FactsError(f"positional argument {action.dest!r}: the table holds options only")
        name = ACTION_NAMES.get(type(action).__name__, type(action).__name__)
        row: Dict[str, Any] = {"flags": flags, "action": name}
        if name not in VALUELESS:
            if action.type is None and name in ACTION_TYPES:
                described, mapping = name, ACTION_TYPES[name]
            else:
                described, mapping = map_type(action.type, flags[0])
            row["type"] = mapping.name
            if not mapping.exact:
                row["parser_type"] = described
        row["default"] = json_safe(action.default)
        if action.choices is not None:
            row["choices"] = json_safe(list(action.choices))
        if action.nargs not in (None, 0):
            row["nargs"] = action.nargs
        note = deprecation(action)
        if note:
            row["deprecated"] = note
        rows.append(row)
    return rows


# vLLM 0.9 builds config dataclasses while it builds the parser (v0.9.2:vllm/engine/arg_utils.py:906
# get_kwargs(VllmConfig) calls DeviceConfig()), and DeviceConfig(device="auto") raises this without a GPU
# (v0.9.2:vllm/config.py:2407-2416): no platform plugin finds a device, so current_platform is Unspecified.
NO_DEVICE_ERROR = "Failed to infer device type"
STAND_IN_NOTE = ("no GPU here: built under a CUDA-typed stand-in for vllm.platforms.current_platform; "
                 "DeviceConfig() needs a device type while the parser is built (vllm/config.py)")


def stand_in_cuda_platform() -> None:
    """Make vLLM's lazily resolved current_platform report CUDA (what every node has) on a machine without
    a GPU. Only the parser is built under it: the stand-in has the device type and enum of CUDA, no kernels."""
    import vllm.platforms as platforms
    from vllm.platforms.interface import Platform, PlatformEnum

    class CudaStandIn(Platform):
        _enum = PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"
        dispatch_key = "CUDA"
        ray_device_key = "GPU"
        device_control_env_var = "CUDA_VISIBLE_DEVICES"

    if "_current_platform" not in vars(platforms):
        raise FactsError("this vLLM resolves current_platform at import; the stand-in cannot replace it")
    platforms._current_platform = CudaStandIn()


def build_server_parser() -> Tuple[argparse.ArgumentParser, bool]:
    """The parser of `python -m vllm.entrypoints.openai.api_server` (its `__main__` block:
    make_arg_parser(FlexibleArgumentParser(...)) in 0.6.6.post1 - 0.9.2), and whether it needed the
    CUDA platform stand-in (0.9.x without a GPU)."""
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils import FlexibleArgumentParser

    def build() -> argparse.ArgumentParser:
        return make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))

    try:
        return build(), False
    except RuntimeError as exc:
        if NO_DEVICE_ERROR not in str(exc):
            raise
    stand_in_cuda_platform()
    return build(), True


def _dump_cli_in_venv(out: str) -> int:
    import importlib.metadata as metadata

    parser, stand_in = build_server_parser()
    rows = dump_actions(parser)
    facts = {"vllm": metadata.version("vllm"), "python": "%d.%d" % sys.version_info[:2], "arguments": rows,
             "platform_stand_in": stand_in}
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(facts, handle)
    return 0


# ---------------------------------------------------------------------------------------------------------
# generated_from: which file the table was made from
# ---------------------------------------------------------------------------------------------------------

def site_packages(python: str) -> Path:
    result = _run_venv(python, ["-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"])
    return Path(result.strip())


def _run_venv(python: str, args: Sequence[str], timeout: int = 600, env: Optional[Dict[str, str]] = None) -> str:
    if not os.access(python, os.X_OK):
        raise FactsError(f"{python}: not an executable interpreter; pass the venv's bin/python to --python")
    # VLLM_* of this shell must not change the parser; `env` sets the ones a variant asks for
    full = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHONHASHSEED"))}
    full.update(env or {})
    proc = subprocess.run([python, *args], capture_output=True, text=True, timeout=timeout, cwd=tempfile.gettempdir(),
                          env=full)
    if proc.returncode != 0:
        raise FactsError(f"{python} {' '.join(args[:2])} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def dist_info(site: Path, name: str, version: Optional[str] = None) -> Path:
    pattern = re.compile(rf"{re.escape(name.replace('-', '_'))}-(.+)\.dist-info", re.IGNORECASE)
    found = [p for p in site.iterdir() if pattern.fullmatch(p.name) and (version is None or
                                                                       pattern.fullmatch(p.name).group(1) == version)]
    if len(found) != 1:
        raise FactsError(f"{site}: expected one {name}{'-' + version if version else ''}.dist-info, found "
                         f"{[p.name for p in found]}; is this the venv of that release?")
    return found[0]


def record_hash(dist: Path, member: str) -> str:
    """The hex sha256 the dist-info RECORD gives for `member` (RECORD stores urlsafe base64, no padding)."""
    for line in (dist / "RECORD").read_text(encoding="utf-8").splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[0] == member and parts[1].startswith("sha256="):
            raw = parts[1][len("sha256="):]
            return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).hex()
    raise FactsError(f"{dist / 'RECORD'}: no sha256 line for {member}")


def lock_hashes(lock: Path, name: str, version: str) -> List[str]:
    """The --hash=sha256 values of `name==version` in a pip-compile style lock."""
    text = lock.read_text(encoding="utf-8")
    match = re.search(rf"^{re.escape(name)}=={re.escape(version)}((?:[ \t]*\\\n[ \t]+--hash=sha256:[0-9a-f]+)+)",
                      text, re.MULTILINE | re.IGNORECASE)
    return re.findall(r"sha256:([0-9a-f]{64})", match.group(1)) if match else []


def index_wheels(name: str, version: str, index_url: str) -> Dict[str, str]:
    """sha256 -> file name of the release's wheels on a PEP 691 JSON index."""
    request = urllib.request.Request(f"{index_url.rstrip('/')}/{name}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    prefix = f"{name.replace('-', '_')}-{version}-"
    return {f["hashes"]["sha256"]: f["filename"] for f in files
            if f["filename"].endswith(".whl") and f["filename"].startswith(prefix) and "sha256" in f.get("hashes", {})}


def generated_from(site: Path, version: str, lock: Optional[Path], index_url: str) -> Tuple[str, str]:
    """('<wheel> sha256 <hex>', how it was found); falls back to the RECORD hash of cli_args.py."""
    dist = dist_info(site, "vllm", version)
    direct = dist / "direct_url.json"
    if direct.exists():
        info = json.loads(direct.read_text(encoding="utf-8"))
        digest = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if digest:
            return f"{info['url'].rsplit('/', 1)[-1]} sha256 {digest}", "direct_url.json of the installed dist"
    if lock is not None:
        # --require-hashes --only-binary: the installed file is the lock's one hash that names a wheel
        hashes = set(lock_hashes(lock, "vllm", version))
        wheels = {h: n for h, n in index_wheels("vllm", version, index_url).items() if h in hashes}
        if len(wheels) == 1:
            digest, name = next(iter(wheels.items()))
            return f"{name} sha256 {digest}", f"the only wheel of {lock.name}'s vllm hashes on {index_url}"
    digest = record_hash(dist, "vllm/entrypoints/openai/cli_args.py")
    return (f"{dist.name}/RECORD sha256 of vllm/entrypoints/openai/cli_args.py {digest}",
            "RECORD (no lock given, or its wheel hash is not on the index)")


# ---------------------------------------------------------------------------------------------------------
# YAML emission (flow style of the 0.5.4 table) and marker replacement
# ---------------------------------------------------------------------------------------------------------

PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./+-]*")
YAML_WORDS = {"null", "true", "false", "yes", "no", "on", "off", "none", "y", "n", "~"}


def yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    text = str(value)
    if PLAIN.fullmatch(text) and text.lower() not in YAML_WORDS:
        return text
    return json.dumps(text, ensure_ascii=False)


def yaml_flow(value: Any, quote: bool = False) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(yaml_flow(v, quote) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_flow(v)}" for k, v in value.items()) + "}"
    return json.dumps(value) if quote and isinstance(value, str) else yaml_scalar(value)


def folded(lead: str, key: str, text: str) -> List[str]:
    """`key: >-` and the words of `text` wrapped under it (YAML folds them back with single spaces)."""
    width = LINE_LIMIT - len(lead) - 2
    body = " " * (len(lead) + 2)
    lines, current = [f"{lead}{key}: >-"], ""
    for word in text.split(" "):
        if current and len(current) + 1 + len(word) > width:
            lines.append(body + current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    lines.append(body + current)
    return lines


def argument_lines(row: Dict[str, Any], indent: str = ITEM_INDENT) -> List[str]:
    """One `- {...}` line, or the block form when that line would pass LINE_LIMIT."""
    parts = [f"{key}: {yaml_flow(value, quote=(key == 'flags'))}" for key, value in row.items()]
    line = f"{indent}- {{{', '.join(parts)}}}"
    if len(line) <= LINE_LIMIT:
        return [line]
    lines = []
    for n, (key, value) in enumerate(row.items()):
        lead = f"{indent}- " if n == 0 else f"{indent}  "
        text = f"{lead}{key}: {yaml_flow(value, quote=(key == 'flags'))}"
        if len(text) > LINE_LIMIT and isinstance(value, list):
            lines.append(f"{lead}{key}:")
            lines.extend(f"{indent}    - {yaml_scalar(v)}" for v in value)
        elif len(text) > LINE_LIMIT and isinstance(value, str) and value == " ".join(value.split()):
            lines.extend(folded(f"{indent}  ", key, value) if n else [f"{lead}{key}: {yaml_scalar(value)}"])
        else:
            lines.append(text)
    return lines


def cli_block(rows: List[Dict[str, Any]], source: str, summary: str) -> str:
    lines = [
        "    cli:",
        *(f"      # {part}" for part in summary.split("; ")),
        "      complete: true",
        *folded("      ", "generated_from", source),
        "      arguments:",
    ]
    for row in rows:
        lines.extend(argument_lines(row))
    return "\n".join(lines) + "\n"


def release_span(text: str, release: str) -> Tuple[int, int]:
    """Character span of `releases.<release>`'s entry (from its key line to the next two-space key)."""
    key = re.search(rf'^  "?{re.escape(release)}"?:[ \t]*\n', text, re.MULTILINE)
    if not key:
        raise FactsError(f"{RELEASES_FILE}: no entry `  \"{release}\":` under releases; add the release first")
    after = re.search(r"^ {0,2}\S", text[key.end():], re.MULTILINE)
    return key.start(), key.end() + (after.start() if after else len(text[key.end():]))


def replace_between(text: str, release: str, begin: str, end: str, block: str) -> str:
    start, stop = release_span(text, release)
    entry = text[start:stop]
    lines = entry.splitlines(keepends=True)
    marks = [n for n, line in enumerate(lines) if line.rstrip("\n") in (begin, end)]
    if len(marks) != 2 or lines[marks[0]].rstrip("\n") != begin or lines[marks[1]].rstrip("\n") != end:
        raise FactsError(f"{RELEASES_FILE}: releases.{release} needs exactly one pair of marker lines\n{begin}\n...\n"
                         f"{end}\n(found {len(marks)} marker lines); add them where the block belongs")
    new_entry = "".join(lines[:marks[0] + 1]) + block + "".join(lines[marks[1]:])
    return text[:start] + new_entry + text[stop:]


def validate_text(text: str, source: str) -> Any:
    """The release data as the loader reads it; raises the loader's error."""
    import yaml  # controller-side (.venv); the venv-side dump needs no YAML

    sys.path.insert(0, str(REPO / "module_utils"))
    try:
        import revive_releases
    finally:
        sys.path.pop(0)
    return revive_releases.load_release_data(yaml.safe_load(text), source=source)


def write_block(release: str, begin: str, end: str, block: str, check: Callable[[Any], None]) -> None:
    """Re-read the file, swap the marked block, validate the whole file, write atomically."""
    old = RELEASES_FILE.read_text(encoding="utf-8")
    new = replace_between(old, release, begin, end, block)
    try:
        check(validate_text(new, f"{RELEASES_FILE} (as it would be written)"))
    except Exception as exc:  # the loader's or the check's error: only write if the old file fails the same way
        try:
            validate_text(old, str(RELEASES_FILE))
        except Exception:
            print(f"warning: {RELEASES_FILE} does not load before this change either: {exc}", file=sys.stderr)
        else:
            raise FactsError(f"not written, the new block breaks the file: {exc}") from exc
    fd, tmp = tempfile.mkstemp(dir=str(RELEASES_FILE.parent), prefix=".vllm-releases.", suffix=".yml")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(new)
    os.chmod(tmp, os.stat(RELEASES_FILE).st_mode & 0o777)
    if RELEASES_FILE.read_text(encoding="utf-8") != old:  # someone wrote meanwhile: do not overwrite their edit
        os.unlink(tmp)
        raise FactsError(f"{RELEASES_FILE} changed while this ran; run the command again")
    os.replace(tmp, RELEASES_FILE)


def check_cli_loaded(release: str, rows: List[Dict[str, Any]]) -> Callable[[Any], None]:
    def check(data: Any) -> None:
        loaded = data.release(release)
        if not loaded.cli_complete or len(loaded.arguments) != len(rows):
            raise FactsError(f"the loader read {len(loaded.arguments)} arguments (complete={loaded.cli_complete}), "
                             f"the parser has {len(rows)}")
        for row, argument in zip(rows, loaded.arguments):
            if list(argument.flags) != row["flags"] or argument.default != row["default"]:
                raise FactsError(f"{row['flags'][0]}: YAML round trip changed it to {argument}")
    return check


# The parser is built in several processes: vLLM 0.8.5.post1 picks --guided-decoding-backend's choices from a
# set (vllm/engine/arg_utils.py get_type), so they follow PYTHONHASHSEED, and reads VLLM_USE_V1 at import for
# that flag's default (vllm/config.py DecodingConfig). Planned Volta servers run with VLLM_USE_V1=0.
ENV_VARIANTS = ({}, {"VLLM_USE_V1": "0"})
V0_ENV_DEFAULT_KEY = "default_vllm_use_v1_0"


def dump_variants(python: str, seeds: int) -> List[Tuple[Dict[str, str], Dict[str, Any]]]:
    """The parser dumped once per variant, in ENV_VARIANTS x seed order; the processes are independent, so they run
    side by side (one per CPU: each spends its ~35 s importing vLLM)."""
    from concurrent.futures import ThreadPoolExecutor

    envs = [dict(env, PYTHONHASHSEED=str(seed)) for env in ENV_VARIANTS for seed in range(seeds)]
    with tempfile.TemporaryDirectory(prefix="release-facts-") as tmp:
        def dump(numbered: Tuple[int, Dict[str, str]]) -> Tuple[Dict[str, str], Dict[str, Any]]:
            out = os.path.join(tmp, f"cli-{numbered[0]}.json")
            _run_venv(python, [str(Path(__file__).resolve()), "_dump-cli", out], env=numbered[1])
            with open(out, encoding="utf-8") as handle:
                return numbered[1], json.load(handle)

        with ThreadPoolExecutor(max_workers=max(1, min(len(envs), os.cpu_count() or 1))) as pool:
            return list(pool.map(dump, enumerate(envs)))


def merge_variants(variants: List[Tuple[Dict[str, str], Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """One row per action. Choices that differ between processes: those all of them accept, plus
    `choices_unstable` (accepted by some only); a default that differs under VLLM_USE_V1=0: `default_vllm_use_v1_0`."""
    base_env, base = variants[0]
    merged = []
    for n, row in enumerate(base["arguments"]):
        seen = [facts["arguments"][n] for _, facts in variants]
        if any(other["flags"] != row["flags"] for other in seen):
            raise FactsError(f"{row['flags'][0]}: the parser's actions come in a different order between processes")
        out = dict(row)
        if any(other.get("choices") != row.get("choices") for other in seen):
            every = [c for c in row.get("choices") or [] if all(c in (o.get("choices") or []) for o in seen)]
            some = sorted({c for o in seen for c in o.get("choices") or [] if c not in every}, key=str)
            out["choices"] = every
            out["choices_unstable"] = some
        v0_defaults = {json.dumps(facts["arguments"][n]["default"]) for env, facts in variants if env.get("VLLM_USE_V1") == "0"}
        unset_defaults = {json.dumps(facts["arguments"][n]["default"]) for env, facts in variants if "VLLM_USE_V1" not in env}
        if len(v0_defaults) > 1 or len(unset_defaults) > 1:
            raise FactsError(f"{row['flags'][0]}: its default changes with PYTHONHASHSEED ({v0_defaults | unset_defaults})")
        if v0_defaults != unset_defaults:
            out[V0_ENV_DEFAULT_KEY] = json.loads(next(iter(v0_defaults)))
        for other in seen:
            rest = {k: v for k, v in other.items() if k not in ("choices", "default")}
            if rest != {k: v for k, v in row.items() if k not in ("choices", "default")}:
                raise FactsError(f"{row['flags'][0]}: differs between processes beyond choices/default: {row} vs {other}")
        # keys in the table's usual order: the extra ones after what they qualify
        order = ["flags", "action", "type", "parser_type", "default", V0_ENV_DEFAULT_KEY, "choices", "choices_unstable",
                 "nargs", "deprecated"]
        merged.append({k: out[k] for k in order if k in out})
    return merged


def collect_cli_inputs(python: str, release: str, seeds: int, lock_arg: Optional[str],
                       index_url: str) -> Dict[str, Any]:
    """What the CLI table is made of, read from a venv: the raw dump of every variant and the wheel's name."""
    variants = dump_variants(python, seeds)
    facts = variants[0][1]
    if facts["vllm"] != release:
        raise FactsError(f"{python} has vllm {facts['vllm']}, not {release}; pass that release's venv")
    lock = Path(lock_arg) if lock_arg else REPO / "data" / "locks" / f"vllm-{release}-py{facts['python']}.txt"
    source, how = generated_from(site_packages(python), release, lock if lock.exists() else None, index_url)
    return {"format": RECORDING_FORMAT, "release": release, "hash_seeds": seeds,
            "generated_from": {"source": source, "how": how},
            "variants": [{"env": env, "dump": dump} for env, dump in variants]}


@dataclass
class Rendered:
    block: str                               # the text between the marker lines
    report: List[str]                        # what the tool prints about it
    check: Callable[[Any], None]             # run on the loaded file before --write replaces it
    failed: bool = False                     # the inputs contradict each other: print the report, write nothing


def render_cli(inputs: Dict[str, Any]) -> Rendered:
    """The `cli:` block from the CLI inputs (live or recorded: the same code path)."""
    release, seeds = inputs["release"], inputs["hash_seeds"]
    variants = [(v["env"], v["dump"]) for v in inputs["variants"]]
    facts = variants[0][1]
    if any(dump["vllm"] != release for _, dump in variants):
        raise FactsError(f"the dumps are of vllm {sorted({d['vllm'] for _, d in variants})}, not {release}")
    source, how = inputs["generated_from"]["source"], inputs["generated_from"]["how"]
    rows = merge_variants(variants)
    summary = (f"{len(rows)} actions of make_arg_parser(FlexibleArgumentParser()) plus -h, vLLM {release} on "
               f"Python {facts['python']}; built {len(variants)} times (PYTHONHASHSEED 0-{seeds - 1}, "
               "VLLM_USE_V1 unset and 0)")
    if any(facts_.get("platform_stand_in") for _, facts_ in variants):
        summary += f"; {STAND_IN_NOTE}"
    report = [f"vllm {facts['vllm']} (Python {facts['python']}): {len(rows)} actions; generated_from: {source} ({how})"]
    for row in rows:
        if "choices_unstable" in row:
            report.append(f"  unstable choices: {row['flags'][0]} accepts {row['choices_unstable']} only in some "
                          "processes (PYTHONHASHSEED); the table keeps the choices every process accepts")
        if V0_ENV_DEFAULT_KEY in row:
            report.append(f"  env-dependent default: {row['flags'][0]} is {row['default']!r}, "
                          f"{row[V0_ENV_DEFAULT_KEY]!r} under VLLM_USE_V1=0")
    for row in (r for r in rows if "parser_type" in r):
        report.append(f"  approximated type: {row['flags'][0]} {row['parser_type']} -> {row['type']}: "
                      f"{TYPE_MAP[row['parser_type']].accepts}")
    return Rendered(cli_block(rows, source, summary), report, check_cli_loaded(release, rows))


def cmd_cli(args: argparse.Namespace) -> int:
    if args.from_recorded:
        inputs = read_recorded(Path(args.from_recorded), "cli", args.release)
    else:
        inputs = same_as_recorded(collect_cli_inputs(args.python, args.release, args.hash_seeds, args.lock,
                                                     args.index_url))
        if args.record:
            record_inputs(Path(args.record), "cli", inputs, args)
    return emit(args, render_cli(inputs), CLI_BEGIN, CLI_END, "cli")


def emit(args: argparse.Namespace, rendered: Rendered, begin: str, end: str, kind: str) -> int:
    """Print the report; then the block, or (--write) put it between the release's marker lines."""
    for line in rendered.report:
        print(line)
    if rendered.failed:
        raise FactsError("the fatbin headers, their contents or torch's arch list disagree (above); not trusting "
                         "this scan")
    if not args.write:
        sys.stdout.write(rendered.block)
        return 0
    text = RELEASES_FILE.read_text(encoding="utf-8")
    start, stop = release_span(text, args.release)
    if begin not in text[start:stop]:
        print(f"releases.{args.release} has no marker lines; not written. Add this to the entry:\n"
              f"{begin}\n{rendered.block}{end}")
        return 1
    write_block(args.release, begin, end, rendered.block, rendered.check)
    print(f"wrote releases.{args.release}.{kind} into {RELEASES_FILE}")
    return 0


# ---------------------------------------------------------------------------------------------------------
# Recorded inputs: what a block is made of, kept so that it can be made again without a venv
# ---------------------------------------------------------------------------------------------------------

RECORDING_FORMAT = 1
RECORDED_FILES = {"cli": "cli-dumps.json.gz", "kernels": "kernels.json.gz"}
MANIFEST = "manifest.json"
RECORDED_ROOT = REPO / "tests" / "data" / "release-inputs"
MARKERS = {"cli": (CLI_BEGIN, CLI_END), "kernels": (KERNELS_BEGIN, KERNELS_END)}


def same_as_recorded(inputs: Dict[str, Any]) -> Dict[str, Any]:
    """The inputs as a recording gives them back (JSON: int keys become strings, tuples lists), so that live
    and recorded generation run on equal values."""
    return json.loads(json.dumps(inputs))


def gzip_json(data: Any) -> bytes:
    """Deterministic .json.gz bytes: no file name or time stamp in the gzip header."""
    raw = (json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")
    return gzip.compress(raw, compresslevel=9, mtime=0)


def read_recorded(directory: Path, kind: str, release: Optional[str] = None) -> Dict[str, Any]:
    path = directory / RECORDED_FILES[kind]
    if not path.is_file():
        raise FactsError(f"{path}: no recorded {kind} inputs (record them with `{kind} --python VENV --record "
                         f"{directory}`)")
    inputs = json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))
    if inputs.get("format") != RECORDING_FORMAT:
        raise FactsError(f"{path}: recording format {inputs.get('format')}, this tool reads {RECORDING_FORMAT}")
    if release is not None and inputs["release"] != release:
        raise FactsError(f"{path}: recorded for vllm {inputs['release']}, not {release}")
    return inputs


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def locked_wheel(lock: Path, release: str, index_url: str) -> Dict[str, str]:
    """{file, sha256} of the one vllm wheel among the lock's hashes (what a --require-hashes install used)."""
    hashes = set(lock_hashes(lock, "vllm", release))
    wheels = {h: n for h, n in index_wheels("vllm", release, index_url).items() if h in hashes}
    if len(wheels) != 1:
        raise FactsError(f"{lock}: {len(wheels)} of its vllm hashes are wheels on {index_url}, expected one")
    digest, name = next(iter(wheels.items()))
    return {"file": name, "sha256": digest}


def record_inputs(directory: Path, kind: str, inputs: Dict[str, Any], args: argparse.Namespace) -> None:
    """Write the inputs (`cli-dumps.json.gz` / `kernels.json.gz`) and update `manifest.json`: the wheel, the lock,
    the tool's commit and the command that recorded them."""
    directory.mkdir(parents=True, exist_ok=True)
    data = gzip_json(inputs)
    (directory / RECORDED_FILES[kind]).write_bytes(data)
    python = (inputs["variants"][0]["dump"]["python"] if kind == "cli" else
              _run_venv(args.python, ["-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).strip())
    lock = REPO / "data" / "locks" / f"vllm-{args.release}-py{python}.txt"
    if kind == "cli" and args.lock:
        lock = Path(args.lock).resolve()
    manifest_path = directory / MANIFEST
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else {}
    if manifest.get("release", args.release) != args.release:
        raise FactsError(f"{manifest_path} is of vllm {manifest['release']}, not {args.release}")
    tool = Path(__file__).resolve()
    manifest.update({
        "release": args.release, "python": python,
        "lock": {"path": os.path.relpath(lock, REPO), "sha256": hashlib.sha256(lock.read_bytes()).hexdigest()},
        "wheel": locked_wheel(lock, args.release, getattr(args, "index_url", DEFAULT_INDEX)),
    })
    manifest.setdefault("recorded", {})[kind] = {
        "file": RECORDED_FILES[kind], "sha256": hashlib.sha256(data).hexdigest(),
        "command": " ".join(shlex.quote(a) for a in ["tools/release_facts.py", *sys.argv[1:]]),
        "tool": {"commit": _git("rev-parse", "HEAD"),
                 "modified_since_commit": bool(_git("status", "--porcelain", "--", str(tool))),
                 "release_facts_py_sha256": hashlib.sha256(tool.read_bytes()).hexdigest()},
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=2) + "\n", encoding="utf-8")
    print(f"recorded the {kind} inputs in {directory / RECORDED_FILES[kind]} ({len(data)} bytes) and {manifest_path}")


def committed_block(text: str, release: str, kind: str) -> str:
    """The text between the release's `kind` marker lines in the release file's text."""
    begin, end = MARKERS[kind]
    start, stop = release_span(text, release)
    lines = text[start:stop].splitlines(keepends=True)
    marks = [n for n, line in enumerate(lines) if line.rstrip("\n") in (begin, end)]
    if len(marks) != 2:
        raise FactsError(f"releases.{release} needs exactly one pair of {kind} marker lines (found {len(marks)})")
    return "".join(lines[marks[0] + 1:marks[1]])


RENDERERS: Dict[str, Callable[[Dict[str, Any]], "Rendered"]] = {}


def check_recorded(text: str, root: Path = RECORDED_ROOT) -> Tuple[List[str], List[str]]:
    """(checked, problems): every recorded release's blocks made again from its recordings and compared with the
    committed text between the markers. A problem names the release, the block and the first differing lines."""
    checked, problems = [], []
    for directory in sorted(p for p in root.iterdir() if (p / MANIFEST).is_file()):
        release = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))["release"]
        for kind in RECORDED_FILES:
            if not (directory / RECORDED_FILES[kind]).is_file():
                continue
            rendered = RENDERERS[kind](read_recorded(directory, kind, release))
            committed = committed_block(text, release, kind)
            checked.append(f"{release} {kind}")
            if rendered.failed:
                problems.append(f"releases.{release}.{kind}: the recorded inputs fail the tool's checks")
            elif rendered.block != committed:
                diff = list(difflib.unified_diff(committed.splitlines(), rendered.block.splitlines(),
                                                 "committed", f"from {directory.name}", n=0, lineterm=""))
                problems.append(f"releases.{release}.{kind} is not what the tool makes of "
                                f"{os.path.relpath(directory, REPO)} (regenerate with `{kind} --from-recorded "
                                f"{os.path.relpath(directory, REPO)} --release {release} --write`):\n"
                                + "\n".join(diff[:12]))
    return checked, problems


def cmd_check(args: argparse.Namespace) -> int:
    checked, problems = check_recorded(RELEASES_FILE.read_text(encoding="utf-8"), Path(args.recorded_root))
    for item in checked:
        print(f"checked {item}")
    for problem in problems:
        print(problem)
    print(f"{len(checked)} blocks made again from recordings, {len(problems)} differ from {RELEASES_FILE.name}")
    return 1 if problems or not checked else 0


# ---------------------------------------------------------------------------------------------------------
# Kernels: ELF sections -> fatbin containers -> cubin / PTX entries
# ---------------------------------------------------------------------------------------------------------

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", ".nv.fatbin", "__nv_relfatbin")
KIND_PTX, KIND_CUBIN = 1, 2
FLAG_COMPRESSED = 0x2000                  # entry payload is an LZ4 block (nvcc -Xfatbin -compress-all default)
ELF_CUDA_OSABI = 0x33                     # EI_OSABI of CUDA cubins


@dataclass
class FatbinScan:
    cubin_archs: set = field(default_factory=set)
    ptx_archs: set = field(default_factory=set)
    entries: int = 0
    verified: int = 0                        # entries whose arch a second method (ELF e_flags / PTX .target) confirms
    mismatches: List[str] = field(default_factory=list)
    containers: int = 0                      # fatbin containers, one per compiled .cu translation unit
    containers_with: Dict[int, int] = field(default_factory=dict)  # sm -> containers holding code for it


def elf_sections(handle: Any, path: str) -> Dict[str, Tuple[int, int]]:
    """name -> (file offset, size) of a little-endian ELF64 file's sections."""
    handle.seek(0)
    header = handle.read(64)
    if len(header) < 64 or header[:4] != b"\x7fELF":
        raise FactsError(f"{path}: not an ELF file")
    if header[4] != 2 or header[5] != 1:
        raise FactsError(f"{path}: only little-endian ELF64 is read (EI_CLASS={header[4]}, EI_DATA={header[5]})")
    shoff, = struct.unpack_from("<Q", header, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", header, 0x3A)
    handle.seek(shoff)
    table = handle.read(shentsize * shnum)
    rows = [struct.unpack_from("<IIQQQQIIQQ", table, n * shentsize) for n in range(shnum)]
    handle.seek(rows[shstrndx][4])
    names = handle.read(rows[shstrndx][5])
    return {names[r[0]:names.index(b"\0", r[0])].decode("ascii", "replace"): (r[4], r[5]) for r in rows}


def lz4_prefix(source: bytes, want: int) -> bytes:
    """The first `want` bytes an LZ4 block decodes to (enough for an ELF header or a PTX preamble)."""
    out = bytearray()
    pos = 0
    while pos < len(source) and len(out) < want:
        token = source[pos]
        pos += 1
        literal = token >> 4
        if literal == 15:
            while True:
                extra = source[pos]
                pos += 1
                literal += extra
                if extra != 255:
                    break
        out += source[pos:pos + literal]
        pos += literal
        if pos >= len(source) or len(out) >= want:
            break
        offset = source[pos] | (source[pos + 1] << 8)
        pos += 2
        length = token & 15
        if length == 15:
            while True:
                extra = source[pos]
                pos += 1
                length += extra
                if extra != 255:
                    break
        start = len(out) - offset
        if offset == 0 or start < 0:
            raise ValueError("LZ4 match offset outside the output")
        for n in range(length + 4):
            out.append(out[start + n])
    return bytes(out[:want])


def second_opinion(kind: int, payload: bytes) -> Optional[int]:
    """The arch the entry's own content states: cubin ELF e_flags low byte, or PTX `.target sm_XX`."""
    if kind == KIND_CUBIN:
        if len(payload) >= 0x34 and payload[:4] == b"\x7fELF" and payload[7] == ELF_CUDA_OSABI:
            return struct.unpack_from("<I", payload, 0x30)[0] & 0xFF
        return None
    match = re.search(rb"\.target\s+sm_(\d+)", payload)
    return int(match.group(1)) if match else None


def scan_fatbin(handle: Any, offset: int, size: int, scan: FatbinScan, where: str) -> None:
    """Walk every fatbin container in [offset, offset+size) and record its entries' archs."""
    pos, end = offset, offset + size
    while pos + 16 <= end:
        handle.seek(pos)
        magic, _version, header_size, fat_size = struct.unpack("<IHHQ", handle.read(16))
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned; padding between them is zeros
            continue
        entry, stop = pos + header_size, pos + header_size + fat_size
        scan.containers += 1
        seen = set()
        while entry + 64 <= stop:
            handle.seek(entry)
            head = handle.read(64)
            kind, _, entry_header, payload_size = struct.unpack_from("<HHIQ", head, 0)
            compressed_size, = struct.unpack_from("<I", head, 16)
            arch, = struct.unpack_from("<I", head, 28)
            flags, = struct.unpack_from("<Q", head, 40)
            if entry_header == 0:
                break
            if kind in (KIND_PTX, KIND_CUBIN):
                scan.entries += 1
                seen.add(arch)
                (scan.cubin_archs if kind == KIND_CUBIN else scan.ptx_archs).add(arch)
                handle.seek(entry + entry_header)
                # the payload is padded to 8 bytes after its compressed_size bytes of LZ4 data
                stored = compressed_size if flags & FLAG_COMPRESSED and compressed_size else payload_size
                payload = handle.read(min(stored, 16384))
                try:
                    content = lz4_prefix(payload, 512) if flags & FLAG_COMPRESSED else payload[:512]
                except (IndexError, ValueError):
                    content = b""
                stated = second_opinion(kind, content)
                if stated == arch:
                    scan.verified += 1
                elif stated is not None:
                    scan.mismatches.append(f"{where}+{entry:#x}: header sm_{arch}, content sm_{stated}")
            entry += entry_header + payload_size
        for arch in seen:
            scan.containers_with[arch] = scan.containers_with.get(arch, 0) + 1
        pos = stop


def scan_file(path: Path) -> Optional[FatbinScan]:
    """The file's fatbin archs, or None when it has no fatbin section."""
    with open(path, "rb") as handle:
        sections = elf_sections(handle, str(path))
        present = [name for name in FATBIN_SECTIONS if name in sections]
        if not present:
            return None
        scan = FatbinScan()
        for name in present:
            scan_fatbin(handle, *sections[name], scan, f"{path.name}:{name}")
        return scan


@dataclass(frozen=True)
class Dependency:
    distribution: str
    folder: str                             # under site-packages
    pattern: str                            # glob of the compiled files


DEPENDENCIES = (
    Dependency("vllm", "vllm", "**/*.so"),
    Dependency("xformers", "xformers", "**/*.so"),
    Dependency("torch", "torch/lib", "*.so*"),
)


def scan_dependency_files(site: Path, dep: Dependency) -> Dict[str, Any]:
    """The raw per-file results of one distribution's .so files (what `--record` keeps): each file's fatbin
    archs, entries, verifications and mismatches, or null for a file without a fatbin section."""
    root = site / dep.folder
    dist = dist_info(site, dep.distribution)
    version = dist.name[len(dep.distribution) + 1:-len(".dist-info")]
    files = sorted(p for p in root.glob(dep.pattern) if p.is_file())
    if not files:
        raise FactsError(f"{root}: no {dep.pattern} files; is {dep.distribution} installed in this venv?")
    scanned = []
    for path in files:
        scan = scan_file(path)
        scanned.append({"path": str(path.relative_to(site)), "fatbin": None if scan is None else {
            "cubin": sorted(scan.cubin_archs), "ptx": sorted(scan.ptx_archs), "containers": scan.containers,
            "containers_with": sorted(scan.containers_with.items()), "entries": scan.entries,
            "verified": scan.verified, "mismatches": scan.mismatches}})
    return {"distribution": dep.distribution, "version": version, "folder": dep.folder, "pattern": dep.pattern,
            "files": scanned}


def combine_dependency(raw: Dict[str, Any]) -> Dict[str, Any]:
    """One distribution's result from its per-file results: the union of the archs and each file's own."""
    total = FatbinScan()
    per_file: Dict[str, Dict[str, Any]] = {}
    for item in raw["files"]:
        scan = item["fatbin"]
        if scan is None:
            continue
        per_file[item["path"]] = {"cubin": list(scan["cubin"]), "ptx": list(scan["ptx"]),
                                  "containers": scan["containers"],
                                  "containers_with": {int(sm): n for sm, n in sorted(scan["containers_with"])}}
        total.cubin_archs |= set(scan["cubin"])
        total.ptx_archs |= set(scan["ptx"])
        total.entries += scan["entries"]
        total.verified += scan["verified"]
        total.mismatches += scan["mismatches"]
    return {"distribution": raw["distribution"], "version": raw["version"], "files_scanned": len(raw["files"]),
            "files_with_fatbin": per_file, "cubin_archs": sorted(total.cubin_archs),
            "ptx_archs": sorted(total.ptx_archs), "entries": total.entries, "verified": total.verified,
            "mismatches": total.mismatches}


def scan_dependency(site: Path, dep: Dependency) -> Dict[str, Any]:
    return combine_dependency(same_as_recorded(scan_dependency_files(site, dep)))


def kernels_block(results: List[Dict[str, Any]], release: str) -> str:
    """`kernels:` as the loader reads it (a list of {distribution, version, cubin_archs, ptx_archs}), plus the
    per-file archs (`files:`, for the reader: the union over a .so hides that one translation unit may carry an
    arch the others lack, so `containers_with` counts the fatbin containers holding code for each sm)."""
    lines = [
        "    kernels:",
        "      # sm_XX of the cubins / PTX in every .nv_fatbin of each distribution's .so files: fatbin entry headers,",
        "      # each confirmed by its cubin's ELF e_flags or PTX .target; torch's also by torch._C._cuda_getArchFlags()",
    ]
    for result in results:
        lines.append(f"      - distribution: {yaml_scalar(result['distribution'])}")
        for key in ("version", "files_scanned", "cubin_archs", "ptx_archs"):
            lines.append(f"        {key}: {yaml_flow(result[key], quote=(key == 'version'))}")
        lines.append("        files:")
        for name, archs in result["files_with_fatbin"].items():
            lines.append(f"          {json.dumps(name)}:")
            lines.extend(f"            {key}: {yaml_flow(value)}" for key, value in archs.items())
    return "\n".join(lines) + "\n"


def check_kernels_loaded(release: str, results: List[Dict[str, Any]]) -> Callable[[Any], None]:
    def check(data: Any) -> None:
        loaded = [(k.distribution, k.version, list(k.cubin_archs), list(k.ptx_archs))
                  for k in getattr(data.release(release), "kernels", ())]
        wanted = [(r["distribution"], r["version"], r["cubin_archs"], r["ptx_archs"]) for r in results]
        if loaded != wanted:
            raise FactsError(f"the loader read kernels {loaded}, the scan found {wanted}")
    return check


def compare_torch_arch_list(flags: Sequence[str], torch_result: Dict[str, Any]) -> Tuple[bool, str]:
    """(failed, verdict): torch's compiled arch list against the cubins found in its .so files.

    Every listed sm_XX must be among the cubins. A cubin sm_XX the list lacks is accepted only where a minority
    of a file's containers carry it: single .cu files built with their own -gencode (torch 2.7.0's
    libtorch_cuda.so has sm_89 in 2 of 378 containers); more than that means the scan or the list is wrong.
    Only torch's own libraries (torch/lib/libtorch*) are compared: NVIDIA libraries torch ships beside them keep
    their own arch lists (torch 2.5.1's libcusparseLt has sm_80 - sm_90 only)."""
    compiled = sorted(int(f[3:]) for f in flags if f.startswith("sm_"))
    own = {name: archs for name, archs in torch_result["files_with_fatbin"].items()
           if os.path.basename(name).startswith("libtorch")}
    found = sorted({a for archs in own.values() for a in archs["cubin"]})
    missing = [a for a in compiled if a not in found]
    extra: List[str] = []
    failed = bool(missing)
    for arch in (a for a in found if a not in compiled):
        for name, archs in own.items():
            count = archs["containers_with"].get(arch, 0)
            if count:
                extra.append(f"sm_{arch} in {count} of {archs['containers']} containers of {name}")
                failed = failed or 2 * count > archs["containers"]
    if missing:
        return True, f"DIFFERS: no cubins for {', '.join(f'sm_{a}' for a in missing)}"
    if failed:
        return True, f"DIFFERS: cubins beyond the list in most containers: {'; '.join(extra)}"
    if extra:
        return False, f"every listed arch has cubins; per-file extras: {'; '.join(extra)}"
    return False, "matches the cubins found"


def collect_kernels_inputs(python: str, release: str) -> Dict[str, Any]:
    """What the kernels block is made of, read from a venv: every scanned file's raw result and torch's list."""
    site = site_packages(python)
    vllm_version = dist_info(site, "vllm").name[len("vllm-"):-len(".dist-info")]
    if vllm_version != release:
        raise FactsError(f"{python} has vllm {vllm_version}, not {release}; pass that release's venv")
    # a third opinion for torch: the arch list it was compiled with (readable without a GPU)
    flags = _run_venv(python, ["-c", "import torch; print(torch._C._cuda_getArchFlags())"]).split()
    return {"format": RECORDING_FORMAT, "release": release, "torch_arch_flags": flags,
            "distributions": [scan_dependency_files(site, dep) for dep in DEPENDENCIES]}


def render_kernels(inputs: Dict[str, Any]) -> Rendered:
    """The `kernels:` block from the scan's inputs (live or recorded: the same code path)."""
    release, flags = inputs["release"], inputs["torch_arch_flags"]
    results = [combine_dependency(raw) for raw in inputs["distributions"]]
    vllm = next(r for r in results if r["distribution"] == "vllm")
    if vllm["version"] != release:
        raise FactsError(f"the scan is of vllm {vllm['version']}, not {release}")
    torch_result = next(r for r in results if r["distribution"] == "torch")
    failed, verdict = compare_torch_arch_list(flags, torch_result)
    report = [f"torch._C._cuda_getArchFlags(): {' '.join(flags)} ({verdict})"]
    for result in results:
        report.append(json.dumps({k: result[k] for k in ("distribution", "version", "files_scanned", "cubin_archs",
                                                         "ptx_archs")}))
        report.append(f"  {result['verified']} of {result['entries']} entries confirmed by their content, "
                      f"{len(result['mismatches'])} contradicted")
        for name, archs in result["files_with_fatbin"].items():
            report.append(f"  {name}: cubin {archs['cubin']} ptx {archs['ptx']}; of {archs['containers']} "
                          f"containers, per sm: {archs['containers_with']}")
        report.extend(f"  MISMATCH {line}" for line in result["mismatches"][:20])
        failed = failed or bool(result["mismatches"])
    return Rendered(kernels_block(results, release), report, check_kernels_loaded(release, results), failed)


def cmd_kernels(args: argparse.Namespace) -> int:
    if args.from_recorded:
        inputs = read_recorded(Path(args.from_recorded), "kernels", args.release)
    else:
        inputs = same_as_recorded(collect_kernels_inputs(args.python, args.release))
        if args.record:
            record_inputs(Path(args.record), "kernels", inputs, args)
    return emit(args, render_kernels(inputs), KERNELS_BEGIN, KERNELS_END, "kernels")


RENDERERS.update(cli=render_cli, kernels=render_kernels)


def main(argv: Sequence[str]) -> int:
    if len(argv) == 2 and argv[0] == "_dump-cli":  # under the venv's interpreter, called by `cli`
        return _dump_cli_in_venv(argv[1])
    parser = argparse.ArgumentParser(prog="tools/release_facts.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (("cli", "the server's argparse table"), ("kernels", "the sm_XX of the compiled code")):
        sub = commands.add_parser(name, help=helptext)
        source = sub.add_mutually_exclusive_group(required=True)
        source.add_argument("--python", help="bin/python of a venv with the release installed")
        source.add_argument("--from-recorded", metavar="DIR",
                            help="make the block from inputs recorded with --record (no venv, no network)")
        sub.add_argument("--release", required=True, help="the release's key in data/vllm-releases.yml")
        sub.add_argument("--write", action="store_true", help="replace the marked block in data/vllm-releases.yml")
        sub.add_argument("--record", metavar="DIR", help=f"also keep the inputs read from the venv in "
                                                         f"DIR/{RECORDED_FILES[name]} and DIR/{MANIFEST}")
        if name == "cli":
            sub.add_argument("--lock", help="the lock the venv was installed from (default: "
                                            "data/locks/vllm-<release>-py<X.Y>.txt if present)")
            sub.add_argument("--hash-seeds", type=int, default=6,
                             help="build the parser under PYTHONHASHSEED 0..N-1 (each with and without VLLM_USE_V1=0)")
        sub.add_argument("--index-url", default=DEFAULT_INDEX, help="PEP 691 index to name the lock's wheel")
    check = commands.add_parser("check", help="make every recorded release's blocks again and compare them with "
                                              "data/vllm-releases.yml")
    check.add_argument("--recorded-root", default=str(RECORDED_ROOT), help="directory of vllm-<release>/ recordings")
    args = parser.parse_args(argv)
    if getattr(args, "record", None) and args.from_recorded:
        parser.error("--record reads a venv: use it with --python, not --from-recorded")
    try:
        return {"cli": cmd_cli, "kernels": cmd_kernels, "check": cmd_check}[args.command](args)
    except FactsError as exc:
        print(f"release_facts.py {args.command}: {exc}", file=sys.stderr)
        return 1

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
