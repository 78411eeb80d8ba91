"""data/vllm-releases.yml through its loader: content from the reference (docs/facts/vllm-volta.md), validation,
argv checking."""
from __future__ import annotations

import copy

import pytest
import yaml
from ansible.module_utils.revive_releases import (
    ReleaseDataError,
    load_release_data,
    load_release_file,
    parse_version,
    version_matches,
)

NOTES_ARGV = [  # the field notes' launch command, flags only
    "--model", "/data/models/chat-20b-fp16", "--tensor-parallel-size", "8", "--dtype", "float16",
    "--gpu-memory-utilization", "0.92", "--max-model-len", "4096", "--max-num-seqs", "128",
    "--max-num-batched-tokens", "8192", "--enforce-eager", "--swap-space", "16",
    "--disable-log-requests", "--host", "0.0.0.0", "--port", "8000",
]


@pytest.fixture(scope="module")
def raw(repo):
    with open(repo / "data" / "vllm-releases.yml") as handle:
        return yaml.safe_load(handle)


@pytest.fixture(scope="module")
def data(repo):
    return load_release_file(str(repo / "data" / "vllm-releases.yml"))


def test_the_file_holds_the_required_releases(data):
    assert data.versions() == ["0.5.4", "0.6.6.post1", "0.7.3", "0.8.5.post1", "0.9.2", "0.10.1.1", "0.20.0"]


def test_054_has_the_full_cli_table_of_the_reference(data):
    release = data.release("0.5.4")
    assert release.cli_complete is True
    assert len(release.arguments) == 99  # docs/facts/vllm-volta.md §2.1: 99 actions plus -h
    assert release.argument("--block-size").choices == ("8", "16", "32")
    assert release.argument("-tp").flags == ("--tensor-parallel-size", "-tp")
    assert release.argument("--swap-space").type == "int"
    assert release.argument("--dtype").choices == ("auto", "half", "float16", "bfloat16", "float", "float32")


def test_field_notes_launch_command_is_valid_for_054(data):
    assert data.release("0.5.4").validate_argv(NOTES_ARGV) == []


@pytest.mark.parametrize("argv, error", [
    (["--enable-log-requests"], "unknown flag --enable-log-requests for vLLM 0.5.4 (argparse: unrecognized "
                                "arguments; the server would exit 2 at start)"),
    (["--block-size", "64"], "--block-size '64': invalid choice for vLLM 0.5.4 (choose from 8, 16, 32)"),
    (["--swap-space", "0.5"], "--swap-space '0.5': not a valid int for vLLM 0.5.4 (argparse: invalid int value)"),
    (["--dtype=bf16"], "--dtype 'bf16': invalid choice for vLLM 0.5.4 (choose from auto, half, float16, "
                       "bfloat16, float, float32)"),
    (["--enforce-eager=true"], "--enforce-eager takes no value (got 'true')"),
    (["--max-model-len", "32k"], "--max-model-len '32k': not a valid int for vLLM 0.5.4 (argparse: invalid int value)"),
    (["--port"], "--port expects a value"),
])
def test_argv_errors_for_054(data, argv, error):
    assert data.release("0.5.4").validate_argv(argv) == [error]


def test_underscore_flags_and_multi_value_flags_parse(data):
    argv = ["--tensor_parallel_size", "2", "--served-model-name", "chat", "chat-20b", "--enforce-eager"]
    assert data.release("0.5.4").validate_argv(argv) == []


def test_incomplete_table_refuses_unverified_flags(data):
    release = data.release("0.20.0")
    assert release.validate_argv(["--max-model-len", "8k", "--no-enforce-eager"]) == []
    assert release.validate_argv(["--disable-log-stats"]) == [
        "flag --disable-log-stats is not in the verified argument table of vLLM 0.20.0; verify it against "
        "that release before emitting it"]


def test_0_10_1_1_is_generated_and_refused_on_volta_for_xformers(data):
    """The wheel's own parser (171 actions) and the kernels scan: xformers 0.0.31 has no sm_70 code, sm_75 it has."""
    release = data.release("0.10.1.1")
    assert release.get("cli")["complete"] is True and len(release.arguments) == 171
    assert release.validate_argv(["--disable-log-stats", "--enable-log-requests"]) == []
    assert release.kernel_gaps((7, 0)) == ["xformers 0.0.31 (cubins sm_75, sm_80, sm_90)"]
    assert release.kernel_gaps((7, 5)) == [] and release.kernel_gaps((8, 0)) == []
    assert data.volta_status("0.10.1.1", (7, 0))["status"] == "refused"
    assert release.get("request_logging_default") is False
    assert "vllm:kv_cache_usage_perc" in release.metrics and "vllm:prefix_cache_hits_total" in release.metrics


def test_swap_space_is_gone_in_020(data):
    assert data.release("0.20.0").argument("--swap-space") is None
    assert data.release("0.20.0").argument("--disable-frontend-multiprocessing") is None


@pytest.mark.parametrize("cc, version", [((7, 0), "0.8.5.post1"), ((7, 5), "0.8.5.post1"), ((8, 0), "0.10.1.1"),
                                         ((9, 0), "0.10.1.1")])
