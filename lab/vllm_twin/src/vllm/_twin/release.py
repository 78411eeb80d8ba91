"""Which vLLM release the twin simulates, fixed when its wheel is built.

lab/vllm_twin/build_wheelhouse.py builds one wheel per release from this one code base and writes
`vllm/_twin/release.json` into it: the release, the wheel's version (`<release>+sim`), the upstream commit
id, the behaviour switches below and, for releases whose parser is table-driven, the CLI table of
data/vllm-releases.yml. A source checkout has no release.json and simulates 0.5.4 (what the twin was
first written for; tests/unit/test_twin_*.py run it from lab/vllm_twin/src). Nothing at run time (no
environment variable, no flag) changes the release.

The switches are plain data, one `Behaviour` per supported release; where a switch mirrors a field of
data/vllm-releases.yml the build checks that the two agree (build_wheelhouse.check_behaviour).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, TypeVar

RELEASE_FILE = Path(__file__).resolve().with_name("release.json")
CHECKOUT_RELEASE = "0.5.4"
T = TypeVar("T")


@dataclass(frozen=True)
class Behaviour:
    """How one release behaves where the lab can see it. Each field names its upstream source."""

    # The parser: "handwritten" (vllm/engine/arg_utils.py + cli_args.py of the twin, 0.5.4) or "table"
    # (argparse calls made from release.json's CLI table, vllm/_twin/cli_table.py).
    parser: str
    # Log lines `LEVEL MM-DD HH:MM:SS [file.py:N] msg` (v0.8.5.post1:vllm/logger.py:22-23) instead of 0.5.4's
    # `LEVEL MM-DD HH:MM:SS file.py:N] msg`.
    log_brackets: bool
    # vllm:* series in the default frontend-multiprocessing mode: 0.5.4 serves none (#7188); 0.5.5 on, the
    # API process reads the engine's PROMETHEUS_MULTIPROC_DIR (v0.8.5.post1:vllm/entrypoints/openai/
    # api_server.py:206-213, 319-324).
    metrics_need_disable_frontend_multiprocessing: bool
    # The V0 metric families (vllm/engine/metrics.py of the release): "0.5.4" or "0.8.5".
    metric_families: str
    # Engine start-up failure in the default mode: "hang" (0.5.4, #7213) or "exit" (PR #7217: the API
    # process gives up at its next RPC poll, v0.8.5.post1:vllm/entrypoints/openai/api_server.py:262-271).
    engine_start_failure: str
    # V0/V1 choice: "" (0.5.4 has V0 only) or "0.8" (v0.8.5.post1:vllm/engine/arg_utils.py:1106-1116, the
    # oracle at :1292-1499 and _raise_or_fallback at :1649-1658).
    engine_oracle: str
    # KV sizing family of module_utils/revive_kv.py on the V0 engine.
    kv_sizing: str
    # --swap-space's type: "int" (0.5.4) or "float" (0.5.5 on).
    swap_space_type: str
    # Requests are logged unless --disable-log-requests.
    request_logging_default: bool
    # SIGTERM in the default mode: "cut" (0.5.4: the engine process is terminated first, streams are cut)
    # or "stall" (0.8.5: the engine is stopped, open requests get nothing more and uvicorn waits for their
    # connections, v0.8.5.post1:vllm/entrypoints/launcher.py:60-79, api_server.py:278-292 and 1112-1115).
    sigterm_default_mode: str
    # Prefix of chat completion ids: "chat-" (0.5.4) or "chatcmpl-" (v0.8.5.post1:vllm/entrypoints/openai/
    # serving_chat.py:203-204).
    chat_id_prefix: str
    # PagedAttention head sizes of the xFormers backend on CC < 8.0.
    paged_attention_head_sizes: Tuple[int, ...]
    # get_min_capability() x 10 per quantization method. A built wheel takes the release's table from
    # data/vllm-releases.yml (generated from the real wheel); the values here are the checkout's.
    quantization_min_cc: Dict[str, int] = field(default_factory=dict)


BEHAVIOURS: Dict[str, Behaviour] = {
    "0.5.4": Behaviour(
        parser="handwritten", log_brackets=False, metrics_need_disable_frontend_multiprocessing=True,
        metric_families="0.5.4", engine_start_failure="hang", engine_oracle="", kv_sizing="v0-mem-get-info",
        swap_space_type="int", request_logging_default=True, sigterm_default_mode="cut", chat_id_prefix="chat-",
        paged_attention_head_sizes=(64, 80, 96, 112, 120, 128, 192, 256),
        quantization_min_cc={
            "gptq": 60, "awq": 75, "gptq_marlin": 80, "awq_marlin": 80, "marlin": 80, "gptq_marlin_24": 80,
            "fp8": 80, "fbgemm_fp8": 80, "qqq": 80, "bitsandbytes": 70, "squeezellm": 70,
            "compressed-tensors": 70, "aqlm": 60, "deepspeedfp": 60}),
    "0.8.5.post1": Behaviour(
        parser="table", log_brackets=True, metrics_need_disable_frontend_multiprocessing=False,
        metric_families="0.8.5", engine_start_failure="exit", engine_oracle="0.8", kv_sizing="v0-per-instance",
        swap_space_type="float", request_logging_default=True, sigterm_default_mode="stall",
        chat_id_prefix="chatcmpl-",
        # v0.8.5.post1:vllm/attention/ops/paged_attn.py:38-39 (get_supported_head_sizes)
        paged_attention_head_sizes=(32, 64, 80, 96, 112, 120, 128, 192, 256),
        quantization_min_cc={}),  # its wheel carries the release's table of data/vllm-releases.yml
}

# The upstream commit each release was built from (what `vllm.__commit__` says). 0.5.4: its wheel's
# vllm/commit_id.py. 0.8.5.post1's wheel carries no commit id (vllm/version.py reads setuptools-scm's
# _version.py only), so none is claimed.
COMMITS: Dict[str, Optional[str]] = {
    "0.5.4": "4db5176d9758b720b05460c50ace3c01026eb158",
    "0.8.5.post1": None,
}


@dataclass(frozen=True)
class Release:
    release: str                      # the vLLM release simulated, e.g. "0.8.5.post1"
    version: str                      # vllm.__version__ of the twin: "<release>+sim"
    commit: Optional[str]
    behaviour: Behaviour
    arguments: List[Dict[str, Any]]   # the CLI table (release.json "cli"), empty for the handwritten parser
    cli_complete: bool
    metrics: List[str]                # the release's `metrics:` list of data/vllm-releases.yml

    @property
    def legacy(self) -> bool:
        """0.5.4 (the release the twin started from) rather than 0.8.5.post1."""
        return self.release == "0.5.4"

    def as_json(self) -> Dict[str, Any]:
        return {"release": self.release, "version": self.version, "commit": self.commit,
                "behaviour": asdict(self.behaviour), "cli": {"complete": self.cli_complete,
                                                             "arguments": self.arguments},
                "metrics": self.metrics}


def make(release: str, arguments: Optional[List[Dict[str, Any]]] = None, cli_complete: bool = False,
         metrics: Optional[List[str]] = None, quantization_min_cc: Optional[Dict[str, int]] = None) -> Release:
    if release not in BEHAVIOURS:
        raise ValueError(f"the twin simulates {', '.join(BEHAVIOURS)}, not {release}")
    behaviour = BEHAVIOURS[release]
    if quantization_min_cc is not None:
        behaviour = replace(behaviour, quantization_min_cc=dict(quantization_min_cc))
    if behaviour.parser == "table" and not arguments:
        raise ValueError(f"{release}: its parser is built from the CLI table, and none was given")
    return Release(release=release, version=f"{release}+sim", commit=COMMITS[release], behaviour=behaviour,
                   arguments=list(arguments or []), cli_complete=cli_complete, metrics=list(metrics or []))


def from_json(data: Dict[str, Any]) -> Release:
    behaviour = dict(data["behaviour"])
    behaviour["paged_attention_head_sizes"] = tuple(behaviour["paged_attention_head_sizes"])
    return Release(release=data["release"], version=data["version"], commit=data["commit"],
                   behaviour=Behaviour(**behaviour), arguments=list(data["cli"]["arguments"]),
                   cli_complete=bool(data["cli"]["complete"]), metrics=list(data["metrics"]))


_current: Optional[Release] = None


def current() -> Release:
    """The release of this installation: release.json inside a built wheel, else 0.5.4 (a checkout)."""
    global _current
    if _current is None:
        if RELEASE_FILE.is_file():
            _current = from_json(json.loads(RELEASE_FILE.read_text(encoding="utf-8")))
        else:
            _current = make(CHECKOUT_RELEASE)
    return _current


def pick(v054: T, v085: T) -> T:
    """The 0.5.4 or the 0.8.5.post1 variant of a message, source location or value."""
    return v054 if current().legacy else v085
