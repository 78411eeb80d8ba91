"""`/metrics` as the simulated release exposes it: the text prometheus_client's generate_latest() writes.

Which families are served is the release's `metrics:` list of data/vllm-releases.yml (release.json `data`),
in its order; the twin knows every V0 family of the releases it simulates (FAMILIES: type and HELP as the
release source has them) and which of them each release's vllm/engine/metrics.py shows by default (ERAS); a
wheel whose data names a family the twin does not know for that release is not built
(build_wheelhouse.check_metrics). Buckets follow the release (bucket_bounds):
* "0.5.4": v0.5.4 vllm/engine/metrics.py:31-183 (docs/facts/vllm-volta.md §4.1);
* "0.6" and "0.7": v0.6.6.post1:vllm/engine/metrics.py:54-275 and v0.7.3:vllm/engine/metrics.py:56-262 (the
  0.5.4 TTFT/TPOT buckets, request latencies from 0.3 s to 60 s, the iteration-token histogram over the
  CUDA-graph capture sizes, or 1..8096 in eager mode; 0.7.3 drops the avg_* gauges);
* "0.8": v0.8.5.post1:vllm/engine/metrics.py:49-297 and v0.9.2:vllm/engine/metrics.py:49-226 (longer TTFT,
  TPOT and latency buckets, iteration tokens 1..16384; the swapped/CPU-cache/prefix-hit-rate gauges,
  vllm:time_in_queue_requests and the model_*_time histograms hidden in 0.8.5.post1, removed in 0.9.2).
Like prometheus_client, a labelled series appears only once something set it: gauges and counters at the
first stats log (every engine step, and every 10 s from the API server), histograms at their first
observation. `_created` series are disabled.

0.5.4's bug is kept (§4.2): in the default frontend-multiprocessing mode the API process's registry holds only
the python_*/process_* collectors, so no vllm:* series is served; with --disable-frontend-multiprocessing they
are. --disable-log-stats removes them too. From 0.6 on the API process serves the engine's series through
PROMETHEUS_MULTIPROC_DIR in the default mode (v0.8.5.post1:vllm/entrypoints/openai/api_server.py:309-324,
v0.6.6.post1 :254-262): a registry holding only the MultiProcessCollector, so there are no python_*/process_*
series, and a family appears only once it has a series. NOT SIMULATED: prefix caching (the hit-rate gauges
read -1, the naive block allocator's value, v0.7.3:vllm/core/block/naive_block.py:332-333), speculative
decoding and detailed traces (their families never get a series), and the http_* series of
prometheus-fastapi-instrumentator.
"""
from __future__ import annotations

import gc
import math
import os
import platform
import resource
import time
from typing import Dict, List, Optional, Sequence, Tuple

