"""module_utils/revive_metric_names.py: each release resolves to its era's metric names, checked against the release
data's `metrics:` lists; a release no era covers, or whose list lacks a name its era claims, is refused; the data's
E2E buckets agree with the twin's captured exposition where the twin simulates the era."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.revive_metric_names import (MetricNamesError, load_signal_file, load_signal_map, resolve,
                                                      resolve_releases, version_regex)
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
