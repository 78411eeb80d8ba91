"""The vLLM metric name of each monitoring signal, per release: data/monitoring-signals.yml checked against the
release data's `metrics:` lists (data/vllm-releases.yml).

A release resolves through the one era whose `versions` range holds it; every signal the era names must be a
family of that release's `metrics:` list, so a rename in either file is refused here (and fails
tests/unit/test_metric_names.py and `monitoring/render.py --check`) instead of leaving a rule that matches nothing.
The TTFT SLO is derived here, not typed (ttft_bound, common_edge_at_or_above): the time to first token a full-length
answer can take and still meet the E2E target at the production level's per-stream speed, rounded up to the first
TTFT bucket edge every era has. Controller-side only: monitoring/render.py, monitoring/dashboard.py and the tests
read it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible.module_utils.revive_releases import parse_version, version_matches

SCHEMA_VERSION = 1
KINDS = ("gauge", "counter", "histogram")


class MetricNamesError(ValueError):
    """The signal data is malformed, covers no era for a release, or names a family the release lacks."""


@dataclass(frozen=True)
class Signal:
    name: str
    kind: str
    record: str
    help: str


@dataclass(frozen=True)
class Era:
    name: str
    versions: str
    source: str
    e2e_buckets: Tuple[float, ...]
    ttft_buckets: Tuple[float, ...]
    names: Dict[str, Optional[str]]


@dataclass(frozen=True)
class TtftSlo:
    """The TTFT SLI: its inputs (the field calibration's production level, as data/monitoring-signals.yml states
    them) and what load_signal_map derives from them."""
    source: str
    output_tokens: int
    production_concurrency: int
    production_throughput_tok_s: float
    stream_tok_s: float          # production throughput / production concurrency
    bound_seconds: float         # e2e_p95_seconds - output_tokens / stream_tok_s
    bucket_le: float             # the first TTFT edge of every era at or above bound_seconds


@dataclass(frozen=True)
class Slo:
    e2e_p95_seconds: float
    objective: float
    e2e_bucket_le: float
    ttft: TtftSlo


@dataclass(frozen=True)
class SignalMap:
    slo: Slo
    signals: Dict[str, Signal]
    eras: Tuple[Era, ...]

    def era_for(self, version: str) -> Era:
        """The era whose range holds `version` (a local label like `+sim` is ignored); exactly one must."""
        matches = [era for era in self.eras if version_matches(version, era.versions)]
        if not matches:
            raise MetricNamesError(
                f"vLLM {version} is in no metric era of data/monitoring-signals.yml (eras: "
                f"{', '.join(f'{e.name} {e.versions}' for e in self.eras)}); add an era with its metric names and "
                "sources before monitoring it")
        if len(matches) > 1:
            raise MetricNamesError(f"vLLM {version} is in several metric eras: {', '.join(e.name for e in matches)}")
        return matches[0]


def ttft_bound(e2e_p95_seconds: float, output_tokens: float, throughput_tok_s: float, concurrency: float) -> float:
    """The longest time to first token a full-length answer can take and still finish within the E2E target when it
    then streams at the production level's per-stream speed (total throughput / concurrency):
    e2e_p95 - output_tokens / (throughput / concurrency). Refused when the inputs are not positive or the answer
    alone takes the whole target (no TTFT can meet it)."""
    for name, value in (("e2e_p95_seconds", e2e_p95_seconds), ("output_tokens", output_tokens),
                        ("throughput_tok_s", throughput_tok_s), ("concurrency", concurrency)):
        if not value > 0:
            raise MetricNamesError(f"TTFT bound: {name} must be > 0, got {value!r}")
    stream = throughput_tok_s / concurrency
    bound = e2e_p95_seconds - output_tokens / stream
    if bound <= 0:
        raise MetricNamesError(
            f"TTFT bound: {output_tokens:g} tokens at {stream:.4g} tok/s per stream ({throughput_tok_s:g} tok/s / "
            f"{concurrency:g} streams) take {output_tokens / stream:.4g} s, not less than the E2E target "
            f"{e2e_p95_seconds:g} s: the bound {bound:.4g} s leaves no time for the first token")
    return bound


def common_edge_at_or_above(bound: float, buckets: Mapping[str, Sequence[float]]) -> float:
    """The smallest bucket edge >= `bound` that every histogram of `buckets` (era name -> finite edges) has."""
    if not buckets:
        raise MetricNamesError("no era's buckets to choose an SLI edge from")
    common = set.intersection(*(set(float(e) for e in edges) for edges in buckets.values()))
    above = sorted(e for e in common if e >= bound)
    if not above:
        raise MetricNamesError(
            f"no bucket edge at or above {bound:.4g} s is common to every era ("
            + "; ".join(f"{era}: top {max(edges) if edges else 'none'}" for era, edges in buckets.items())
            + "); the SLI needs an edge every era has")
    return above[0]


def _require(data: Mapping[str, Any], key: str, kind: Any, where: str) -> Any:
    if key not in data:
        raise MetricNamesError(f"{where}: missing key {key!r}")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise MetricNamesError(f"{where}.{key}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def load_signal_map(data: Any, source: str = "data/monitoring-signals.yml") -> SignalMap:
    """Validate the parsed signal file; errors name `source` and the key path."""
    try:
        if not isinstance(data, dict):
            raise MetricNamesError("expected a mapping at the top level")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise MetricNamesError(f"schema_version: expected {SCHEMA_VERSION}, got {data.get('schema_version')!r}")
        raw_slo = _require(data, "slo", dict, "top level")
        e2e_p95 = float(_require(raw_slo, "e2e_p95_seconds", (int, float), "slo"))
        objective = float(_require(raw_slo, "objective", float, "slo"))
        e2e_le = float(_require(raw_slo, "e2e_bucket_le", (int, float), "slo"))
        if not 0 < objective < 1:
            raise MetricNamesError(f"slo.objective: {objective} is not between 0 and 1")
        raw_ttft = _require(raw_slo, "ttft", dict, "slo")
        ttft_inputs = (str(_require(raw_ttft, "source", str, "slo.ttft")),
                       int(_require(raw_ttft, "output_tokens", int, "slo.ttft")),
                       int(_require(raw_ttft, "production_concurrency", int, "slo.ttft")),
                       float(_require(raw_ttft, "production_throughput_tok_s", (int, float), "slo.ttft")))
        signals: Dict[str, Signal] = {}
        for name, entry in _require(data, "signals", dict, "top level").items():
            where = f"signals.{name}"
            if not isinstance(entry, dict):
                raise MetricNamesError(f"{where}: expected a mapping")
            kind = _require(entry, "kind", str, where)
            if kind not in KINDS:
                raise MetricNamesError(f"{where}.kind: {kind!r} is not one of {', '.join(KINDS)}")
            record = _require(entry, "record", str, where)
            if not record.startswith("revive:"):
                raise MetricNamesError(f"{where}.record: {record!r} must start with 'revive:'")
            signals[name] = Signal(name, kind, record, str(_require(entry, "help", str, where)))
        eras: List[Era] = []
        for n, entry in enumerate(_require(data, "eras", list, "top level")):
            where = f"eras[{n}]"
            if not isinstance(entry, dict):
                raise MetricNamesError(f"{where}: expected a mapping")
            versions = _require(entry, "versions", str, where)
            version_matches("0.0.0", versions)  # the range parses
            names = _require(entry, "names", dict, where)
            if set(names) != set(signals):
                missing, extra = sorted(set(signals) - set(names)), sorted(set(names) - set(signals))
                raise MetricNamesError(f"{where}.names: every signal needs a name or null (missing: {missing}, "
                                       f"unknown: {extra})")
            for signal, metric in names.items():
                if metric is not None and not re.fullmatch(r"vllm:[a-z0-9_]+", str(metric)):
                    raise MetricNamesError(f"{where}.names.{signal}: {metric!r} is not a vllm:* family name")
            buckets = tuple(float(b) for b in _require(entry, "e2e_buckets", list, where))
            if list(buckets) != sorted(set(buckets)):
                raise MetricNamesError(f"{where}.e2e_buckets: edges must be increasing")
            if names["e2e_latency"] is not None and e2e_le not in buckets:
                raise MetricNamesError(
                    f"{where}.e2e_buckets: the SLO edge le={e2e_le} is not an E2E bucket of era "
                    f"{entry.get('name')!r}; the SLI needs an edge every era has")
            ttft_buckets = tuple(float(b) for b in _require(entry, "ttft_buckets", list, where))
            if list(ttft_buckets) != sorted(set(ttft_buckets)):
                raise MetricNamesError(f"{where}.ttft_buckets: edges must be increasing")
            eras.append(Era(str(_require(entry, "name", str, where)), versions, str(_require(entry, "source", str,
                                                                                              where)),
                            buckets, ttft_buckets, {k: (None if v is None else str(v)) for k, v in names.items()}))
        source_note, tokens, concurrency, throughput = ttft_inputs
        try:
            bound = ttft_bound(e2e_p95, tokens, throughput, concurrency)
            edge = common_edge_at_or_above(bound, {e.name: e.ttft_buckets for e in eras if e.names["ttft"]})
        except MetricNamesError as exc:
            raise MetricNamesError(f"slo.ttft: {exc}") from None
        ttft = TtftSlo(source_note, tokens, concurrency, throughput, throughput / concurrency, bound, edge)
        slo = Slo(e2e_p95, objective, e2e_le, ttft)
        return SignalMap(slo=slo, signals=signals, eras=tuple(eras))
    except MetricNamesError as exc:
        raise MetricNamesError(f"{source}: {exc}") from None


def load_signal_file(path: str) -> SignalMap:
    import yaml  # controller-side only

    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as exc:
        raise MetricNamesError(f"{path}: cannot read the signal data ({exc.strerror})") from exc
    return load_signal_map(data, source=path)


def resolve(signal_map: SignalMap, version: str, metrics: Sequence[str]) -> Dict[str, Optional[str]]:
    """Signal -> the family `version` exposes for it (None where its era has none). `metrics` is the release's
    `metrics:` list; a name the era claims that the list lacks is refused."""
    era = signal_map.era_for(version)
    missing = {signal: name for signal, name in era.names.items() if name is not None and name not in metrics}
    if missing:
        raise MetricNamesError(
            f"vLLM {version} (metric era {era.name}): the release data's metrics list lacks "
            + ", ".join(f"{name} ({signal})" for signal, name in sorted(missing.items()))
            + "; fix the era's names in data/monitoring-signals.yml or the release's metrics in "
              "data/vllm-releases.yml, then re-render the rules (monitoring/render.py)")
    return dict(era.names)


def resolve_releases(signal_map: SignalMap, releases: Mapping[str, Sequence[str]]) -> Dict[str, Dict[str, Optional[str]]]:
    """Every release (version -> its metrics list) resolved, in version order; the first refusal raises."""
    return {version: resolve(signal_map, version, releases[version])
            for version in sorted(releases, key=parse_version)}


def version_regex(versions: Sequence[str]) -> str:
    """A PromQL regex for `vllm_version` that matches these releases, with or without a local label (`+sim`)."""
    if not versions:
        raise MetricNamesError("no release to match")
    alternatives = "|".join(re.escape(v) for v in sorted(versions, key=parse_version))
    return f"({alternatives})(\\+.*)?"
