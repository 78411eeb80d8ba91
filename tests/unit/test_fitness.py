"""The fitness rules, one by one, on GPU facts probed from the lab profiles (tests/fixtures/gpus.py)."""
from __future__ import annotations

import os
import pwd

import pytest
from ansible.module_utils.revive_fitness import (
    UNFIT,
    WARN,
    PlanOutcome,
    Policy,
    ProcessOwner,
    evaluate,
    process_owner,
    unit_from_cgroup,
)
from fixtures.gpus import lab_facts

PLAN_054 = PlanOutcome(vllm_version="0.5.4", cuda="12.1", driver_min_branch=525, driver_tested_branch=535)


def nobody(pid: int) -> ProcessOwner:
    return ProcessOwner(pid, visible=False)


def verdict(gpu, policy=Policy(), plan=PLAN_054, owner_of=nobody, **kwargs):
    return evaluate(gpu, policy, plan, owner_of, **kwargs)


def by_check(result, check):
    return [f for f in result.findings if f.check == check]


def test_the_healthy_v100_box_is_fit_with_nothing_to_say():
    result = verdict(lab_facts("v100-pcie-8x"), Policy(expected_gpu_count=8, expected_gpu_name="Tesla V100-PCIE-32GB"))
    assert result.fit is True
    assert result.findings == []


def test_the_degraded_box_is_unfit_for_four_distinct_reasons_on_four_gpus():
    result = verdict(lab_facts("v100-pcie-8x-degraded"))
    assert result.fit is False
    assert [(f.check, f.gpu_index, f.pci_bus_id) for f in result.findings] == [
        ("retired_pages_pending", 1, "00000000:1B:00.0"),
        ("pcie_width", 3, "00000000:3E:00.0"),
        ("ecc_uncorrected", 5, "00000000:89:00.0"),
        ("foreign_process", 6, "00000000:B1:00.0"),
    ]
    assert result.as_dict()["unfit_checks"] == ["ecc_uncorrected", "foreign_process", "pcie_width",
                                                "retired_pages_pending"]


def test_a_message_says_what_which_gpu_why_and_what_to_do():
    message = by_check(verdict(lab_facts("v100-pcie-8x-degraded")), "ecc_uncorrected")[0].message
    assert message.startswith("GPU 5 (00000000:89:00.0): 2 uncorrected ECC error(s) since the driver loaded "
                              "(2 in the GPU's lifetime). Why it matters: ")
    assert "crashes the CUDA context (Xid 48)" in message
    assert "Fix: drain the node, check `nvidia-smi -q -d ECC,PAGE_RETIREMENT`, reboot" in message


def test_pending_retired_pages_name_the_counts():
    finding = by_check(verdict(lab_facts("v100-pcie-8x-degraded")), "retired_pages_pending")[0]
    assert finding.verdict == UNFIT
    assert finding.what == "page retirement pending (0 single-bit, 1 double-bit retired pages)"


