"""The release matrix (module_utils/revive_release_matrix.py, `bin/revive releases`): every cell is the planner's
release rule, so these facts of data/vllm-releases.yml must show in it as they show in plans."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.module_utils.revive_plan.gpus import synthetic_gpu_facts
from ansible.module_utils.revive_release_matrix import format_matrix, matrix
from ansible.module_utils.revive_releases import load_release_file

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def result():
    data = load_release_file(str(REPO / "data" / "vllm-releases.yml"))
    return matrix(data, str(REPO / "data" / "locks"), {"8xV100-32G": synthetic_gpu_facts(8, 32, "7.0"),
                                                       "8xA100-80G": synthetic_gpu_facts(8, 80, "8.0")})


def row(result, version):
    return next(r for r in result["releases"] if r["version"] == version)


def test_the_volta_cells_follow_the_data(result):
    assert row(result, "0.5.4")["by_cc"]["7.0"] == {"ok": True, "version": "0.5.4", "engine": "V0",
                                                    "attention_backend": "XFORMERS", "warnings": []}
    assert row(result, "0.8.5.post1")["by_cc"]["7.0"]["engine"] == "V0"
    assert row(result, "0.8.5.post1")["by_cc"]["8.0"]["engine"] == "V1"
    refused = row(result, "0.10.1.1")["by_cc"]["7.0"]
    assert not refused["ok"] and "xformers==0.0.31" in refused["reason"] and refused["source"] == "data volta_support"
    assert row(result, "0.10.1.1")["by_cc"]["7.5"]["ok"]            # T4: xFormers 0.0.31 has sm_75 code
    assert not row(result, "0.20.0")["by_cc"]["7.0"]["ok"] and row(result, "0.20.0")["by_cc"]["9.0"]["ok"]


def test_09_runs_v0_on_volta_and_v1_from_ampere_and_shows_its_known_issues(result):
    nine = row(result, "0.9.2")
    assert (nine["by_cc"]["7.0"]["engine"], nine["by_cc"]["8.0"]["engine"]) == ("V0", "V1")
    assert nine["pypi"] is True and all(lock["present"] and not lock["missing"] for lock in nine["locks"])
    assert any("#19185" in issue and issue.startswith("on CC < 8.0: ") for issue in nine["known_issues"])
    assert nine["gpu_sets"]["8xV100-32G"]["ok"] and nine["picked_for"] == []


@pytest.mark.parametrize("version", ["0.6.6.post1", "0.7.3"])
def test_066_and_073_run_v0_everywhere_and_name_their_v1_alpha_failure(result, version):
    seven = row(result, version)
    assert [seven["by_cc"][cc]["engine"] for cc in ("7.0", "7.5", "8.0", "9.0")] == ["V0"] * 4
    assert (seven["by_cc"]["7.0"]["attention_backend"], seven["by_cc"]["8.0"]["attention_backend"]) == (
        "XFORMERS", "FLASH_ATTN")
    assert seven["pypi"] is True and all(lock["present"] and not lock["missing"] for lock in seven["locks"])
    assert any("#13398" in issue and issue.startswith("on CC < 8.0: ") for issue in seven["known_issues"])


def test_the_planner_picks_and_installability_are_separate_columns(result):
    assert row(result, "0.8.5.post1")["picked_for"] == ["8xV100-32G"]
    assert row(result, "0.10.1.1")["picked_for"] == ["8xA100-80G"]
    # 0.5.4 runs on the V100 set from a mirror, but PyPI cannot install it: its locks miss pyairports
    fifty_four = row(result, "0.5.4")
    assert fifty_four["gpu_sets"]["8xV100-32G"]["ok"] and fifty_four["pypi"] is False
    assert [lock["missing"] for lock in fifty_four["locks"]] == [["pyairports==2.1.1"]] * 2
    assert "pyairports" in fifty_four["installability"]["reason"]
    assert all(lock["present"] and not lock["missing"] for lock in row(result, "0.8.5.post1")["locks"])
    # the driver of the synthetic sets (R535) is too old for 0.20.0 (R580): judged on the named sets
    assert not row(result, "0.20.0")["gpu_sets"]["8xA100-80G"]["ok"]
    assert "R580" in row(result, "0.20.0")["gpu_sets"]["8xA100-80G"]["reason"]


def test_the_table_names_every_release_and_set(result):
    text = format_matrix(result)
    for version in ("0.5.4", "0.6.6.post1", "0.7.3", "0.8.5.post1", "0.9.2", "0.10.1.1", "0.20.0"):
        assert f"\n{version} " in "\n" + text
    assert ("8xV100-32G: the planner picks 0.8.5.post1; a pinned plan runs 0.5.4, 0.6.6.post1, 0.7.3, 0.8.5.post1, "
            "0.9.2\n") in text
    assert "0.5.4: not installable from PyPI" in text


def test_the_command_prints_json_and_refuses_an_unknown_gpu_set(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "bin" / "revive"), "releases", "--json", "--gpus",
                           "8x32@7.0,v100-pcie-8x"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["gpu_sets"] == ["8x32@7.0", "v100-pcie-8x"]
    assert row(printed, "0.8.5.post1")["picked_for"] == ["8x32@7.0", "v100-pcie-8x"]
    bad = subprocess.run([sys.executable, str(REPO / "bin" / "revive"), "releases", "--gpus", "p100-4x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--gpus p100-4x: not a file, not a lab profile" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


PROFILES = ("v100-pcie-8x", "dgx1-v100", "a100-sxm4-8x")
# The sources of revive_plan.rules.release_for's refusals: what the matrix judges.
RELEASE_RULES = ("data volta_support", "data releases", "data min_compute_capability", "data engine_by_cc",
                 "data driver", "data kernels", "data installability", "data default_release_by_cc")


@pytest.mark.parametrize("profile", PROFILES)
def test_every_release_plans_on_the_lab_profiles_or_is_refused_as_the_matrix_says(profile):
    """Issue 14: every release of the data, pinned, plans the 20B on each lab profile (every replica's argv
    parsing with that release's own table) or is refused - for the reason the matrix shows for that set."""
    sys.path.insert(0, str(REPO / "tests"))
    from fixtures.gpus import lab_facts, lab_ram_bytes  # type: ignore[import-not-found]
    from fixtures.models import model_config  # type: ignore[import-not-found]
    from ansible.module_utils.revive_model import model_from_config
    from ansible.module_utils.revive_plan import Overrides, PackageSource, PlanRefusal, Serve, Workload, plan_release

    data = load_release_file(str(REPO / "data" / "vllm-releases.yml"))
    facts = lab_facts(profile)
    cells = {r["version"]: r["gpu_sets"][profile] for r in matrix(data, str(REPO / "data" / "locks"),
                                                                   {profile: facts})["releases"]}
    dtype = "BF16" if profile.startswith("a100") else "F16"
    model = model_from_config(model_config("internlm2-chat-20b", dtype=dtype), "/data/models/chat-20b")
    mirror = PackageSource("mirror", "https://pypi.internal.example/simple")
    planned = []
    for version in data.versions():
        try:
            result = plan_release(facts, model, data, Workload(), Overrides(vllm_version=version), Serve(),
                                  lab_ram_bytes(profile), mirror)
        except PlanRefusal as refusal:
            # a release the matrix takes may still be refused for the model (fit, heads), never for the release
            assert not cells[version]["ok"] or not refusal.source.startswith(RELEASE_RULES), (version, refusal.reason)
            if not cells[version]["ok"]:
                assert (refusal.reason, refusal.source) == (cells[version]["reason"], cells[version]["source"])
                assert f"vLLM {version}" in refusal.reason
            continue
        assert cells[version]["ok"], (version, cells[version])
        assert result["vllm_version"] == version
        release = data.release(version)
        for replica in result["replicas"]:
            assert release.validate_argv(replica["args"]) == [], (version, replica["args"])
        planned.append(version)
    print(profile, "planned:", planned)
    assert {"0.5.4", "0.6.6.post1", "0.7.3", "0.8.5.post1", "0.9.2"} <= set(planned), planned


def test_gemma2_on_volta_is_refused_for_the_way_each_release_fails():
    """0.5.4's xFormers raises on soft-capping; from 0.6.x it warns and serves without it: both refused, each
    reason saying what the operator would see."""
    sys.path.insert(0, str(REPO / "tests"))
    from fixtures.gpus import lab_facts, lab_ram_bytes  # type: ignore[import-not-found]
    from fixtures.models import model_config  # type: ignore[import-not-found]
    from ansible.module_utils.revive_model import model_from_config
    from ansible.module_utils.revive_plan import Overrides, PackageSource, PlanRefusal, Serve, Workload, plan_release

    data = load_release_file(str(REPO / "data" / "vllm-releases.yml"))
    model = model_from_config(model_config("gemma-2-9b-it", dtype="F16"), "/data/models/gemma-2")
    mirror = PackageSource("mirror", "https://pypi.internal.example/simple")
    said = {}
    for version in ("0.5.4", "0.9.2"):
        with pytest.raises(PlanRefusal) as refusal:
            plan_release(lab_facts("v100-pcie-8x"), model, data, Workload(), Overrides(vllm_version=version), Serve(),
                         lab_ram_bytes("v100-pcie-8x"), mirror)
        said[version] = refusal.value.reason
    assert "'XFormers does not support attention logits soft capping.'" in said["0.5.4"]
    assert "'XFormers does not support logits soft cap. Outputs may be slightly off.'" in said["0.9.2"]


# (release, profile) -> what the plan must show: VLLM_USE_V1 in the replica environment (None: unset), whether
# --disable-log-requests and --disable-frontend-multiprocessing are emitted, and --swap-space (None: not emitted,
# "int": a whole number, V0 only). Sources: each release's entry in data/vllm-releases.yml.
DIFFERENCES = {
    ("0.5.4", "v100-pcie-8x"): (None, True, True, "int"),
    ("0.5.4", "a100-sxm4-8x"): (None, True, True, "int"),
    ("0.6.6.post1", "dgx1-v100"): (None, True, False, "int"),     # V1 is opt-in: nothing to switch off
    ("0.6.6.post1", "a100-sxm4-8x"): (None, True, False, "int"),
    ("0.7.3", "v100-pcie-8x"): (None, True, False, "int"),
    ("0.7.3", "a100-sxm4-8x"): (None, True, False, "int"),       # V0 on Ampere too
    ("0.8.5.post1", "v100-pcie-8x"): ("0", True, False, "int"),
    ("0.8.5.post1", "a100-sxm4-8x"): (None, True, False, None),  # V1: no CPU swap
    ("0.9.2", "dgx1-v100"): ("0", True, False, "int"),
    ("0.9.2", "a100-sxm4-8x"): (None, True, False, None),
    ("0.10.1.1", "a100-sxm4-8x"): (None, False, False, None),   # requests are not logged by default from 0.10.1
}


@pytest.mark.parametrize("version, profile", sorted(DIFFERENCES))
def test_the_plan_carries_each_releases_differences(version, profile):
    sys.path.insert(0, str(REPO / "tests"))
    from fixtures.gpus import lab_facts, lab_ram_bytes  # type: ignore[import-not-found]
    from fixtures.models import model_config  # type: ignore[import-not-found]
    from ansible.module_utils.revive_model import model_from_config
    from ansible.module_utils.revive_plan import Overrides, PackageSource, Serve, Workload, plan_release

    data = load_release_file(str(REPO / "data" / "vllm-releases.yml"))
    model = model_from_config(model_config("internlm2-chat-20b", dtype="F16"), "/data/models/chat-20b")
    result = plan_release(lab_facts(profile), model, data, Workload(), Overrides(vllm_version=version), Serve(),
                          lab_ram_bytes(profile), PackageSource("mirror", "https://pypi.internal.example/simple"))
    use_v1, log_flag, frontend_flag, swap = DIFFERENCES[(version, profile)]
    for replica in result["replicas"]:
        args = replica["args"]
        assert replica["env"].get("VLLM_USE_V1") == use_v1, (version, profile, replica["env"])
        assert ("--disable-log-requests" in args) is log_flag
        assert ("--disable-frontend-multiprocessing" in args) is frontend_flag
        assert "--enable-chunked-prefill" not in args   # max-model-len 4096: no release turns it on by itself
        if swap is None:
            assert "--swap-space" not in args
        else:
            assert args[args.index("--swap-space") + 1].isdigit()


@pytest.mark.parametrize("profile", ["v100-pcie-8x", "dgx1-v100"])
def test_0_10_1_1_is_refused_on_volta_for_xformers_0_0_31(profile):
    """Its generated kernels scan: xformers 0.0.31 has no sm_70 cubins; the refusal names the release and why."""
    sys.path.insert(0, str(REPO / "tests"))
    from fixtures.gpus import lab_facts, lab_ram_bytes  # type: ignore[import-not-found]
    from fixtures.models import model_config  # type: ignore[import-not-found]
    from ansible.module_utils.revive_model import model_from_config
    from ansible.module_utils.revive_plan import Overrides, PackageSource, PlanRefusal, Serve, Workload, plan_release

    data = load_release_file(str(REPO / "data" / "vllm-releases.yml"))
    model = model_from_config(model_config("internlm2-chat-20b", dtype="F16"), "/data/models/chat-20b")
    with pytest.raises(PlanRefusal) as refusal:
        plan_release(lab_facts(profile), model, data, Workload(), Overrides(vllm_version="0.10.1.1"), Serve(),
                     lab_ram_bytes(profile), PackageSource("index", "https://pypi.org/simple"))
    assert "vLLM 0.10.1.1" in refusal.value.reason and "0.0.31" in refusal.value.reason
    assert refusal.value.source.startswith(RELEASE_RULES)


def test_0_10_1_1_plans_v1_on_a100_with_flags_of_its_generated_table():
    sys.path.insert(0, str(REPO / "tests"))
    from fixtures.gpus import lab_facts, lab_ram_bytes  # type: ignore[import-not-found]
    from fixtures.models import model_config  # type: ignore[import-not-found]
    from ansible.module_utils.revive_model import model_from_config
    from ansible.module_utils.revive_plan import Overrides, PackageSource, Serve, Workload, plan_release

    data = load_release_file(str(REPO / "data" / "vllm-releases.yml"))
    release = data.release("0.10.1.1")
    assert release.get("cli")["complete"] is True
    model = model_from_config(model_config("internlm2-chat-20b", dtype="BF16"), "/data/models/chat-20b")
    result = plan_release(lab_facts("a100-sxm4-8x"), model, data, Workload(), Overrides(vllm_version="0.10.1.1"),
                          Serve(), lab_ram_bytes("a100-sxm4-8x"), PackageSource("index", "https://pypi.org/simple"))
    assert result["vllm_version"] == "0.10.1.1" and result["replicas"]
    for replica in result["replicas"]:
        assert release.validate_argv(replica["args"]) == [], replica["args"]
        assert "--disable-log-requests" not in replica["args"]   # deprecated no-op in 0.10.1.1's table
        assert "VLLM_USE_V1" not in replica["env"]
