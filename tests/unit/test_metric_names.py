"""module_utils/revive_metric_names.py: each release resolves to its era's metric names, checked against the release
data's `metrics:` lists; a release no era covers, or whose list lacks a name its era claims, is refused; the data's
E2E and TTFT buckets agree with the twin's captured exposition where the twin simulates the era; the TTFT SLO bound
and edge are derived from the E2E target and the field calibration's production level, and move when it does."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.revive_metric_names import (MetricNamesError, common_edge_at_or_above, load_signal_file,
                                                      load_signal_map, resolve, resolve_releases, ttft_bound,
                                                      version_regex)
from ansible.module_utils.revive_releases import load_release_file

REPO = Path(__file__).resolve().parents[2]
SIGNALS = REPO / "data" / "monitoring-signals.yml"
CAPTURES = REPO / "tests" / "data" / "metrics"


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load(SIGNALS.read_text())


@pytest.fixture(scope="module")
def signal_map():
    return load_signal_file(str(SIGNALS))


@pytest.fixture(scope="module")
def releases():
    return {v: r.metrics for v, r in load_release_file(str(REPO / "data" / "vllm-releases.yml")).releases.items()}


def test_every_release_of_the_data_resolves(signal_map, releases):
    resolved = resolve_releases(signal_map, releases)
    assert set(resolved) == set(releases)
    for version, names in resolved.items():
        for signal, name in names.items():
            assert name is None or name in releases[version], (version, signal)


@pytest.mark.parametrize("version, kv, tpot, swapped", [
    ("0.5.4", "vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds", "vllm:num_requests_swapped"),
    ("0.7.3", "vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds", "vllm:num_requests_swapped"),
    ("0.8.5.post1", "vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds", None),
    ("0.9.2", "vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds", None),
    ("0.10.1.1", "vllm:kv_cache_usage_perc", "vllm:time_per_output_token_seconds", None),
    ("0.20.0", "vllm:kv_cache_usage_perc", "vllm:request_time_per_output_token_seconds", None),
])
def test_the_names_per_era(signal_map, releases, version, kv, tpot, swapped):
    names = resolve(signal_map, version, releases[version])
    assert (names["kv_cache_usage"], names["tpot"], names["requests_swapped"]) == (kv, tpot, swapped)
    assert names["requests_waiting"] == "vllm:num_requests_waiting"


def test_a_local_version_label_resolves_like_its_release(signal_map, releases):
    assert resolve(signal_map, "0.8.5.post1+sim", releases["0.8.5.post1"]) == \
        resolve(signal_map, "0.8.5.post1", releases["0.8.5.post1"])


def test_a_release_whose_metrics_lack_a_claimed_name_is_refused(signal_map, releases):
    renamed = [m for m in releases["0.5.4"] if m != "vllm:gpu_cache_usage_perc"] + ["vllm:kv_cache_usage_perc"]
    with pytest.raises(MetricNamesError, match=r"vLLM 0\.5\.4 \(metric era 0\.5\).*lacks vllm:gpu_cache_usage_perc "
                                               r"\(kv_cache_usage\)"):
        resolve(signal_map, "0.5.4", renamed)
    with pytest.raises(MetricNamesError, match="vllm:num_requests_swapped"):
        resolve_releases(signal_map, {**releases, "0.7.3": [m for m in releases["0.7.3"]
                                                           if m != "vllm:num_requests_swapped"]})


def test_a_release_in_no_era_is_refused(signal_map):
    with pytest.raises(MetricNamesError, match=r"vLLM 0\.4\.0 is in no metric era of data/monitoring-signals\.yml"):
        resolve(signal_map, "0.4.0", ["vllm:num_requests_running"])


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["eras"][0]["names"].pop("tpot"), r"eras\[0\]\.names: every signal needs a name or null"),
    (lambda d: d["eras"][1].__setitem__("e2e_buckets", [1.0, 10.0, 20.0]), r"SLO edge le=15\.0 is not an E2E bucket"),
    (lambda d: d["eras"][0]["names"].__setitem__("ttft", "time_to_first_token"), r"not a vllm:\* family name"),
    (lambda d: d["signals"]["ttft"].__setitem__("kind", "summary"), r"signals\.ttft\.kind"),
    (lambda d: d["signals"]["ttft"].__setitem__("record", "vllm_ttft"), r"must start with 'revive:'"),
    (lambda d: d["eras"].append(dict(d["eras"][0], name="dup")), r"in several metric eras"),
    (lambda d: d.__setitem__("schema_version", 2), r"schema_version"),
    (lambda d: d["eras"][2].pop("ttft_buckets"), r"eras\[2\]: missing key 'ttft_buckets'"),
    (lambda d: d["eras"][0].__setitem__("ttft_buckets", [5.0, 2.5]),
     r"eras\[0\]\.ttft_buckets: edges must be increasing"),
    (lambda d: d["slo"]["ttft"].pop("production_concurrency"), r"slo\.ttft: missing key 'production_concurrency'"),
    (lambda d: d["slo"]["ttft"].__setitem__("output_tokens", 200.5), r"slo\.ttft\.output_tokens: expected int"),
])
def test_malformed_signal_data_is_refused(raw, releases, mutate, message):
    data = copy.deepcopy(raw)
    mutate(data)
    with pytest.raises(MetricNamesError, match=message):
        resolve(load_signal_map(data), "0.5.4", releases["0.5.4"])


def test_the_version_regex_matches_exactly_its_releases():
    regex = re.compile(version_regex(["0.5.4", "0.8.5.post1"]))
    assert all(regex.fullmatch(v) for v in ("0.5.4", "0.8.5.post1", "0.8.5.post1+sim"))
    assert not any(regex.fullmatch(v) for v in ("0.5.40", "0x5.4", "0.8.5", "10.5.4"))


@pytest.mark.parametrize("capture, era", [("vllm-0.5.4.prom", "0.5"), ("vllm-0.8.5.post1.prom", "0.8-0.9")])
def test_the_data_e2e_buckets_are_the_twins(signal_map, capture, era):
    text = (CAPTURES / capture).read_text()
    edges = [float(m) for m in re.findall(r'^vllm:e2e_request_latency_seconds_bucket\{le="([0-9.]+)"', text, re.M)]
    assert tuple(edges) == next(e for e in signal_map.eras if e.name == era).e2e_buckets
    assert signal_map.slo.e2e_bucket_le in edges and signal_map.slo.e2e_bucket_le > signal_map.slo.e2e_p95_seconds


@pytest.mark.parametrize("capture, era", [("vllm-0.5.4.prom", "0.5"), ("vllm-0.8.5.post1.prom", "0.8-0.9")])
def test_the_data_ttft_buckets_are_the_twins(signal_map, capture, era):
    text = (CAPTURES / capture).read_text()
    edges = [float(m) for m in re.findall(r'^vllm:time_to_first_token_seconds_bucket\{le="([0-9.]+)"', text, re.M)]
    assert tuple(edges) == next(e for e in signal_map.eras if e.name == era).ttft_buckets


def test_the_ttft_bound_and_edge_are_derived_from_the_data(signal_map):
    """12 s - 200 tokens / (768 tok/s / 32 streams) = 3.67 s; the first edge at or above it in every era is 5.0
    (0.5.4's TTFT buckets end at 10 s). A change here changes the alerts' edge: re-render and re-read the tickets."""
    ttft = signal_map.slo.ttft
    assert ttft.stream_tok_s == 24.0
    assert ttft.bound_seconds == pytest.approx(12 - 200 / 24) and round(ttft.bound_seconds, 2) == 3.67
    assert ttft.bucket_le == 5.0
    assert all(ttft.bucket_le in era.ttft_buckets for era in signal_map.eras)
    assert max(e for e in signal_map.eras[0].ttft_buckets) == 10.0


def test_the_ttft_inputs_are_the_field_calibration_s(signal_map):
    """The signal data states the calibration's numbers with their source; they must stay the calibration's."""
    calibration = yaml.safe_load((REPO / "data" / "field-calibration.yml").read_text())
    production = [level for level in calibration["levels"] if level.get("meets_slo")]
    assert len(production) == 1, "exactly one production level (meets_slo: true) in data/field-calibration.yml"
    ttft = signal_map.slo.ttft
    assert (ttft.production_concurrency, ttft.production_throughput_tok_s) == (production[0]["concurrency"],
                                                                              production[0]["throughput_tok_s"])
    assert ttft.output_tokens == calibration["slo"]["output_tokens"]
    assert signal_map.slo.e2e_p95_seconds == calibration["slo"]["e2e_p95_s"]
    assert "data/field-calibration.yml" in ttft.source


@pytest.mark.parametrize("ttft, slo, bound, edge", [
    ({}, {}, 12 - 200 / 24, 5.0),
    # the field report's concurrency 16 as the production level: 464 / 16 = 29 tok/s per stream
    ({"production_concurrency": 16, "production_throughput_tok_s": 464}, {}, 12 - 200 / 29, 7.5),
    ({"output_tokens": 100}, {}, 12 - 100 / 24, 10.0),
    ({}, {"e2e_p95_seconds": 10.0}, 10 - 200 / 24, 2.5),
])
def test_a_changed_calibration_moves_the_ttft_bound(raw, ttft, slo, bound, edge):
    data = copy.deepcopy(raw)
    data["slo"].update(slo)
    data["slo"]["ttft"].update(ttft)
    derived = load_signal_map(data).slo.ttft
    assert (derived.bound_seconds, derived.bucket_le) == (pytest.approx(bound), edge)


@pytest.mark.parametrize("ttft, slo, message", [
    # 512 / 32 = 16 tok/s: 200 tokens take 12.5 s, more than the whole 12 s target
    ({"production_throughput_tok_s": 512}, {}, r"slo\.ttft: TTFT bound: .*take 12\.5 s.*leaves no time"),
    ({"production_throughput_tok_s": 800}, {"e2e_p95_seconds": 8.0}, r"bound 0 s leaves no time"),
    # a 30 s target leaves 21.7 s: 0.5.4-0.7.3's TTFT buckets end at 10 s, so no edge is common
    ({}, {"e2e_p95_seconds": 30.0, "e2e_bucket_le": 40.0}, r"no bucket edge at or above 21\.67 s is common"),
])
def test_an_underivable_ttft_bound_is_refused(raw, ttft, slo, message):
    data = copy.deepcopy(raw)
    data["slo"].update(slo)
    data["slo"]["ttft"].update(ttft)
    with pytest.raises(MetricNamesError, match=message):
        load_signal_map(data)


def test_the_derivation_functions():
    assert ttft_bound(12.0, 200, 768, 32) == pytest.approx(11 / 3)
    with pytest.raises(MetricNamesError, match="concurrency must be > 0"):
        ttft_bound(12.0, 200, 768, 0)
    assert common_edge_at_or_above(3.67, {"a": [1.0, 2.5, 5.0, 10.0], "b": [2.5, 4.0, 7.5, 10.0]}) == 10.0
    assert common_edge_at_or_above(5.0, {"a": [5.0]}) == 5.0  # at the bound counts
    with pytest.raises(MetricNamesError, match="no bucket edge at or above 11 s"):
        common_edge_at_or_above(11.0, {"a": [5.0, 10.0], "b": [10.0, 20.0]})