from vllm._twin.engine import StepStats

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
E2E_BUCKETS = [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
# v0.6.6.post1:vllm/engine/metrics.py:121, 148-151 (v0.7.3 :123, 151-154)
ITERATION_TOKENS_BUCKETS_06 = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8096]
REQUEST_LATENCY_BUCKETS_06 = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
# v0.8.5.post1:vllm/engine/metrics.py:147-149, 154-157, 163-166, 171-173 (v0.9.2 :108-110, 115-119, 124-128, 131-134)
ITERATION_TOKENS_BUCKETS_085 = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
TTFT_BUCKETS_085 = TTFT_BUCKETS + [20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS_085 = TPOT_BUCKETS + [5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS_085 = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
PARAM_BUCKETS = [1, 2, 5, 10, 20]
LOCAL_LOG_INTERVAL_SECONDS = 5.0  # _LOCAL_LOGGING_INTERVAL_SEC


def build_1_2_5_buckets(max_value: int) -> List[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (metrics.py:276)."""
    buckets: List[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


def build_1_2_3_5_8_buckets(max_value: int) -> List[int]:
    """1, 2, 3, 5, 8, 10, 20, 30, ... up to max_value (v0.7.3:vllm/engine/metrics.py:369-403)."""
    buckets: List[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 3, 5, 8):
            value = mantissa * 10 ** exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


def go_float(value: float) -> str:
    """prometheus_client's floatToGoString."""
    value = float(value)
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(labels: Dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items())) + "}"


class _Family:
    def __init__(self, name: str, kind: str, documentation: str):
        self.name, self.kind, self.documentation = name, kind, documentation

    def header(self) -> List[str]:
        return [f"# HELP {self.name} {_escape(self.documentation)}", f"# TYPE {self.name} {self.kind}"]


class Gauge(_Family):
    def __init__(self, name: str, documentation: str):
        super().__init__(name, "gauge", documentation)
        self.values: Dict[Tuple[Tuple[str, str], ...], float] = {}

    def set(self, labels: Dict[str, str], value: float) -> None:
        self.values[tuple(sorted(labels.items()))] = float(value)

    def render(self) -> List[str]:
        return self.header() + [f"{self.name}{_labels(dict(k))} {go_float(v)}" for k, v in self.values.items()]


class Counter(Gauge):
    def __init__(self, name: str, documentation: str):
        super().__init__(name, documentation)
        self.kind = "counter"

    def inc(self, labels: Dict[str, str], amount: float = 1.0) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + float(amount)


class Histogram(_Family):
    def __init__(self, name: str, documentation: str, buckets: Sequence[float]):
        super().__init__(name, "histogram", documentation)
        self.bounds = [float(b) for b in buckets] + [math.inf]
        self.series: Dict[Tuple[Tuple[str, str], ...], List[float]] = {}

    def observe(self, labels: Dict[str, str], value: float) -> None:
        key = tuple(sorted(labels.items()))
        state = self.series.get(key)
        if state is None:
            state = self.series[key] = [0.0] * (len(self.bounds) + 1)  # per-bucket counts, then the sum
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                state[i] += 1
                break
        state[-1] += value

    def render(self) -> List[str]:
        lines = self.header()
        for key, state in self.series.items():
            labels = dict(key)
            cumulative = 0.0
            for i, bound in enumerate(self.bounds):
                cumulative += state[i]
                lines.append(f"{self.name}_bucket{_labels({**labels, 'le': go_float(bound)})} {go_float(cumulative)}")
            lines.append(f"{self.name}_count{_labels(labels)} {go_float(cumulative)}")
            lines.append(f"{self.name}_sum{_labels(labels)} {go_float(state[-1])}")
        return lines


# Every V0 family the twin simulates: type and HELP (v0.5.4 and v0.6.6.post1-v0.9.2 vllm/engine/metrics.py).
FAMILIES: Dict[str, Tuple[str, str]] = {
    "vllm:cache_config_info": ("info", "Information of the LLMEngine CacheConfig"),
    "vllm:num_requests_running": ("gauge", "Number of requests currently running on GPU."),
    "vllm:num_requests_waiting": ("gauge", "Number of requests waiting to be processed."),
    "vllm:lora_requests_info": ("gauge", "Running stats on lora requests."),
    "vllm:num_requests_swapped": ("gauge", "Number of requests swapped to CPU."),
    "vllm:gpu_cache_usage_perc": ("gauge", "GPU KV-cache usage. 1 means 100 percent usage."),
    "vllm:cpu_cache_usage_perc": ("gauge", "CPU KV-cache usage. 1 means 100 percent usage."),
    "vllm:cpu_prefix_cache_hit_rate": ("gauge", "CPU prefix cache block hit rate."),
    "vllm:gpu_prefix_cache_hit_rate": ("gauge", "GPU prefix cache block hit rate."),
    "vllm:num_preemptions_total": ("counter", "Cumulative number of preemption from the engine."),
    "vllm:prompt_tokens_total": ("counter", "Number of prefill tokens processed."),
    "vllm:generation_tokens_total": ("counter", "Number of generation tokens processed."),
    "vllm:tokens_total": ("counter", "Number of prefill plus generation tokens processed."),
    "vllm:iteration_tokens_total": ("histogram", "Histogram of number of tokens per engine_step."),
    "vllm:time_to_first_token_seconds": ("histogram", "Histogram of time to first token in seconds."),
    "vllm:time_per_output_token_seconds": ("histogram", "Histogram of time per output token in seconds."),
    "vllm:e2e_request_latency_seconds": ("histogram", "Histogram of end to end request latency in seconds."),
    "vllm:request_queue_time_seconds": ("histogram", "Histogram of time spent in WAITING phase for request."),
    "vllm:request_inference_time_seconds": ("histogram", "Histogram of time spent in RUNNING phase for request."),
    "vllm:request_prefill_time_seconds": ("histogram", "Histogram of time spent in PREFILL phase for request."),
    "vllm:request_decode_time_seconds": ("histogram", "Histogram of time spent in DECODE phase for request."),
    "vllm:time_in_queue_requests": ("histogram", "Histogram of time the request spent in the queue in seconds."),
    "vllm:model_forward_time_milliseconds": ("histogram", "Histogram of time spent in the model forward pass in "
                                             "ms."),
    "vllm:model_execute_time_milliseconds": ("histogram", "Histogram of time spent in the model execute function "
                                             "in ms."),
    "vllm:request_prompt_tokens": ("histogram", "Number of prefill tokens processed."),
    "vllm:request_generation_tokens": ("histogram", "Number of generation tokens processed."),
    "vllm:request_max_num_generation_tokens": ("histogram", "Histogram of maximum number of requested generation "
                                               "tokens."),
    "vllm:request_params_best_of": ("histogram", "Histogram of the best_of request parameter."),
    "vllm:request_params_n": ("histogram", "Histogram of the n request parameter."),
    "vllm:request_params_max_tokens": ("histogram", "Histogram of the max_tokens request parameter."),
    "vllm:request_success_total": ("counter", "Count of successfully processed requests."),
    "vllm:spec_decode_draft_acceptance_rate": ("gauge", "Speulative token acceptance rate."),
    "vllm:spec_decode_efficiency": ("gauge", "Speculative decoding system efficiency."),
    "vllm:spec_decode_num_accepted_tokens_total": ("counter", "Number of accepted tokens."),
    "vllm:spec_decode_num_draft_tokens_total": ("counter", "Number of draft tokens."),
    "vllm:spec_decode_num_emitted_tokens_total": ("counter", "Number of emitted tokens."),
    "vllm:avg_prompt_throughput_toks_per_s": ("gauge", "Average prefill throughput in tokens/s."),
    "vllm:avg_generation_throughput_toks_per_s": ("gauge", "Average generation throughput in tokens/s."),
}
_SPEC = ("vllm:spec_decode_draft_acceptance_rate", "vllm:spec_decode_efficiency",
         "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total",
         "vllm:spec_decode_num_emitted_tokens_total")
_AVG = ("vllm:avg_prompt_throughput_toks_per_s", "vllm:avg_generation_throughput_toks_per_s")
_CORE = ("vllm:cache_config_info", "vllm:num_requests_running", "vllm:num_requests_waiting",
         "vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total", "vllm:prompt_tokens_total",
         "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds",
         "vllm:e2e_request_latency_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
         "vllm:request_params_n", "vllm:request_success_total")
_V06 = ("vllm:lora_requests_info", "vllm:iteration_tokens_total", "vllm:request_queue_time_seconds",
        "vllm:request_inference_time_seconds", "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds", "vllm:request_max_num_generation_tokens", "vllm:request_params_max_tokens")
_SWAP = ("vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc")
_V06_ONLY = ("vllm:cpu_prefix_cache_hit_rate", "vllm:gpu_prefix_cache_hit_rate", "vllm:tokens_total",
             "vllm:time_in_queue_requests", "vllm:model_forward_time_milliseconds",
             "vllm:model_execute_time_milliseconds")
# The families each release's vllm/engine/metrics.py shows by default (Metrics.__init__ at the tag; 0.8.5.post1
# hides the 0.6-only ones and the swap gauges behind --show-hidden-metrics-for-version, 0.9.2 removed them).
ERAS: Dict[str, Tuple[str, ...]] = {
    "0.5.4": _CORE + _SWAP + ("vllm:request_params_best_of",) + _SPEC + _AVG,
    "0.6": _CORE + _V06 + _SWAP + _V06_ONLY + _SPEC + _AVG,   # v0.6.6.post1:vllm/engine/metrics.py:54-275
    "0.7": _CORE + _V06 + _SWAP + _V06_ONLY + _SPEC,          # v0.7.3:vllm/engine/metrics.py:56-262
    "0.8": _CORE + _V06 + _SPEC,                              # v0.8.5.post1 :49-297, v0.9.2 :49-226
}


def unknown_families(names: Sequence[str], era: str) -> List[str]:
    """The names of a release's `metrics:` list the twin cannot serve for that release."""
    return [name for name in names if name not in ERAS[era]]


def bucket_bounds(name: str, era: str, max_model_len: int, graph_sizes: Sequence[int]) -> List[float]:
    """A histogram's buckets in the release's metrics.py."""
    late = era == "0.8"
    if name == "vllm:time_to_first_token_seconds":
        return TTFT_BUCKETS_085 if late else TTFT_BUCKETS
    if name == "vllm:time_per_output_token_seconds":
        return TPOT_BUCKETS_085 if late else TPOT_BUCKETS
    if name == "vllm:iteration_tokens_total":
        if late:
            return ITERATION_TOKENS_BUCKETS_085
        # the CUDA-graph capture sizes unless eager (v0.7.3:vllm/engine/metrics.py:123-127)
        return sorted(graph_sizes) if graph_sizes else ITERATION_TOKENS_BUCKETS_06
    if name in ("vllm:request_params_n", "vllm:request_params_best_of"):
        return PARAM_BUCKETS
    if name in ("vllm:model_forward_time_milliseconds", "vllm:model_execute_time_milliseconds"):
        return build_1_2_3_5_8_buckets(3000)
    if name.endswith("_tokens") or name == "vllm:request_params_max_tokens":
        return build_1_2_5_buckets(max_model_len)
    if era == "0.5.4":
        return E2E_BUCKETS
    return REQUEST_LATENCY_BUCKETS_085 if late else REQUEST_LATENCY_BUCKETS_06


class VllmMetrics:
    """The collectors of the release's Metrics class that its data lists, in the data's order."""

    def __init__(self, model_name: str, max_model_len: int, names: Sequence[str], era: str = "0.5.4",
                 graph_sizes: Sequence[int] = (), duration_factor: float = 1.0):
        """`duration_factor` multiplies every observed duration (Settings.metrics_duration_factor: 1, as vLLM,
        or 1 / time scale for the lab's modelled clock)."""
        unknown = unknown_families(names, era)
        if unknown:
            raise ValueError(f"the twin does not simulate {', '.join(unknown)} (families of {era})")
        self.labels = {"model_name": model_name}
        self.duration_factor = duration_factor
        self.era = era
        self.names = list(names)
        self.cache_config_info: Dict[str, str] = {}
        self.families: Dict[str, _Family] = {}
        for name in self.names:
            kind, documentation = FAMILIES[name]
            if kind == "gauge":
                self.families[name] = Gauge(name, documentation)
            elif kind == "counter":
                self.families[name] = Counter(name, documentation)
            elif kind == "histogram":
                self.families[name] = Histogram(name, documentation,
                                                bucket_bounds(name, era, max_model_len, graph_sizes))

    def set_cache_config(self, info: Dict[str, object]) -> None:
        self.cache_config_info = {key: str(value) for key, value in info.items()}

    def _gauge(self, name: str, labels: Dict[str, str], value: float) -> None:
        family = self.families.get(name)
        if family is not None:
            family.set(labels, value)  # type: ignore[attr-defined]

    def _count(self, name: str, labels: Dict[str, str], value: float) -> None:
        family = self.families.get(name)
        if family is not None:
            family.inc(labels, value)  # type: ignore[attr-defined]

    def _observe(self, name: str, values: Sequence[float]) -> None:
        family = self.families.get(name)
        if family is not None:
            for value in values:
                family.observe(self.labels, value)  # type: ignore[attr-defined]

    def log(self, stats: StepStats) -> None:
        """PrometheusStatLogger._log_prometheus for one stats record (v0.5.4 metrics.py:480-523,
        v0.7.3 :548-623, v0.8.5.post1 :579-659)."""
        labels = self.labels
        gauges = [("vllm:num_requests_running", stats.num_running), ("vllm:num_requests_swapped", stats.num_swapped),
                  ("vllm:num_requests_waiting", stats.num_waiting),
                  ("vllm:gpu_cache_usage_perc", stats.gpu_cache_usage),
                  ("vllm:cpu_cache_usage_perc", stats.cpu_cache_usage),
                  ("vllm:cpu_prefix_cache_hit_rate", -1.0), ("vllm:gpu_prefix_cache_hit_rate", -1.0)]
        for name, value in gauges:
            self._gauge(name, labels, value)
        # _log_gauge_string: set_to_current_time on the LoRA labels (no LoRA: empty lists, max_lora "0")
        self._gauge("vllm:lora_requests_info", {"running_lora_adapters": "", "max_lora": "0",
                                                "waiting_lora_adapters": ""}, time.time())
        step_tokens = stats.num_prompt_tokens + stats.num_generation_tokens
        for name, value in (("vllm:num_preemptions_total", stats.num_preemptions),
                            ("vllm:prompt_tokens_total", stats.num_prompt_tokens),
                            ("vllm:generation_tokens_total", stats.num_generation_tokens),
                            ("vllm:tokens_total", step_tokens)):
            self._count(name, labels, value)
        durations = [("vllm:time_to_first_token_seconds", stats.time_to_first_tokens),
                     ("vllm:time_per_output_token_seconds", stats.time_per_output_tokens),
                     ("vllm:e2e_request_latency_seconds", stats.e2e_latencies),
                     ("vllm:request_queue_time_seconds", stats.queue_times),
                     ("vllm:request_inference_time_seconds", stats.inference_times),
                     ("vllm:request_prefill_time_seconds", stats.prefill_times),
                     ("vllm:request_decode_time_seconds", stats.decode_times),
                     ("vllm:time_in_queue_requests", stats.queue_times)]
        self._observe("vllm:iteration_tokens_total", [step_tokens])
        for name, values in durations:
            self._observe(name, [value * self.duration_factor for value in values]
                          if self.duration_factor != 1.0 else values)
        for reason in stats.finished_reasons:
            self._count("vllm:request_success_total", {**labels, "finished_reason": reason}, 1)
        requests = [("vllm:request_prompt_tokens", stats.request_prompt_tokens),
                    ("vllm:request_generation_tokens", stats.request_generation_tokens),
                    ("vllm:request_params_best_of", stats.request_best_of),
                    ("vllm:request_params_n", stats.request_n),
                    ("vllm:request_max_num_generation_tokens", stats.request_max_generation_tokens),
                    ("vllm:request_params_max_tokens", stats.request_max_tokens)]
        for name, values in requests:
            self._observe(name, values)

    def log_throughput(self, prompt_tps: float, generation_tps: float) -> None:
        """The avg_* gauges, where the release has them (set at the 5-second log, v0.6.6.post1 metrics.py:637-649)."""
        self._gauge("vllm:avg_prompt_throughput_toks_per_s", self.labels, prompt_tps)
        self._gauge("vllm:avg_generation_throughput_toks_per_s", self.labels, generation_tps)

    def render(self, multiprocess: bool = False) -> List[str]:
        """The vllm:* families; `multiprocess` drops those without a series (MultiProcessCollector)."""
        lines: List[str] = []
        for name in self.names:
            if name == "vllm:cache_config_info":
                # 0.5.4's Info (docs/facts/vllm-volta.md §4.1) vs the gauge of 0.6 on (v0.7.3 metrics.py:663-673)
                help_text = "information of cache_config" if self.era == "0.5.4" else FAMILIES[name][1]
                if multiprocess and not self.cache_config_info:
                    continue
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
                if self.cache_config_info:
                    lines.append(f"{name}{_labels(self.cache_config_info)} 1.0")
                continue
            rendered = self.families[name].render()
            if multiprocess and len(rendered) == 2:
                continue
            lines.extend(rendered)
        return lines


def process_collectors(start_time: float) -> List[str]:
    """The default registry of prometheus_client: GC, platform and process collectors."""
    lines: List[str] = []
    stats = gc.get_stats()
    lines += ["# HELP python_gc_objects_collected_total Objects collected during gc",
              "# TYPE python_gc_objects_collected_total counter"]
    lines += [f'python_gc_objects_collected_total{{generation="{i}"}} {go_float(s["collected"])}'
              for i, s in enumerate(stats)]
    lines += ["# HELP python_gc_objects_uncollectable_total Uncollectable objects found during GC",
              "# TYPE python_gc_objects_uncollectable_total counter"]
    lines += [f'python_gc_objects_uncollectable_total{{generation="{i}"}} {go_float(s["uncollectable"])}'
              for i, s in enumerate(stats)]
    lines += ["# HELP python_gc_collections_total Number of times this generation was collected",
              "# TYPE python_gc_collections_total counter"]
    lines += [f'python_gc_collections_total{{generation="{i}"}} {go_float(s["collections"])}'
              for i, s in enumerate(stats)]
    major, minor, patch = platform.python_version_tuple()
    lines += ["# HELP python_info Python platform information", "# TYPE python_info gauge",
              f'python_info{{implementation="{platform.python_implementation()}",major="{major}",minor="{minor}",'
              f'patchlevel="{patch}",version="{platform.python_version()}"}} 1.0']
    vsize, rss = _proc_memory()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_fds = 0
    max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    lines += ["# HELP process_virtual_memory_bytes Virtual memory size in bytes.",
              "# TYPE process_virtual_memory_bytes gauge", f"process_virtual_memory_bytes {go_float(vsize)}",
              "# HELP process_resident_memory_bytes Resident memory size in bytes.",
              "# TYPE process_resident_memory_bytes gauge", f"process_resident_memory_bytes {go_float(rss)}",
              "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
              "# TYPE process_start_time_seconds gauge", f"process_start_time_seconds {go_float(round(start_time, 2))}",
              "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.",
              "# TYPE process_cpu_seconds_total counter",
              f"process_cpu_seconds_total {go_float(usage.ru_utime + usage.ru_stime)}",
              "# HELP process_open_fds Number of open file descriptors.", "# TYPE process_open_fds gauge",
              f"process_open_fds {go_float(open_fds)}",
              "# HELP process_max_fds Maximum number of open file descriptors.", "# TYPE process_max_fds gauge",
              f"process_max_fds {go_float(max_fds)}"]
    return lines


def _proc_memory() -> Tuple[float, float]:
    try:
        with open("/proc/self/stat", "rb") as handle:
            fields = handle.read().split(b")")[-1].split()
        page = os.sysconf("SC_PAGE_SIZE")
        return float(fields[20]), float(int(fields[21]) * page)
    except (OSError, IndexError, ValueError):
        return 0.0, 0.0


def render(start_time: float, vllm_metrics: Optional[VllmMetrics], multiprocess: bool = False) -> bytes:
    """generate_latest() of the API process's registry: the default registry's collectors and the vllm:*
    families, or (0.8.5.post1's default mode) only the families the engine process wrote."""
    lines = [] if multiprocess else process_collectors(start_time)
    if vllm_metrics is not None:
        lines.extend(vllm_metrics.render(multiprocess))
    return ("\n".join(lines) + "\n").encode() if lines else b""


class ThroughputLog:
    """LoggingStatLogger: the 5-second stdout line and the avg_* gauges (metrics.py:406-418)."""

    def __init__(self, now: float):
        self.last = now
        self.prompt_tokens = 0
        self.generation_tokens = 0

    def add(self, stats: StepStats) -> None:
        self.prompt_tokens += stats.num_prompt_tokens
        self.generation_tokens += stats.num_generation_tokens

    def due(self, now: float) -> bool:
        return now - self.last > LOCAL_LOG_INTERVAL_SECONDS

    def take(self, now: float) -> Tuple[float, float]:
        elapsed = max(now - self.last, 1e-9)
        rates = (self.prompt_tokens / elapsed, self.generation_tokens / elapsed)
        self.last, self.prompt_tokens, self.generation_tokens = now, 0, 0
        return rates