def test_default_release_by_compute_capability(data, cc, version):
    assert data.default_release(cc)[0] == version


def test_no_default_below_volta(data):
    with pytest.raises(ReleaseDataError, match="no release in the data serves compute capability 6.0"):
        data.default_release((6, 0))


@pytest.mark.parametrize("version, status", [("0.5.4", "supported"), ("0.8.5.post1", "supported"),
                                             ("0.9.2", "supported"), ("0.10.0", "refused"), ("0.10.1.1", "refused"),
                                             ("0.10.2", "experimental"), ("0.19.1", "experimental"),
                                             ("0.20.0", "refused"), ("0.33.0", "refused"), ("0.4.2", "refused")])
def test_volta_cutoffs_are_data(data, version, status):
    assert data.volta_status(version)["status"] == status


def test_the_xformers_cut_holds_for_volta_only(data):
    assert data.volta_status("0.10.1.1", (7, 5))["status"] == "supported"
    assert "xformers==0.0.31" in data.volta_status("0.10.1.1", (7, 0))["reason"]
    assert data.release("0.10.1.1").min_compute_capability == (7, 5)


def test_the_volta_default_is_the_newest_release_pypi_installs_with_sm70_everywhere_but_09(data):
    """The rule the default row states, recomputed from the data: installable from PyPI, supported on CC 7.0, and
    every scanned compiled dependency has sm_70 code. 0.9.2 qualifies too; the row keeps 0.8.5.post1 and says why
    (the same V0 + xFormers engine on Volta, a tighter transformers cap), so a newer qualifying release cannot become
    the default unnoticed."""
    qualified = [version for version, release in data.releases.items()
                 if release.installability is not None and release.installability.pypi
                 and data.volta_status(version)["status"] == "supported"
                 and release.min_compute_capability <= (7, 0)
                 and release.kernels and not release.kernel_gaps((7, 0))]
    assert sorted(qualified, key=parse_version)[-2:] == ["0.8.5.post1", "0.9.2"]
    version, reason = data.default_release((7, 0))
    assert version == "0.8.5.post1"
    assert "0.9.2 also qualifies" in " ".join(reason.split())
    assert data.release("0.9.2").engine_for((7, 0)) == data.release("0.8.5.post1").engine_for((7, 0)) == "V0"


def test_0851_kernels_were_scanned_for_every_compiled_dependency(data):
    scanned = {scan.distribution: scan for scan in data.release("0.8.5.post1").kernels}
    assert {"vllm", "xformers", "torch"} <= set(scanned)
    assert all(70 in scan.cubin_archs for scan in scanned.values())


def test_054_is_the_notes_release_that_pypi_cannot_install(data):
    release = data.release("0.5.4")
    assert release.installability.pypi is False
    assert "vllm-project/vllm#23983" in release.installability.reason
    assert [item["requirement"] for item in release.get("lock")["supplied"]] == ["pyairports==2.1.1"]


def test_0851_cli_table_was_generated_from_the_wheel(data):
    release = data.release("0.8.5.post1")
    assert release.cli_complete is True
    assert release.get("cli")["generated_from"].startswith("vllm-0.8.5.post1")
    assert release.argument("--swap-space").type == "float"
    assert release.argument("--max-model-len").type == "human_readable_int"
    assert release.argument("--disable-log-requests") is not None
    assert release.argument("--enable-log-requests") is None


def test_engines_and_backends(data):
    assert data.release("0.10.1.1").engine_for((7, 0)) == "V0"
    assert data.release("0.10.1.1").engine_for((8, 0)) == "V1"
    assert data.release("0.10.1.1").kv_sizing_for("V1") == "v1"
    assert data.release("0.5.4").attention_backend_for((7, 0)) == "XFORMERS"
    assert data.release("0.5.4").kv_sizing_for("V0") == "v0-mem-get-info"


def test_quantization_minimums_follow_the_reference(data):
    q = data.release("0.5.4").quantization_min_cc
    assert (q["gptq"], q["awq"], q["gptq_marlin"], q["fp8"], q["bitsandbytes"]) == (60, 75, 80, 80, 70)
    assert data.release("0.20.0").quantization_min_cc["gptq_marlin"] == 75


def test_054_metrics_include_what_the_notes_watch(data):
    metrics = data.release("0.5.4").metrics
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc"} <= set(metrics)
    assert "vllm:gpu_cache_usage_perc" not in data.release("0.20.0").metrics


def test_versions_order():
    assert parse_version("0.6.3") < parse_version("0.6.3.post1") < parse_version("0.6.4")
    assert parse_version("0.10.1.1") > parse_version("0.10.1") and parse_version("0.5.4+sim") == parse_version("0.5.4")
    assert version_matches("0.10.1.1", ">=0.5.4,<0.10.2") and not version_matches("0.10.2", ">=0.5.4,<0.10.2")


# ---------------------------------------------------------------- the loader rejects malformed data

def _broken(raw, edit):
    data = copy.deepcopy(raw)
    edit(data)
    with pytest.raises(ReleaseDataError) as err:
        load_release_data(data, source="data/vllm-releases.yml")
    return str(err.value)