def test_remapped_rows_pending_or_failed_are_unfit():
    gpu = lab_facts("a100-sxm4-8x")
    gpu["devices"][2]["remapped_rows"] = {"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False}
    gpu["devices"][4]["remapped_rows"] = {"correctable": 0, "uncorrectable": 9, "pending": False, "failure": True}
    found = by_check(verdict(gpu, plan=PlanOutcome()), "remapped_rows")
    assert [(f.gpu_index, f.what) for f in found] == [(2, "row remapping pending (1 uncorrectable rows)"),
                                                      (4, "row remapping failed (9 uncorrectable rows)")]
    assert found[1].fix == "replace the card (a remapping failure is permanent)"


def test_a_downtrained_link_is_unfit_or_a_warning_as_the_variable_says():
    gpu = lab_facts("v100-pcie-8x-degraded")
    strict = by_check(verdict(gpu), "pcie_width")[0]
    lenient = verdict(gpu, Policy(pcie_width_below_max=WARN))
    assert strict.verdict == UNFIT and strict.what == "PCIe link trained to x8 of x16"
    assert [(f.check, f.verdict) for f in lenient.findings if f.check == "pcie_width"] == [("pcie_width", WARN)]
    assert "PCIe link trained to x8 of x16" in " ".join(lenient.warnings)


def test_a_lower_link_generation_warns_by_default_and_can_be_made_unfit():
    gpu = lab_facts("v100-pcie-8x")
    gpu["devices"][7]["pcie"]["gen_current"] = 1
    assert verdict(gpu).fit is True
    assert by_check(verdict(gpu), "pcie_gen")[0].what == "PCIe link at gen1 of gen3"
    assert verdict(gpu, Policy(pcie_gen_below_max=UNFIT)).fit is False


def test_a_foreign_process_is_unfit_and_says_why_it_is_foreign():
    finding = by_check(verdict(lab_facts("v100-pcie-8x-degraded")), "foreign_process")[0]
    assert finding.what == ("process 48213 (python3) holds 16384 MiB; it is not the vLLM service (not visible in "
                            "this host's /proc (another PID namespace, e.g. a container, or already gone))")


@pytest.mark.parametrize("owner", [
    ProcessOwner(48213, visible=True, user="vllm", unit="session-4.scope"),
    ProcessOwner(48213, visible=True, user="root", unit="vllm@1.service"),
    ProcessOwner(48213, visible=True, user="svc-llm", unit="vllm-chat.service"),
])
def test_the_nodes_own_vllm_service_is_never_foreign(owner):
    gpu = lab_facts("v100-pcie-8x-degraded")
    policy = Policy(own_service_users=("vllm",), own_service_units=("vllm*.service",))
    assert by_check(verdict(gpu, policy, owner_of=lambda pid: owner), "foreign_process") == []


def test_a_visible_process_of_someone_else_is_named_with_its_user_and_unit():
    owner = ProcessOwner(48213, visible=True, user="alice", unit="session-4.scope")
    finding = by_check(verdict(lab_facts("v100-pcie-8x-degraded"), owner_of=lambda pid: owner), "foreign_process")[0]
    assert finding.what.endswith("it is not the vLLM service (user alice, unit session-4.scope)")


def test_persistence_off_is_a_fixable_warning():
    gpu = lab_facts("v100-pcie-8x")
    gpu["devices"][0]["persistence_mode"] = False
    result = verdict(gpu)
    assert result.fit is True
    assert [(f.check, f.verdict, f.gpu_index) for f in result.findings] == [("persistence_off", WARN, 0)]
    assert result.warnings[0].endswith("Fix: enable nvidia-persistenced (or `nvidia-smi -pm 1`)")


def test_gpu_count_as_the_inventory_expects():
    result = verdict(lab_facts("t4-4x"), Policy(expected_gpu_count=8))
    assert [f.what for f in result.findings] == [
        "NVML sees 4 GPU(s), the inventory expects 8 (revive_expected_gpu_count)"]
    assert result.findings[0].where == "node"


def test_gpu_model_as_the_inventory_expects_per_gpu():
    result = verdict(lab_facts("t4-4x"), Policy(expected_gpu_name="Tesla V100-PCIE-32GB"), plan=PlanOutcome())
    assert [(f.check, f.gpu_index) for f in result.findings] == [("gpu_name", i) for i in range(4)]
    assert result.findings[0].what == ("the GPU is a 'Tesla T4', the inventory expects 'Tesla V100-PCIE-32GB' "
                                       "(revive_expected_gpu_name)")


def test_a_driver_older_than_the_planned_release_needs_is_unfit():
    gpu = lab_facts("v100-pcie-8x")
    gpu["driver_version"], gpu["driver_branch"] = "470.256.02", 470
    finding = by_check(verdict(gpu), "driver_branch")[0]
    assert finding.what == ("driver 470.256.02 (R470) is older than R525, the lowest branch for vLLM 0.5.4 "
                            "(CUDA 12.1 wheels; data/vllm-releases.yml driver.min_branch)")
    assert finding.fix.startswith("install driver R535 (the tested branch)")


def test_a_driver_past_voltas_last_branch_is_unfit():
    gpu = lab_facts("v100-pcie-8x")
    gpu["driver_version"], gpu["driver_branch"] = "590.48.01", 590
    findings = by_check(verdict(gpu), "driver_branch")
    assert [f.what for f in findings] == [
        "driver 590.48.01 (R590) is newer than R580, the last branch that supports Volta GPUs "
        "(docs/facts/prior-art.md §7)"]


def test_the_same_new_driver_is_fine_on_ampere():
    gpu = lab_facts("a100-sxm4-8x")
    gpu["driver_version"], gpu["driver_branch"] = "590.48.01", 590
    assert by_check(verdict(gpu), "driver_branch") == []


def test_a_planner_refusal_makes_the_node_unfit_with_the_planners_reason():
    plan = PlanOutcome(refusal_reason="awq checkpoints need CC 7.5; Tesla V100-PCIE-32GB is CC 7.0",
                       refusal_source="docs/facts/vllm-volta.md §7.3")
    result = verdict(lab_facts("v100-pcie-8x"), plan=plan)
    assert result.fit is False
    assert result.reasons == [
        "node: the planner refused: awq checkpoints need CC 7.5; Tesla V100-PCIE-32GB is CC 7.0 "
        "[docs/facts/vllm-volta.md §7.3]. "
        "Why it matters: no vLLM release, layout and flags that would run here were found, so nothing can be "
        "provisioned. Fix: follow the planner's reason, or change the model or revive_plan_overrides; "
        "`bin/revive plan` shows the same decision without Ansible"]


def test_a_failed_probe_is_a_reason_not_a_crash():
    result = verdict(None, probe_error="NVIDIA driver not installed or libnvidia-ml.so.1 not on the loader path on node2")
    assert result.fit is False
    assert result.as_dict()["unfit_checks"] == ["probe_failed"]


@pytest.mark.parametrize("text, unit", [
    ("0::/system.slice/vllm@0.service\n", "vllm@0.service"),
    ("12:cpu,cpuacct:/\n1:name=systemd:/system.slice/vllm-chat.service\n0::/\n", "vllm-chat.service"),
    ("0::/user.slice/user-1000.slice/session-4.scope\n", "session-4.scope"),
    ("0::/init.scope\n", "init.scope"),
    ("0::/\n", None),
])
def test_the_unit_is_read_from_the_cgroup_file(text, unit):
    assert unit_from_cgroup(text) == unit


def test_process_owner_reads_user_and_unit_from_proc(tmp_path):
    me = pwd.getpwuid(os.getuid()).pw_name
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242/status").write_text(f"Name:\tpython3\nUid:\t{os.getuid()}\t{os.getuid()}\t0\t0\n")
    (tmp_path / "4242/cgroup").write_text("0::/system.slice/vllm@1.service\n")
    assert process_owner(4242, str(tmp_path)) == ProcessOwner(4242, visible=True, user=me, unit="vllm@1.service")
    assert process_owner(4343, str(tmp_path)) == ProcessOwner(4343, visible=False)


def test_a_policy_value_outside_unfit_or_warn_is_refused():
    with pytest.raises(ValueError, match="pcie_width_below_max must be one of unfit, warn, not 'fail'"):
        Policy(pcie_width_below_max="fail")
