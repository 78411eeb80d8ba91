"""The vLLM release data (data/vllm-releases.yml): validated loading and the questions the planner asks.

The file is data, not code; this module checks its shape (naming the offending key path) and answers:
which release is the default for a compute capability, what a version range says about Volta, which
engine / attention backend / KV sizing a release uses on a GPU, and whether an argv is valid for the
release's CLI (unknown flag, bad choice, bad type: the same things argparse would exit 2 on).

Loading takes the parsed dict (`load_release_data`), because modules receive it as a parameter
(AnsiballZ ships no data files; the play passes ``lookup('file', 'data/vllm-releases.yml') | from_yaml``),
or a path on the controller (`load_release_file`, needs PyYAML).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

SCHEMA_VERSION = 1
KV_SIZING_FAMILIES = ("v0-mem-get-info", "v0-torch-peak-global", "v0-per-instance", "v1")
ARG_TYPES = ("str", "nullable_str", "int", "float", "json", "bool", "human_readable_int",
             "human_readable_int_or_auto")
VALUELESS_ACTIONS = ("store_true", "store_false", "BooleanOptionalAction")
STATUSES = ("supported", "experimental", "refused", "refused-on-volta")
# How a release chooses between its engines (docs/facts/vllm-volta.md §1.1): v0-only (<= 0.6.3: no V1);
# v1-opt-in (0.6.4 - 0.7.3: V0 unless VLLM_USE_V1=1, which selects the alpha V1 that cannot run on CC < 8.0);
# v1-default-cc8-fallback (0.8.0 - 0.10.1.1: V1 unless the oracle falls back, always on CC < 8.0);
# v1-only (0.11.0 on).
ENGINE_ORACLES = ("v0-only", "v1-opt-in", "v1-default-cc8-fallback", "v1-only")
# What xFormers does with a model's attention logit soft-capping (Gemma-2): 0.5.4 raises at start
# (v0.5.4:vllm/attention/backends/xformers.py:416-418); 0.6.6.post1 - 0.9.2 log a warning and run without it
# (v0.9.2:vllm/attention/backends/xformers.py:401-403: "Outputs may be slightly off").
SOFTCAP_FAILURES = ("raises", "ignored-with-warning")
# Where a release's known_issues apply: the GPUs below compute capability 8.0 (Volta, Turing), or every GPU.
ISSUE_SCOPES = ("CC < 8.0", "every GPU")


class ReleaseDataError(Exception):
    """The release data file is malformed, or asked about a release it does not hold."""


def parse_version(text: str) -> Tuple[int, ...]:
    """'0.10.1.1' -> (0, 10, 1, 1); a '.postN' suffix sorts after the plain release."""
    match = re.fullmatch(r"(\d+(?:\.\d+)*)(?:\.post(\d+))?(?:\+[\w.]+)?", str(text).strip())
    if not match:
        raise ReleaseDataError(f"version {text!r} is not of the form X.Y.Z[.W][.postN]")
    numbers = tuple(int(part) for part in match.group(1).split("."))
    numbers = numbers + (0,) * (4 - len(numbers))
    return numbers + (int(match.group(2)) if match.group(2) else -1,)


def version_matches(version: str, spec: str) -> bool:
    """True when `version` satisfies every clause of `spec` (">=0.10.2,<0.11.0")."""
    value = parse_version(version)
    for clause in spec.split(","):
        match = re.fullmatch(r"\s*(>=|<=|==|<|>)\s*([\w.+]+)\s*", clause)
        if not match:
            raise ReleaseDataError(f"version range clause {clause!r} in {spec!r} is not like '>=0.5.4'")
        bound = parse_version(match.group(2))
        op = match.group(1)
        if not {">=": value >= bound, "<=": value <= bound, "==": value == bound,
                "<": value < bound, ">": value > bound}[op]:
            return False
    return True


def parse_cc(text: Any) -> Tuple[int, int]:
    """'7.0' (or 7.0, or [7, 0]) -> (7, 0)."""
    if isinstance(text, (list, tuple)) and len(text) == 2:
        return int(text[0]), int(text[1])
    match = re.fullmatch(r"(\d+)\.(\d+)", str(text).strip())
    if not match:
        raise ReleaseDataError(f"compute capability {text!r} is not of the form MAJOR.MINOR")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class CliArgument:
    flags: Tuple[str, ...]
    action: str
    type: Optional[str]
    default: Any
    choices: Optional[Tuple[str, ...]]
    nargs: Optional[str]
    deprecated: Optional[str]

    @property
    def takes_value(self) -> bool:
        return self.action not in VALUELESS_ACTIONS


@dataclass(frozen=True)
class Installability:
    """Whether the release's published dependencies can be satisfied from the public index today."""

    pypi: bool
    reason: str
    remedy: str