def test_missing_key_names_the_path(raw):
    message = _broken(raw, lambda d: d["releases"]["0.5.4"].pop("pins"))
    assert message == "data/vllm-releases.yml: releases.0.5.4: missing key 'pins'"


def test_wrong_type(raw):
    message = _broken(raw, lambda d: d["releases"]["0.5.4"]["defaults"].update(max_num_seqs="many"))
    assert message == "data/vllm-releases.yml: releases.0.5.4.defaults.max_num_seqs: expected int, got str"


def test_unknown_kv_family(raw):
    message = _broken(raw, lambda d: d["releases"]["0.5.4"]["kv_sizing_by_engine"].update(V0="guess"))
    assert "releases.0.5.4.kv_sizing_by_engine.V0: 'guess' is not one of v0-mem-get-info" in message


def test_default_row_must_name_a_release(raw):
    message = _broken(raw, lambda d: d["default_release_by_cc"][0].update(release="0.9.9"))
    assert message.endswith("default_release_by_cc[0].release: '0.9.9' has no entry under releases")


def test_duplicate_flag(raw):
    def edit(d):
        d["releases"]["0.5.4"]["cli"]["arguments"].append(
            {"flags": ["--port"], "action": "store", "type": "int", "default": 1})
    assert "flag --port already defined at [1]" in _broken(raw, edit)


def test_pin_must_match_key(raw):
    message = _broken(raw, lambda d: d["releases"]["0.5.4"]["pins"].update(vllm="0.5.5"))
    assert "releases.0.5.4.pins.vllm: '0.5.5' must equal the release key '0.5.4'" in message


def test_schema_version(raw):
    assert "schema_version: expected 1, got 2" in _broken(raw, lambda d: d.update(schema_version=2))


def test_unknown_release_lookup(data):
    with pytest.raises(ReleaseDataError, match=r"vLLM 0.6.3 is not in the release data \(known: 0.5.4, "
                                               r"0.6.6.post1, 0.7.3, 0.8.5.post1, 0.9.2, 0.10.1.1, 0.20.0\)"):
        data.release("0.6.3")


# ---------------------------------------------------------------- the engine oracle and known issues

@pytest.mark.parametrize("version, oracle", [("0.5.4", "v0-only"), ("0.6.6.post1", "v1-opt-in"),
                                             ("0.7.3", "v1-opt-in"), ("0.8.5.post1", "v1-default-cc8-fallback"),
                                             ("0.9.2", "v1-default-cc8-fallback"), ("0.20.0", "v1-only")])
def test_each_release_says_how_it_picks_its_engine(data, version, oracle):
    assert data.release(version).engine_oracle == oracle


def test_a_fallback_release_must_pin_v0_below_cc8(raw):
    message = _broken(raw, lambda d: d["releases"]["0.9.2"].pop("engine_env"))
    assert "releases.0.9.2.engine_env.below_8: v1-default-cc8-fallback needs VLLM_USE_V1: \"0\"" in message


def test_the_oracle_and_engine_by_cc_must_agree(raw):
    message = _broken(raw, lambda d: d["releases"]["0.9.2"].update(engine_oracle="v0-only"))
    assert "releases.0.9.2.engine_by_cc: v0-only gives {'below_8': 'V0', 'from_8': 'V0'}" in message
    message = _broken(raw, lambda d: d["releases"]["0.9.2"].update(engine_oracle="v2"))
    assert "releases.0.9.2.engine_oracle: 'v2' is not one of v0-only, v1-opt-in" in message


def test_an_opt_in_release_must_not_opt_in(raw):
    def edit(d):
        d["releases"]["0.5.4"].update(engine_oracle="v1-opt-in", engine_env={"below_8": {"VLLM_USE_V1": "1"}})
    assert "releases.0.5.4.engine_env: v1-opt-in plans V0, so VLLM_USE_V1 must not be \"1\"" in _broken(raw, edit)


def test_known_issues_carry_scope_and_source(data, raw):
    issues = data.release("0.9.2").known_issues
    assert any("#19185" in item["source"] and item["scope"] == "CC < 8.0" for item in issues)
    message = _broken(raw, lambda d: d["releases"]["0.9.2"]["known_issues"][0].update(scope="V100"))
    assert "releases.0.9.2.known_issues[0].scope: 'V100' is not one of CC < 8.0, every GPU" in message
    message = _broken(raw, lambda d: d["releases"]["0.9.2"]["known_issues"][0].pop("source"))
    assert "releases.0.9.2.known_issues[0]: missing key 'source'" in message


def test_softcapping_failure_is_one_of_what_xformers_does(data, raw):
    assert data.release("0.5.4").get("xformers_logit_softcapping_failure") == "raises"
    assert data.release("0.9.2").get("xformers_logit_softcapping_failure") == "ignored-with-warning"
    message = _broken(raw, lambda d: d["releases"]["0.9.2"].update(xformers_logit_softcapping_failure="crash"))
    assert "xformers_logit_softcapping_failure: 'crash' is not one of raises, ignored-with-warning" in message
