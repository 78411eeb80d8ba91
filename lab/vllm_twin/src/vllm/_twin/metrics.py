"""`/metrics` as vLLM 0.5.4 exposes it: the text prometheus_client's generate_latest() writes.

Names, types, HELP texts, labels and buckets are 0.5.4's (v0.5.4 vllm/engine/metrics.py:31-183,
docs/facts/vllm-volta.md §4.1). Like prometheus_client, a labelled series appears only once
something set it: gauges and counters at the first stats log (every engine step, and every 10 s from the
API server), histograms at their first observation. `_created` series are disabled, as in 0.5.4.

0.5.4's bug is kept (§4.2): in the default frontend-multiprocessing mode the API process's registry
holds only the python_*/process_* collectors, so no vllm:* series is served; with
--disable-frontend-multiprocessing they are. --disable-log-stats removes them too.

0.8.5.post1 (families "0.8.5"): the V0 metrics of v0.8.5.post1:vllm/engine/metrics.py:49-297 that are not
hidden (the swapped/CPU-cache/prefix-hit-rate gauges and vllm:time_in_queue_requests need
--show-hidden-metrics-for-version), new TTFT/TPOT buckets, the request phase histograms, no best_of and no
avg_* throughput gauges, and vllm:cache_config_info with CacheConfig's fields (:698-708). In the default
mode the API process serves the engine's series through PROMETHEUS_MULTIPROC_DIR
(v0.8.5.post1:vllm/entrypoints/openai/api_server.py:309-324): a registry holding only the
MultiProcessCollector, so there are no python_*/process_* series, and a family appears only once it has
a series. NOT SIMULATED: the http_* series of prometheus-fastapi-instrumentator that 0.8.5.post1 also serves.
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
# v0.8.5.post1:vllm/engine/metrics.py:147-149, 154-157, 163-166, 171-173
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


class VllmMetrics:
    """The collectors of the release's Metrics class, in its registration order."""

    def __init__(self, model_name: str, max_model_len: int, families: str = "0.5.4"):
        self.labels = {"model_name": model_name}
        self.families_of = families
        self.cache_config_info: Dict[str, str] = {}
        if families == "0.8.5":
            self._init_085(max_model_len)
            return
        self.running = Gauge("vllm:num_requests_running", "Number of requests currently running on GPU.")
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.swapped = Gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.")
        self.gpu_cache = Gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.")
        self.cpu_cache = Gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.")
        self.preemptions = Counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = Counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")
        self.generation_tokens = Counter("vllm:generation_tokens_total", "Number of generation tokens processed.")
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.tpot = Histogram("vllm:time_per_output_token_seconds",
                              "Histogram of time per output token in seconds.", TPOT_BUCKETS)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of end to end request latency in seconds.", E2E_BUCKETS)
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.request_prompt_tokens = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                               token_buckets)
        self.request_generation_tokens = Histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.", token_buckets)
        self.best_of = Histogram("vllm:request_params_best_of", "Histogram of the best_of request parameter.",
                                 PARAM_BUCKETS)
        self.n = Histogram("vllm:request_params_n", "Histogram of the n request parameter.", PARAM_BUCKETS)
        self.success = Counter("vllm:request_success_total", "Count of successfully processed requests.")
        self.spec_acceptance = Gauge("vllm:spec_decode_draft_acceptance_rate", "Speulative token acceptance rate.")
        self.spec_efficiency = Gauge("vllm:spec_decode_efficiency", "Speculative decoding system efficiency.")
        self.spec_accepted = Counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.")
        self.spec_draft = Counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.")
        self.spec_emitted = Counter("vllm:spec_decode_num_emitted_tokens_total", "Number of emitted tokens.")
        self.avg_prompt = Gauge("vllm:avg_prompt_throughput_toks_per_s", "Average prefill throughput in tokens/s.")
        self.avg_generation = Gauge("vllm:avg_generation_throughput_toks_per_s",
                                    "Average generation throughput in tokens/s.")
        self.families: List[_Family] = [
            self.running, self.waiting, self.swapped, self.gpu_cache, self.cpu_cache, self.preemptions,
            self.prompt_tokens, self.generation_tokens, self.ttft, self.tpot, self.e2e, self.request_prompt_tokens,
            self.request_generation_tokens, self.best_of, self.n, self.success, self.spec_acceptance,
            self.spec_efficiency, self.spec_accepted, self.spec_draft, self.spec_emitted, self.avg_prompt,
            self.avg_generation]

    def _init_085(self, max_model_len: int) -> None:
        self.running = Gauge("vllm:num_requests_running", "Number of requests currently running on GPU.")
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.lora_info = Gauge("vllm:lora_requests_info", "Running stats on lora requests.")
        self.gpu_cache = Gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.")
        self.preemptions = Counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = Counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")
        self.generation_tokens = Counter("vllm:generation_tokens_total", "Number of generation tokens processed.")
        self.iteration_tokens = Histogram("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.",
                                          ITERATION_TOKENS_BUCKETS_085)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS_085)
        self.tpot = Histogram("vllm:time_per_output_token_seconds",
                              "Histogram of time per output token in seconds.", TPOT_BUCKETS_085)
        latency = REQUEST_LATENCY_BUCKETS_085
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of end to end request latency in seconds.", latency)
        self.queue_time = Histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.", latency)
        self.inference_time = Histogram("vllm:request_inference_time_seconds",
                                        "Histogram of time spent in RUNNING phase for request.", latency)
        self.prefill_time = Histogram("vllm:request_prefill_time_seconds",
                                      "Histogram of time spent in PREFILL phase for request.", latency)
        self.decode_time = Histogram("vllm:request_decode_time_seconds",
                                     "Histogram of time spent in DECODE phase for request.", latency)
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.request_prompt_tokens = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                               token_buckets)
        self.request_generation_tokens = Histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.", token_buckets)
        self.max_generation_tokens = Histogram("vllm:request_max_num_generation_tokens",
                                               "Histogram of maximum number of requested generation tokens.",
                                               token_buckets)
        self.n = Histogram("vllm:request_params_n", "Histogram of the n request parameter.", PARAM_BUCKETS)
        self.max_tokens = Histogram("vllm:request_params_max_tokens",
                                    "Histogram of the max_tokens request parameter.", token_buckets)
        self.success = Counter("vllm:request_success_total", "Count of successfully processed requests.")
        self.spec_acceptance = Gauge("vllm:spec_decode_draft_acceptance_rate", "Speulative token acceptance rate.")
        self.spec_efficiency = Gauge("vllm:spec_decode_efficiency", "Speculative decoding system efficiency.")
        self.spec_accepted = Counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.")
        self.spec_draft = Counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.")
        self.spec_emitted = Counter("vllm:spec_decode_num_emitted_tokens_total", "Number of emitted tokens.")
        self.families = [
            self.running, self.waiting, self.lora_info, self.gpu_cache, self.preemptions, self.prompt_tokens,
            self.generation_tokens, self.iteration_tokens, self.ttft, self.tpot, self.e2e, self.queue_time,
            self.inference_time, self.prefill_time, self.decode_time, self.request_prompt_tokens,
            self.request_generation_tokens, self.max_generation_tokens, self.n, self.max_tokens, self.success,
            self.spec_acceptance, self.spec_efficiency, self.spec_accepted, self.spec_draft, self.spec_emitted]

    def set_cache_config(self, info: Dict[str, object]) -> None:
        self.cache_config_info = {key: str(value) for key, value in info.items()}

    def log(self, stats: StepStats) -> None:
        """PrometheusStatLogger._log_prometheus for one stats record."""
        if self.families_of == "0.8.5":
            self._log_085(stats)
            return
        labels = self.labels
        self.running.set(labels, stats.num_running)
        self.swapped.set(labels, stats.num_swapped)
        self.waiting.set(labels, stats.num_waiting)
        self.gpu_cache.set(labels, stats.gpu_cache_usage)
        self.cpu_cache.set(labels, stats.cpu_cache_usage)
        self.preemptions.inc(labels, stats.num_preemptions)
        self.prompt_tokens.inc(labels, stats.num_prompt_tokens)
        self.generation_tokens.inc(labels, stats.num_generation_tokens)
        for value in stats.time_to_first_tokens:
            self.ttft.observe(labels, value)
        for value in stats.time_per_output_tokens:
            self.tpot.observe(labels, value)
        for value in stats.e2e_latencies:
            self.e2e.observe(labels, value)
        for value in stats.request_prompt_tokens:
            self.request_prompt_tokens.observe(labels, value)
        for value in stats.request_generation_tokens:
            self.request_generation_tokens.observe(labels, value)
        for value in stats.request_best_of:
            self.best_of.observe(labels, value)
        for value in stats.request_n:
            self.n.observe(labels, value)
        for reason in stats.finished_reasons:
            self.success.inc({**labels, "finished_reason": reason}, 1)

    def _log_085(self, stats: StepStats) -> None:
        """v0.8.5.post1:vllm/engine/metrics.py:579-659 (the non-hidden part)."""
        labels = self.labels
        self.running.set(labels, stats.num_running)
        self.waiting.set(labels, stats.num_waiting)
        self.gpu_cache.set(labels, stats.gpu_cache_usage)
        # _log_gauge_string: set_to_current_time on the LoRA labels (no LoRA: empty lists, max_lora "0")
        self.lora_info.set({"running_lora_adapters": "", "max_lora": "0", "waiting_lora_adapters": ""}, time.time())
        self.preemptions.inc(labels, stats.num_preemptions)
        self.prompt_tokens.inc(labels, stats.num_prompt_tokens)
        self.generation_tokens.inc(labels, stats.num_generation_tokens)
        self.iteration_tokens.observe(labels, stats.num_prompt_tokens + stats.num_generation_tokens)
        observed = [(self.ttft, stats.time_to_first_tokens), (self.tpot, stats.time_per_output_tokens),
                    (self.e2e, stats.e2e_latencies), (self.queue_time, stats.queue_times),
                    (self.inference_time, stats.inference_times), (self.prefill_time, stats.prefill_times),
                    (self.decode_time, stats.decode_times)]
        for histogram, values in observed:
            for value in values:
                histogram.observe(labels, value)
        for reason in stats.finished_reasons:
            self.success.inc({**labels, "finished_reason": reason}, 1)
        requests = [(self.request_prompt_tokens, stats.request_prompt_tokens),
                    (self.request_generation_tokens, stats.request_generation_tokens),
                    (self.n, stats.request_n), (self.max_generation_tokens, stats.request_max_generation_tokens),
                    (self.max_tokens, stats.request_max_tokens)]
        for histogram, values in requests:
            for value in values:
                histogram.observe(labels, value)

    def log_throughput(self, prompt_tps: float, generation_tps: float) -> None:
        if self.families_of == "0.8.5":
            return  # the avg_* gauges are gone in 0.8.5.post1
        self.avg_prompt.set(self.labels, prompt_tps)
        self.avg_generation.set(self.labels, generation_tps)

    def render(self, multiprocess: bool = False) -> List[str]:
        """The vllm:* families; `multiprocess` drops those without a series (MultiProcessCollector)."""
        lines: List[str] = []
        if self.families_of == "0.8.5":
            if self.cache_config_info:
                lines += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                          "# TYPE vllm:cache_config_info gauge",
                          f"vllm:cache_config_info{_labels(self.cache_config_info)} 1.0"]
        else:
            lines = ["# HELP vllm:cache_config_info information of cache_config",
                     "# TYPE vllm:cache_config_info gauge"]
            if self.cache_config_info:
                lines.append(f"vllm:cache_config_info{_labels(self.cache_config_info)} 1.0")
        for family in self.families:
            rendered = family.render()
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