@dataclass(frozen=True)
class KernelScan:
    """The GPU code one compiled dependency of a release carries (tools/release_facts.py kernels)."""

    distribution: str
    version: str
    cubin_archs: Tuple[int, ...]
    ptx_archs: Tuple[int, ...]

    def runs_on(self, arch: int) -> bool:
        # A cubin runs on its own major at an equal or higher minor. PTX is not counted: the scan's PTX is a union
        # over files (vLLM 0.8.5.post1's sm_52 PTX comes from a file with no kernels), so it proves nothing.
        return any(a // 10 == arch // 10 and a <= arch for a in self.cubin_archs)


@dataclass(frozen=True)
class Release:
    version: str
    status: str
    min_compute_capability: Tuple[int, int]
    engine_by_cc: Dict[str, str]
    attention_backend_by_cc: Dict[str, str]
    kv_sizing_by_engine: Dict[str, str]
    pins: Dict[str, str]
    driver: Dict[str, Any]
    defaults: Dict[str, Any]
    quantization_min_cc: Dict[str, int]
    entrypoint: Tuple[str, ...]
    cli_complete: bool
    arguments: Tuple[CliArgument, ...]
    metrics: Tuple[str, ...]
    raw: Dict[str, Any] = field(repr=False)
    installability: Optional[Installability] = None
    kernels: Tuple[KernelScan, ...] = ()
    engine_oracle: Optional[str] = None
    known_issues: Tuple[Dict[str, str], ...] = ()

    def kernel_gaps(self, cc: Tuple[int, int]) -> List[str]:
        """Compiled dependencies of the release with no code for this CC (from the wheels' fatbin scan)."""
        arch = cc[0] * 10 + cc[1]
        return [f"{scan.distribution} {scan.version} (cubins sm_{', sm_'.join(str(a) for a in scan.cubin_archs)})"
                for scan in self.kernels if not scan.runs_on(arch)]

    def engine_for(self, cc: Tuple[int, int]) -> str:
        return self.engine_by_cc["below_8" if cc < (8, 0) else "from_8"]

    def attention_backend_for(self, cc: Tuple[int, int]) -> str:
        return self.attention_backend_by_cc["below_8" if cc < (8, 0) else "from_8"]

    def kv_sizing_for(self, engine: str) -> str:
        if engine not in self.kv_sizing_by_engine:
            raise ReleaseDataError(f"release {self.version} has no KV sizing for engine {engine}")
        return self.kv_sizing_by_engine[engine]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    def argument(self, flag: str) -> Optional[CliArgument]:
        flag = _normalise_flag(flag)
        for argument in self.arguments:
            if flag in argument.flags:
                return argument
        return None

    def validate_argv(self, argv: Sequence[str]) -> List[str]:
        """Errors argparse would raise for `argv` (server flags only, no interpreter/entrypoint)."""
        errors: List[str] = []
        position = 0
        tokens = list(argv)
        while position < len(tokens):
            token = tokens[position]
            position += 1
            if not token.startswith("-"):
                errors.append(f"stray value {token!r}: every server argument must follow a flag")
                continue
            flag, _, inline = token.partition("=")
            argument = self.argument(flag)
            if argument is None:
                if not inline and position < len(tokens) and not tokens[position].startswith("-"):
                    position += 1  # its value, so it is not reported again as a stray token
                if self.cli_complete:
                    errors.append(f"unknown flag {flag} for vLLM {self.version} (argparse: unrecognized "
                                  "arguments; the server would exit 2 at start)")
                else:
                    errors.append(f"flag {flag} is not in the verified argument table of vLLM {self.version}; "
                                  "verify it against that release before emitting it")
                continue
            if not argument.takes_value:
                if inline:
                    errors.append(f"{flag} takes no value (got {inline!r})")
                continue
            values: List[str] = []
            if inline:
                values.append(inline)
            elif argument.nargs in ("+", "*"):
                while position < len(tokens) and not tokens[position].startswith("--"):
                    values.append(tokens[position])
                    position += 1
            elif argument.nargs == "?":
                if position < len(tokens) and not tokens[position].startswith("--"):
                    values.append(tokens[position])
                    position += 1
            elif position < len(tokens):
                values.append(tokens[position])
                position += 1
            if not values and argument.nargs != "?":
                errors.append(f"{flag} expects a value")
            for value in values:
                errors.extend(_check_value(self.version, flag, argument, value))
        return errors


def _normalise_flag(flag: str) -> str:
    # FlexibleArgumentParser accepts --foo_bar as --foo-bar (docs/facts/vllm-volta.md §2.1)
    if flag.startswith("--"):
        return "--" + flag[2:].replace("_", "-")
    return flag


def _check_value(version: str, flag: str, argument: CliArgument, value: str) -> List[str]:
    kind = argument.type
    try:
        if kind == "int":
            int(value)
        elif kind == "float":
            float(value)
        elif kind == "json":
            json.loads(value)
        elif kind in ("human_readable_int", "human_readable_int_or_auto"):
            if not (re.fullmatch(r"\d+(\.\d+)?[kKmMgG]?", value)
                    or (kind == "human_readable_int_or_auto" and value in ("auto", "-1"))):
                raise ValueError(value)
        elif kind == "bool" and value.lower() not in ("true", "false"):
            raise ValueError(value)
    except ValueError:
        return [f"{flag} {value!r}: not a valid {kind} for vLLM {version} (argparse: invalid {kind} value)"]
    if argument.choices is not None and value not in argument.choices:
        return [f"{flag} {value!r}: invalid choice for vLLM {version} (choose from {', '.join(argument.choices)})"]
    return []


@dataclass(frozen=True)
class ReleaseData:
    releases: Dict[str, Release]
    default_release_by_cc: Tuple[Dict[str, Any], ...]
    volta_support: Tuple[Dict[str, Any], ...]

    def release(self, version: str) -> Release:
        if version not in self.releases:
            raise ReleaseDataError(
                f"vLLM {version} is not in the release data (known: {', '.join(self.versions())}); add an "
                "entry to data/vllm-releases.yml with its pins, CLI table and sources before planning it")
        return self.releases[version]

    def versions(self) -> List[str]:
        return sorted(self.releases, key=parse_version)

    def default_release(self, cc: Tuple[int, int]) -> Tuple[str, str]:
        for row in self.default_release_by_cc:
            if cc >= parse_cc(row["min_cc"]):
                return str(row["release"]), str(row["reason"])
        raise ReleaseDataError(
            f"no release in the data serves compute capability {cc[0]}.{cc[1]} (lowest default row: "
            f"{self.default_release_by_cc[-1]['min_cc']})")

    def volta_status(self, version: str, cc: Tuple[int, int] = (7, 0)) -> Dict[str, Any]:
        """The support row for `version` on a GPU below CC 8.0; a row with `only_cc` holds for that CC alone."""
        for row in self.volta_support:
            if row.get("only_cc") and parse_cc(row["only_cc"]) != cc:
                continue
            if version_matches(version, row["versions"]):
                return dict(row)
        return {"versions": "", "status": "refused", "engine": "none", "attention_backend": "none",
                "reason": f"vLLM {version} is older than every Volta range in the data"}


def _require(data: Dict[str, Any], key: str, kind: Any, where: str) -> Any:
    if key not in data:
        raise ReleaseDataError(f"{where}: missing key {key!r}")
    value = data[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ReleaseDataError(f"{where}.{key}: expected {names}, got {type(value).__name__}")
    return value


def _load_argument(entry: Any, where: str) -> CliArgument:
    if not isinstance(entry, dict):
        raise ReleaseDataError(f"{where}: expected a mapping")
    flags = _require(entry, "flags", list, where)
    if not flags or not all(isinstance(f, str) and f.startswith("-") for f in flags):
        raise ReleaseDataError(f"{where}.flags: expected a non-empty list of '-'-prefixed strings")
    action = _require(entry, "action", str, where)
    kind = entry.get("type")
    if action not in VALUELESS_ACTIONS and kind not in ARG_TYPES:
        raise ReleaseDataError(f"{where}.type: {kind!r} is not one of {', '.join(ARG_TYPES)}")
    choices = entry.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise ReleaseDataError(f"{where}.choices: expected a list")
    return CliArgument(
        flags=tuple(flags), action=action, type=kind, default=entry.get("default"),
        choices=tuple(str(c) for c in choices) if choices is not None else None,
        nargs=entry.get("nargs"), deprecated=entry.get("deprecated"))


def _load_release(version: str, entry: Any) -> Release:
    where = f"releases.{version}"
    if not isinstance(entry, dict):
        raise ReleaseDataError(f"{where}: expected a mapping")
    parse_version(version)
    status = _require(entry, "status", str, where)
    if status not in STATUSES:
        raise ReleaseDataError(f"{where}.status: {status!r} is not one of {', '.join(STATUSES)}")
    min_cc = parse_cc(_require(entry, "min_compute_capability", str, where))
    by_cc_keys = {"below_8", "from_8"}
    engine_by_cc = _require(entry, "engine_by_cc", dict, where)
    backend_by_cc = _require(entry, "attention_backend_by_cc", dict, where)
    for name, mapping in (("engine_by_cc", engine_by_cc), ("attention_backend_by_cc", backend_by_cc)):
        if set(mapping) != by_cc_keys:
            raise ReleaseDataError(f"{where}.{name}: expected exactly the keys below_8 and from_8")
    engine_oracle = _check_engine_oracle(entry, engine_by_cc, where)
    kv_sizing = _require(entry, "kv_sizing_by_engine", dict, where)
    for engine, family in kv_sizing.items():
        if family not in KV_SIZING_FAMILIES:
            raise ReleaseDataError(f"{where}.kv_sizing_by_engine.{engine}: {family!r} is not one of "
                                   f"{', '.join(KV_SIZING_FAMILIES)}")
    for engine in set(engine_by_cc.values()) - {"none"}:
        if engine not in kv_sizing:
            raise ReleaseDataError(f"{where}.kv_sizing_by_engine: no entry for engine {engine} named in engine_by_cc")
    pins = _require(entry, "pins", dict, where)
    if pins.get("vllm") != version:
        raise ReleaseDataError(f"{where}.pins.vllm: {pins.get('vllm')!r} must equal the release key {version!r}")
    driver = _require(entry, "driver", dict, where)
    _require(driver, "min_branch", int, f"{where}.driver")
    defaults = _require(entry, "defaults", dict, where)
    for key, kind in (("gpu_memory_utilization", (int, float)), ("max_num_seqs", int), ("block_size", int)):
        _require(defaults, key, kind, f"{where}.defaults")
    quant = _require(entry, "quantization_min_cc", dict, where)
    if not all(isinstance(v, int) for v in quant.values()):
        raise ReleaseDataError(f"{where}.quantization_min_cc: values must be integers like 75 (= CC 7.5)")
    for key in ("bf16_auto_fallback", "metrics_need_disable_frontend_multiprocessing",
                "request_logging_default", "cuda_graphs_in_budget", "xformers_logit_softcapping"):
        _require(entry, key, bool, where)
    _require(entry, "swap_space_type", str, where)
    _check_pipeline_parallel(entry.get("pipeline_parallel"), f"{where}.pipeline_parallel")
    _require(entry, "swap_space_limits", dict, where)
    _require(entry, "custom_all_reduce", dict, where)
    _require(entry, "paged_attention_head_sizes", list, where)
    entrypoint = _require(entry, "entrypoint", list, where)
    cli = _require(entry, "cli", dict, where)
    complete = _require(cli, "complete", bool, f"{where}.cli")
    raw_arguments = _require(cli, "arguments", list, f"{where}.cli")
    arguments = tuple(_load_argument(arg, f"{where}.cli.arguments[{n}]") for n, arg in enumerate(raw_arguments))
    seen: Dict[str, int] = {}
    for n, argument in enumerate(arguments):
        for flag in argument.flags:
            if flag in seen:
                raise ReleaseDataError(f"{where}.cli.arguments[{n}]: flag {flag} already defined at [{seen[flag]}]")
            seen[flag] = n
    metrics = _require(entry, "metrics", list, where)
    installability = _load_installability(entry.get("installability"), f"{where}.installability")
    if entry.get("lock") is not None:
        _load_lock_inputs(entry["lock"], f"{where}.lock")
        if installability is None:
            raise ReleaseDataError(f"{where}: a release with a lock block needs an installability block")
    kernels = tuple(_load_kernel_scan(scan, f"{where}.kernels[{n}]")
                    for n, scan in enumerate(entry.get("kernels") or []))
    softcap_failure = entry.get("xformers_logit_softcapping_failure")
    if softcap_failure is not None and softcap_failure not in SOFTCAP_FAILURES:
        raise ReleaseDataError(f"{where}.xformers_logit_softcapping_failure: {softcap_failure!r} is not one of "
                               f"{', '.join(SOFTCAP_FAILURES)}")
    known_issues = []
    for n, item in enumerate(entry.get("known_issues") or []):
        if not isinstance(item, dict):
            raise ReleaseDataError(f"{where}.known_issues[{n}]: expected a mapping with scope, issue and source")
        known_issues.append({key: " ".join(str(_require(item, key, str, f"{where}.known_issues[{n}]")).split())
                             for key in ("scope", "issue", "source")})
        if known_issues[-1]["scope"] not in ISSUE_SCOPES:
            raise ReleaseDataError(f"{where}.known_issues[{n}].scope: {item['scope']!r} is not one of "
                                   f"{', '.join(ISSUE_SCOPES)}")
    return Release(
        version=version, status=status, min_compute_capability=min_cc, engine_by_cc=dict(engine_by_cc),
        attention_backend_by_cc=dict(backend_by_cc), kv_sizing_by_engine=dict(kv_sizing),
        pins={k: str(v) for k, v in pins.items()}, driver=dict(driver), defaults=dict(defaults),
        quantization_min_cc=dict(quant), entrypoint=tuple(entrypoint), cli_complete=complete,
        arguments=arguments, metrics=tuple(metrics), raw=entry, installability=installability,
        kernels=kernels, engine_oracle=engine_oracle, known_issues=tuple(known_issues))


def _check_pipeline_parallel(data: Any, where: str) -> None:
    """The optional pipeline_parallel entry: the architectures the release pipelines, vLLM's refusal text (with
    {architectures}), its source and the executor across nodes. A release without it is planned on one node only."""
    if data is None:
        return
    if not isinstance(data, dict):
        raise ReleaseDataError(f"{where}: expected a mapping with architectures, refusal, source, executor")
    architectures = _require(data, "architectures", list, where)
    if not architectures or not all(isinstance(a, str) and a for a in architectures):
        raise ReleaseDataError(f"{where}.architectures: expected a non-empty list of architecture names")
    if "{architectures}" not in _require(data, "refusal", str, where):
        raise ReleaseDataError(f"{where}.refusal: must contain {{architectures}} (where vLLM prints its list)")
    _require(data, "source", str, where)
    if _require(data, "executor", str, where) != "ray":
        raise ReleaseDataError(f"{where}.executor: only ray serves across nodes (docs/facts/multi-node.md §1)")


def _check_engine_oracle(entry: Dict[str, Any], engine_by_cc: Dict[str, str], where: str) -> Optional[str]:
    """The optional `engine_oracle`: engine_by_cc and the plan's environment must be what that oracle gives."""
    oracle = entry.get("engine_oracle")
    if oracle is None:
        return None
    if oracle not in ENGINE_ORACLES:
        raise ReleaseDataError(f"{where}.engine_oracle: {oracle!r} is not one of {', '.join(ENGINE_ORACLES)}")
    expected = {"v0-only": {"below_8": "V0", "from_8": "V0"}, "v1-opt-in": {"below_8": "V0", "from_8": "V0"},
                "v1-default-cc8-fallback": {"below_8": "V0", "from_8": "V1"}}.get(oracle)
    if expected is not None and dict(engine_by_cc) != expected:
        raise ReleaseDataError(f"{where}.engine_by_cc: {oracle} gives {expected}, not {dict(engine_by_cc)}")
    engine_env = entry.get("engine_env") or {}
    below = (engine_env.get("below_8") or {}).get("VLLM_USE_V1")
    if oracle == "v1-default-cc8-fallback" and below != "0":
        raise ReleaseDataError(f"{where}.engine_env.below_8: {oracle} needs VLLM_USE_V1: \"0\" (VLLM_USE_V1=1 on "
                               "CC < 8.0 raises NotImplementedError; unset, every start first tries V1)")
    if oracle in ("v0-only", "v1-opt-in") and "1" in (below, (engine_env.get("from_8") or {}).get("VLLM_USE_V1")):
        raise ReleaseDataError(f"{where}.engine_env: {oracle} plans V0, so VLLM_USE_V1 must not be \"1\"")
    return str(oracle)


def _load_installability(entry: Any, where: str) -> Optional[Installability]:
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise ReleaseDataError(f"{where}: expected a mapping")
    pypi = _require(entry, "pypi", bool, where)
    reason = _require(entry, "reason", str, where)
    remedy = entry.get("remedy") or ""
    if not pypi and not remedy:
        raise ReleaseDataError(f"{where}.remedy: a release PyPI cannot install must say what the operator can do")
    return Installability(pypi=pypi, reason=reason.strip(), remedy=str(remedy).strip())


def _load_lock_inputs(entry: Any, where: str) -> None:
    if not isinstance(entry, dict):
        raise ReleaseDataError(f"{where}: expected a mapping")
    _require(entry, "exclude_newer", str, where)
    _require(entry, "platform", str, where)
    pythons = _require(entry, "pythons", list, where)
    if not pythons or not all(re.fullmatch(r"3\.\d+", str(p)) for p in pythons):
        raise ReleaseDataError(f"{where}.pythons: expected a list of Python versions like '3.10'")
    for key in ("constraints", "supplied"):
        for n, item in enumerate(_require(entry, key, list, where)):
            if not isinstance(item, dict):
                raise ReleaseDataError(f"{where}.{key}[{n}]: expected a mapping")
            for field_name in ("requirement", "reason", "source"):
                _require(item, field_name, str, f"{where}.{key}[{n}]")


def _load_kernel_scan(entry: Any, where: str) -> KernelScan:
    if not isinstance(entry, dict):
        raise ReleaseDataError(f"{where}: expected a mapping")
    archs = {}
    for key in ("cubin_archs", "ptx_archs"):
        values = entry.get(key) or []
        if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
            raise ReleaseDataError(f"{where}.{key}: expected a list of integers like 70 (= sm_70)")
        archs[key] = tuple(sorted(values))
    return KernelScan(distribution=str(_require(entry, "distribution", str, where)),
                      version=str(_require(entry, "version", str, where)), **archs)


def load_release_data(data: Any, source: str = "data/vllm-releases.yml") -> ReleaseData:
    """Validate the parsed release file; errors name `source` and the key path."""
    try:
        if not isinstance(data, dict):
            raise ReleaseDataError("expected a mapping at the top level")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ReleaseDataError(f"schema_version: expected {SCHEMA_VERSION}, got {data.get('schema_version')!r}")
        raw_releases = _require(data, "releases", dict, "top level")
        releases = {str(v): _load_release(str(v), entry) for v, entry in raw_releases.items()}
        defaults = _require(data, "default_release_by_cc", list, "top level")
        for n, row in enumerate(defaults):
            where = f"default_release_by_cc[{n}]"
            if not isinstance(row, dict):
                raise ReleaseDataError(f"{where}: expected a mapping")
            parse_cc(_require(row, "min_cc", str, where))
            if str(_require(row, "release", str, where)) not in releases:
                raise ReleaseDataError(f"{where}.release: {row['release']!r} has no entry under releases")
            _require(row, "reason", str, where)
        ccs = [parse_cc(row["min_cc"]) for row in defaults]
        if ccs != sorted(ccs, reverse=True):
            raise ReleaseDataError("default_release_by_cc: rows must be ordered by min_cc, highest first")
        volta = _require(data, "volta_support", list, "top level")
        for n, row in enumerate(volta):
            where = f"volta_support[{n}]"
            if not isinstance(row, dict):
                raise ReleaseDataError(f"{where}: expected a mapping")
            version_matches("0.0.0", _require(row, "versions", str, where))
            if _require(row, "status", str, where) not in STATUSES:
                raise ReleaseDataError(f"{where}.status: {row['status']!r} is not one of {', '.join(STATUSES)}")
            _require(row, "reason", str, where)
        return ReleaseData(releases=releases, default_release_by_cc=tuple(defaults), volta_support=tuple(volta))
    except ReleaseDataError as exc:
        raise ReleaseDataError(f"{source}: {exc}") from None


def load_release_file(path: str) -> ReleaseData:
    """Read and validate the release file on the controller (PyYAML)."""
    import yaml  # controller-side only; modules get the parsed dict as a parameter

    # libyaml's parser when PyYAML has it (~8x faster on this file), else the pure-Python one: both build the
    # data with the same SafeConstructor, so the result is the same
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.load(handle, Loader=loader)  # noqa: S506 - a safe loader
    except OSError as exc:
        raise ReleaseDataError(f"{path}: cannot read the release data ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ReleaseDataError(f"{path}: not valid YAML ({exc})") from exc
    return load_release_data(data, source=path)
