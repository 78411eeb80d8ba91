"""The vLLM metric name of each monitoring signal, per release: data/monitoring-signals.yml checked against the
release data's `metrics:` lists (data/vllm-releases.yml).

A release resolves through the one era whose `versions` range holds it; every signal the era names must be a
family of that release's `metrics:` list, so a rename in either file is refused here (and fails
tests/unit/test_metric_names.py and `monitoring/render.py --check`) instead of leaving a rule that matches nothing.
Controller-side only: monitoring/render.py and the tests read it.
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
    names: Dict[str, Optional[str]]


@dataclass(frozen=True)
class Slo:
    e2e_p95_seconds: float
    objective: float
    e2e_bucket_le: float


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
        slo = Slo(float(_require(raw_slo, "e2e_p95_seconds", (int, float), "slo")),
                  float(_require(raw_slo, "objective", float, "slo")),
                  float(_require(raw_slo, "e2e_bucket_le", (int, float), "slo")))
        if not 0 < slo.objective < 1:
            raise MetricNamesError(f"slo.objective: {slo.objective} is not between 0 and 1")
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
            if names["e2e_latency"] is not None and slo.e2e_bucket_le not in buckets:
                raise MetricNamesError(
                    f"{where}.e2e_buckets: the SLO edge le={slo.e2e_bucket_le} is not an E2E bucket of era "
                    f"{entry.get('name')!r}; the SLI needs an edge every era has")
            eras.append(Era(str(_require(entry, "name", str, where)), versions, str(_require(entry, "source", str,
                                                                                              where)),
                            buckets, {k: (None if v is None else str(v)) for k, v in names.items()}))
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
