"""module_utils/revive_record/: the release the units run, the node's record, rollback and venv pruning."""
from __future__ import annotations

import copy
import functools
import json
import string

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from ansible.module_utils.revive_plan import Overrides, Serve, plan_release
from ansible.module_utils.revive_record import ReleaseError
from ansible.module_utils.revive_record.journal import journal_excerpt, units_to_quote
from ansible.module_utils.revive_record.pinning import host_pinning, parse_cpu_list
from ansible.module_utils.revive_record.record import (
    Record,
    load_record,
    promote,
    record_rollback,
    rollback_target,
    stale_units,
)
from ansible.module_utils.revive_record.release import HostView, build_release, release_id
from ansible.module_utils.revive_record.systemd import (
    StartTiming,
    environment_assignment,
    exec_start,
    health_deadline,
    parse_exec_words,
    start_limit_interval,
)
from ansible.module_utils.revive_record.venvs import python_satisfies, venv_name, venv_packages, venvs_to_prune
from ansible.module_utils.revive_topology import format_cpu_list
from ansible.module_utils.revive_releases import load_release_file
from fixtures.gpus import lab_facts, lab_ram_bytes
from fixtures.models import write_model
from ansible.module_utils.revive_model import inspect_model

VENV = "/opt/vllm/venvs/0.5.4-1a2b3c4d"
HOST = HostView("node1", online_cpus=tuple(range(80)), numa_nodes=(0, 1), venv_stamp="1700000000000000000",
                model_content_id="c0ffee")


@functools.lru_cache(maxsize=None)
def _plan_json(tmp_root: str, simulated: bool) -> str:
    model = inspect_model(write_model(f"{tmp_root}/tiny-chat", "llama-2-7b-chat", size="tiny"))
    facts = lab_facts("v100-pcie-8x")
    facts["simulated"] = simulated
    plan = plan_release(facts, model, load_release_file("data/vllm-releases.yml"),
                        overrides=Overrides(tensor_parallel_size=4),
                        serve=Serve(model_path="/data/models/tiny-chat/rev1", served_model_name="tiny-chat",
                                    host="10.0.3.11"),
                        host_ram_bytes=lab_ram_bytes("v100-pcie-8x"))
    return json.dumps(plan)


@pytest.fixture
def plan(tmp_path_factory, repo, monkeypatch):
    monkeypatch.chdir(repo)
    root = str(tmp_path_factory.getbasetemp() / "release-plan")
    return json.loads(_plan_json(root, False))


@pytest.fixture
def lab_plan(tmp_path_factory, repo, monkeypatch):
    monkeypatch.chdir(repo)
    root = str(tmp_path_factory.getbasetemp() / "release-plan")
    return json.loads(_plan_json(root, True))


# --- venv pins ---------------------------------------------------------------------------------------

def test_volta_venv_pins_are_the_release_pins_without_flash_attention_or_non_packages():
    pins = {"vllm": "0.5.4", "torch": "2.4.0", "xformers": "0.0.27.post2", "vllm-flash-attn": "2.6.1",
            "cuda": "12.1", "python": ">=3.8,<3.13"}
    packages, notes = venv_packages(pins, "7.0")
    assert packages == ["torch==2.4.0", "vllm==0.5.4", "xformers==0.0.27.post2"]
    assert notes == ["vllm-flash-attn==2.6.1 left out: compute capability 7.0 < 8.0 runs XFORMERS "
                     "(docs/facts/vllm-volta.md §1.3)"]


def test_ampere_keeps_vllm_flash_attn():
    packages, notes = venv_packages({"vllm": "0.5.4", "vllm-flash-attn": "2.6.1"}, "8.0")
    assert (packages, notes) == (["vllm==0.5.4", "vllm-flash-attn==2.6.1"], [])


def test_venv_name_is_version_and_a_hash_of_pins_and_interpreter():
    name = venv_name("0.5.4", ["vllm==0.5.4", "torch==2.4.0"], "/usr/bin/python3.11")
    assert name.startswith("0.5.4-") and len(name) == len("0.5.4-") + 8
    assert venv_name("0.5.4", ["torch==2.4.0", "vllm==0.5.4"], "/usr/bin/python3.11") == name
    assert venv_name("0.5.4", ["torch==2.4.1", "vllm==0.5.4"], "/usr/bin/python3.11") != name
    assert venv_name("0.5.4", ["vllm==0.5.4", "torch==2.4.0"], "/usr/bin/python3.10") != name
    # a regenerated lock (other files, other hashes) gets a venv of its own
    assert venv_name("0.5.4", ["vllm==0.5.4", "torch==2.4.0"], "/usr/bin/python3.11", "ab" * 32) != name


@pytest.mark.parametrize("version,spec,expected", [
    ("3.11.2", ">=3.8,<3.13", True), ("3.10.12", ">=3.8,<3.13", True), ("3.13.0", ">=3.8,<3.13", False),
    ("3.7.9", ">=3.8,<3.13", False), ("3.11.9", "==3.11", True), ("3.12.1", "==3.11", False),
])
def test_python_version_against_the_release_python_pin(version, spec, expected):
    assert python_satisfies(version, spec) is expected


# --- CPU lists and pinning ----------------------------------------------------------------------------

def test_cpu_lists_round_trip():
    assert parse_cpu_list("0-19,40-59") == list(range(20)) + list(range(40, 60))
    assert parse_cpu_list("0-1\n") == [0, 1]
    assert parse_cpu_list("3 5-6") == [3, 5, 6]
    assert format_cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    with pytest.raises(ReleaseError, match="runs backwards"):
        parse_cpu_list("9-3")


def test_real_gpus_pin_as_planned():
    replica = {"name": "vllm-1", "cpus": list(range(20, 40)) + list(range(60, 80)), "numa_node": 1}
    assert host_pinning(replica, range(80), [0, 1], False, "node1").__dict__ == \
        {"cpu_affinity": "20-39,60-79", "numa_node": 1, "note": None}


def test_real_gpus_with_cpus_the_host_lacks_are_refused():
    replica = {"name": "vllm-1", "cpus": list(range(20, 40)), "numa_node": 1}
    with pytest.raises(ReleaseError, match=r"vllm-1: the plan pins CPUs 20-39 but node9 has no online CPUs 20-39 "
                                           r"\(online: 0-1\); the plan is for other hardware"):
        host_pinning(replica, [0, 1], [0], False, "node9")
    with pytest.raises(ReleaseError, match=r"binds memory to NUMA node 1 but node9 has nodes 0"):
        host_pinning(replica, range(64), [0], False, "node9")


def test_simulated_gpus_record_the_pinning_without_applying_it():
    replica = {"name": "vllm-1", "cpus": list(range(20, 40)), "numa_node": 1}
    pinning = host_pinning(replica, [0, 1], [0], True, "node1")
    assert (pinning.cpu_affinity, pinning.numa_node) == (None, None)
    assert pinning.note == ("planned CPUs 20-39, NUMA node 1: not applied, the GPUs are simulated and this host is "
                            "not the planned server")


# --- systemd quoting ----------------------------------------------------------------------------------

def test_exec_start_quotes_only_what_systemd_would_split_or_expand():
    argv = ["/opt/vllm/venvs/0.5.4-1a2b3c4d/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model",
            "/data/models/My Model/rev 1", "--chat-template", 'say "hi" 100%', "--x", "$HOME", "--y", "a\\b"]
    line = exec_start(argv)
    assert line.startswith("/opt/vllm/venvs/0.5.4-1a2b3c4d/bin/python -m vllm.entrypoints.openai.api_server --model ")
    assert '"/data/models/My Model/rev 1"' in line
    assert '"say \\"hi\\" 100%%"' in line
    assert '"$$HOME"' in line
    assert parse_exec_words(line) == argv


@given(st.lists(st.text(alphabet=string.printable.translate({ord(c): None for c in "\r\x0b\x0c"}), max_size=12),
                max_size=8))
def test_exec_start_round_trips_any_printable_argv(args):
    argv = ["/opt/vllm/venvs/0.5.4-1a2b3c4d/bin/python"] + args
    assert parse_exec_words(exec_start(argv)) == argv


def test_exec_start_needs_an_absolute_program():
    with pytest.raises(ReleaseError, match="absolute program path"):
        exec_start(["python", "-m", "vllm"])


def test_environment_assignments_are_quoted_and_names_checked():
    assert environment_assignment("CUDA_VISIBLE_DEVICES", "0,1,2,3") == '"CUDA_VISIBLE_DEVICES=0,1,2,3"'
    assert environment_assignment("X", 'a "b" 5%') == '"X=a \\"b\\" 5%%"'
    with pytest.raises(ReleaseError, match="not valid for systemd"):
        environment_assignment("BAD-NAME", "1")


# --- timing -------------------------------------------------------------------------------------------

def test_health_deadline_grows_with_the_weight_bytes():
    timing = StartTiming(base_seconds=120, load_bytes_per_second=200_000_000, per_rank_seconds=5)
    # The model of docs/field-report.md ('Model and parallelism choice'): 41 GB of FP16 weights at TP 8.
    assert health_deadline(41_000_000_000, 8, timing) == 120 + 205 + 40
    assert health_deadline(10_000_000, 4, timing) == 120 + 1 + 20
    with pytest.raises(ReleaseError, match="must be positive"):
        health_deadline(1, 1, StartTiming(load_bytes_per_second=0))


def test_start_limit_window_holds_every_failed_start():
    assert start_limit_interval(start_timeout=395, restart_seconds=10, burst=3) == 3 * 405 + 395


# --- the release --------------------------------------------------------------------------------------

def test_execstart_is_the_venv_python_then_the_plans_argv_exactly(plan):
    release = build_release(plan, VENV, HOST, StartTiming(), {"VLLM_NO_USAGE_STATS": "1"})
    assert [r["unit"] for r in release["replicas"]] == ["vllm-0.service", "vllm-1.service"]
    for planned, replica in zip(plan["replicas"], release["replicas"]):
        assert replica["argv"] == [f"{VENV}/bin/python", "-m", "vllm.entrypoints.openai.api_server"] + planned["args"]
        assert parse_exec_words(replica["exec_start"]) == replica["argv"]
        assert replica["port"] == planned["port"]
        assert replica["env"] == dict(planned["env"], VLLM_NO_USAGE_STATS="1")
        assert replica["cuda_visible_devices"] == planned["cuda_visible_devices"]
    assert release["args"] == plan["replicas"][0]["args"]
    assert release["model"] == {"path": "/data/models/tiny-chat/rev1", "content_id": "c0ffee",
                                "weight_bytes": plan["model"]["weight_bytes"]}
    assert [(r["cpu_affinity"], r["numa_node"]) for r in release["replicas"]] == [("0-19,40-59", 0),
                                                                                ("20-39,60-79", 1)]


def test_replica_timing_follows_the_model_size(plan):
    timing = StartTiming(base_seconds=100, load_bytes_per_second=1_000_000, per_rank_seconds=2, slack_seconds=30,
                         restart_seconds=5, start_limit_burst=2)
    replica = build_release(plan, VENV, HOST, timing)["replicas"][0]
    deadline = 100 + -(-plan["model"]["weight_bytes"] // 1_000_000) + 2 * 4
    assert (replica["health_deadline_seconds"], replica["start_timeout_seconds"],
            replica["start_limit_interval_seconds"]) == (deadline, deadline + 30, 2 * (deadline + 35) + deadline + 30)


def test_the_plans_environment_wins_over_the_roles(plan):
    release = build_release(plan, VENV, HOST, StartTiming(), {"CUDA_VISIBLE_DEVICES": "7", "HF_HUB_OFFLINE": "1"})
    assert release["replicas"][1]["env"]["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert '"HF_HUB_OFFLINE=1"' in release["replicas"][1]["environment"]


def test_lab_release_carries_the_pinning_as_a_note(lab_plan):
    release = build_release(lab_plan, VENV, HostView("node1", (0, 1), (0,)), StartTiming())
    assert [r["cpu_affinity"] for r in release["replicas"]] == [None, None]
    assert release["replicas"][1]["pinning_note"].startswith("planned CPUs 20-39,60-79, NUMA node 1: not applied")


def test_release_id_follows_venv_build_model_bytes_and_argv(plan):
    base = build_release(plan, VENV, HOST, StartTiming())
    assert base["id"] == release_id(base) and len(base["id"]) == 12
    assert build_release(plan, VENV, HOST, StartTiming(base_seconds=5))["id"] == base["id"]
    rebuilt = HostView(**dict(HOST.__dict__, venv_stamp="1800000000000000000"))
    assert build_release(plan, VENV, rebuilt, StartTiming())["id"] != base["id"]
    resynced = HostView(**dict(HOST.__dict__, model_content_id="beef"))
    assert build_release(plan, VENV, resynced, StartTiming())["id"] != base["id"]
    changed = copy.deepcopy(plan)
    changed["replicas"][0]["args"] = [a if a != "64" else "32" for a in changed["replicas"][0]["args"]]
    assert build_release(changed, VENV, HOST, StartTiming())["id"] != base["id"]


def test_a_partial_release_is_refused(plan):
    with pytest.raises(ReleaseError, match=r"the release for node1 has no 'replicas': pass the planner's release"):
        build_release({"vllm_version": "0.5.4", "entrypoint": ["-m", "x"]}, VENV, HOST, StartTiming())
    two_models = copy.deepcopy(plan)
    two_models["replicas"][1]["args"][1] = "/data/models/other/rev1"
    with pytest.raises(ReleaseError, match="the replicas load different models"):
        build_release(two_models, VENV, HOST, StartTiming())


# --- the record ---------------------------------------------------------------------------------------

def _release(name: str) -> dict:
    return {"id": name, "vllm_version": "0.5.4", "venv": f"/opt/vllm/venvs/{name}", "model": {"path": "/m"},
            "args": ["--port", "8000"], "replicas": [{"unit": "vllm-0.service"}, {"unit": "vllm-1.service"}]}


def test_a_new_node_has_an_empty_record():
    assert load_record(None, "/var/lib/revive/releases.json").as_dict() == \
        {"schema": 1, "current": None, "previous": None, "last_failure": None}


def test_a_damaged_record_is_named():
    with pytest.raises(ReleaseError, match=r"/r.json on node1 is not JSON .*restore it from a backup, or remove it"):
        load_record("{", "/r.json on node1")
    with pytest.raises(ReleaseError, match=r"is not a release record of schema 1 \(found 7\)"):
        load_record('{"schema": 7}', "/r.json")


def test_promote_moves_current_to_previous_once():
    first, changed = promote(Record(), _release("a"), "2026-01-01T00:00:00+00:00")
    assert changed and first.current["id"] == "a" and first.previous is None
    assert first.current["recorded_at"] == "2026-01-01T00:00:00+00:00"
    second, changed = promote(first, _release("b"), "2026-01-02T00:00:00+00:00")
    assert changed and (second.current["id"], second.previous["id"]) == ("b", "a")
    again, changed = promote(second, _release("b"), "2026-01-03T00:00:00+00:00")
    assert not changed and again.current["recorded_at"] == "2026-01-02T00:00:00+00:00"
    assert load_record(second.text(), "x").as_dict() == second.as_dict()


def test_a_start_failure_restores_the_current_release():
    record = Record(_release("a"), _release("z"))
    choice = rollback_target(record, "b")
    assert (choice.target["id"], choice.failed, choice.failed_was_current) == ("a", None, False)
    after = record_rollback(record, _release("b"), choice.target, True, "vllm-0.service failed", "t")
    assert (after.current["id"], after.previous["id"]) == ("a", "z")
    assert after.last_failure == {"release": {"id": "b", "vllm_version": "0.5.4", "venv": "/opt/vllm/venvs/b",
                                              "model": {"path": "/m"}, "args": ["--port", "8000"]},
                                  "message": "vllm-0.service failed", "at": "t", "restored": "a",
                                  "restored_serving": True}


def test_a_failed_warm_up_of_the_current_release_restores_the_previous_one():
    record = Record(_release("b"), _release("a"))
    choice = rollback_target(record, "")
    assert (choice.target["id"], choice.failed["id"], choice.failed_was_current) == ("a", "b", True)
    assert rollback_target(record, "b").target["id"] == "a"
    after = record_rollback(record, choice.failed, choice.target, True, "warm-up failed", "t")
    assert (after.current["id"], after.previous) == ("a", None)


def test_a_first_release_that_fails_has_nothing_to_restore():
    choice = rollback_target(Record(), "b")
    assert choice.target is None
    after = record_rollback(Record(), _release("b"), None, False, "failed", "t")
    assert (after.current, after.previous, after.last_failure["restored"]) == (None, None, None)


def test_stale_units_are_those_the_new_release_drops():
    one = dict(_release("b"), replicas=[{"unit": "vllm-0.service"}])
    assert stale_units(_release("a"), one) == ["vllm-1.service"]
    assert stale_units(None, one) == []


# --- venv pruning -------------------------------------------------------------------------------------

def test_prune_keeps_the_newest_and_never_current_or_previous():
    venvs = [(f"/v/{name}", mtime) for name, mtime in [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)]]
    assert venvs_to_prune(venvs, 2, []) == ["/v/a", "/v/b", "/v/c"]
    assert venvs_to_prune(venvs, 2, ["/v/a", "/v/b/", None]) == ["/v/c"]
    assert venvs_to_prune(venvs, 0, ["/v/e"]) == ["/v/a", "/v/b", "/v/c", "/v/d"]
    with pytest.raises(ReleaseError, match="keep must be >= 0"):
        venvs_to_prune(venvs, -1, [])


# --- journal excerpt ----------------------------------------------------------------------------------

def _entry(message, stamp, output=None, pid1=None):
    entry = {"MESSAGE": message, "__REALTIME_TIMESTAMP": str(stamp)}
    if output:
        entry["_SYSTEMD_INVOCATION_ID"] = output
    if pid1:
        entry["INVOCATION_ID"] = pid1
    return entry


# The old release stopping, the failed start of the new one, then systemd's automatic restart of it.
SWITCH_JOURNAL = [
    _entry("INFO api_server.py:339] vLLM API server version 0.5.4", 100, output="old"),
    _entry("INFO launcher.py:45] Gracefully stopping http server", 1000, output="old"),
    _entry("Stopped vllm-0.service - vLLM 0.5.4 vllm-0.", 1001, pid1="old"),
    _entry("Starting vllm-0.service - vLLM 0.5.4 vllm-0...", 1002, pid1="new"),
    _entry("INFO api_server.py:339] vLLM API server version 0.5.4", 1003, output="new"),
    _entry("ValueError: No available memory for the cache blocks.", 1004, output="new"),
    _entry([118, 97, 108, 117, 101, 32, 255], 1005, output="new"),
    _entry("vllm-wait-healthy: port 8000: /health did not answer 200 within the 36 s start deadline", 1040,
           output="new"),
    _entry("vllm-0.service: Failed with result 'exit-code'.", 1041, pid1="new"),
    _entry("Starting vllm-0.service - vLLM 0.5.4 vllm-0...", 1043, pid1="again"),
    _entry("INFO api_server.py:339] vLLM API server version 0.5.4", 1044, output="again"),
    _entry("vllm-0.service: Control process exited, code=killed, status=15/TERM", 1050, pid1="again"),
]


def test_journal_excerpt_after_a_switch_is_the_failed_start():
    assert journal_excerpt(SWITCH_JOURNAL, 10, since_usec=1000) == [
        "Starting vllm-0.service - vLLM 0.5.4 vllm-0...",
        "INFO api_server.py:339] vLLM API server version 0.5.4",
        "ValueError: No available memory for the cache blocks.", "value \ufffd",
        "vllm-wait-healthy: port 8000: /health did not answer 200 within the 36 s start deadline",
        "vllm-0.service: Failed with result 'exit-code'."]
    assert journal_excerpt(SWITCH_JOURNAL, 2, since_usec=1000) == [
        "vllm-wait-healthy: port 8000: /health did not answer 200 within the 36 s start deadline",
        "vllm-0.service: Failed with result 'exit-code'."]


def test_journal_excerpt_without_a_switch_is_the_last_run():
    assert journal_excerpt(SWITCH_JOURNAL, 10) == [
        "Starting vllm-0.service - vLLM 0.5.4 vllm-0...", "INFO api_server.py:339] vLLM API server version 0.5.4",
        "vllm-0.service: Control process exited, code=killed, status=15/TERM"]


def test_journal_excerpt_keeps_a_short_lived_process_s_line_that_lost_its_invocation_id():
    """An ExecStartPre= check that prints its reason and exits at once: journald may read its cgroup too late, and
    the line comes with the unit's name but no _SYSTEMD_INVOCATION_ID (make test, 2026-12-07). It belongs to the run
    whose time it falls in; a line without an id before or after that run does not."""
    reason = "revive-nvidia-uvm: /dev/nvidia-uvm is missing: the nvidia-uvm kernel module is not loaded"
    entries = [
        {"MESSAGE": "earlier, no id", "__REALTIME_TIMESTAMP": "900"},
        {"MESSAGE": "Starting vllm-1.service", "INVOCATION_ID": "a", "__REALTIME_TIMESTAMP": "1000"},
        {"MESSAGE": reason, "_SYSTEMD_UNIT": "vllm-1.service", "__REALTIME_TIMESTAMP": "1010"},
        {"MESSAGE": "vllm-1.service: Control process exited, code=exited, status=1/FAILURE", "INVOCATION_ID": "a",
         "__REALTIME_TIMESTAMP": "1020"},
        {"MESSAGE": "Starting vllm-1.service (again)", "INVOCATION_ID": "b", "__REALTIME_TIMESTAMP": "2000"},
        {"MESSAGE": "during the next run, no id", "__REALTIME_TIMESTAMP": "2010"},
    ]
    assert journal_excerpt(entries, 10, since_usec=950) == [
        "Starting vllm-1.service", reason, "vllm-1.service: Control process exited, code=exited, status=1/FAILURE"]
    assert journal_excerpt(entries, 10) == ["Starting vllm-1.service (again)", "during the next run, no id"]


def test_journal_excerpt_keeps_a_line_journald_tagged_with_the_restart_s_invocation():
    """The same check's line handled after Restart= began the next run carries that run's id (cgroup xattr read
    late; make test, 2026-12-07: the reason was missing from the failed start's excerpt). Runs are bounded by
    systemd's own "Starting" lines, so it stays with the start it came from."""
    reason = "revive-nvidia-uvm: /dev/nvidia-uvm is missing: the nvidia-uvm kernel module is not loaded"
    entries = [
        {"MESSAGE": "Starting vllm-1.service", "INVOCATION_ID": "a", "__REALTIME_TIMESTAMP": "1000"},
        {"MESSAGE": "vllm-1.service: Control process exited, code=exited, status=1/FAILURE", "INVOCATION_ID": "a",
         "__REALTIME_TIMESTAMP": "1005"},
        {"MESSAGE": reason, "_SYSTEMD_INVOCATION_ID": "b", "__REALTIME_TIMESTAMP": "1010"},
        {"MESSAGE": "vllm-1.service: Scheduled restart job, restart counter is at 1.", "INVOCATION_ID": "a",
         "__REALTIME_TIMESTAMP": "1500"},
        {"MESSAGE": "Starting vllm-1.service (restart)", "INVOCATION_ID": "b", "__REALTIME_TIMESTAMP": "2000"},
        {"MESSAGE": reason + " (restart)", "_SYSTEMD_INVOCATION_ID": "b", "__REALTIME_TIMESTAMP": "2010"},
    ]
    assert journal_excerpt(entries, 10, since_usec=950) == [
        "Starting vllm-1.service", "vllm-1.service: Control process exited, code=exited, status=1/FAILURE", reason,
        "vllm-1.service: Scheduled restart job, restart counter is at 1."]


def test_journal_excerpt_masks_secrets_and_works_without_invocation_ids():
    entries = [{"MESSAGE": "one"}, {"MESSAGE": "key is s3cr3t-key"}]
    assert journal_excerpt(entries, 5, redact=["s3cr3t-key", ""]) == ["one", "key is ********"]
    assert journal_excerpt(entries, 0) == []


# Which units a rollback quotes: the systemd_service results read before the failed units are stopped.
UNITS_TO_QUOTE = """
- id: a unit that did not come up
  states: [{name: vllm-0.service, status: {ActiveState: failed, NRestarts: "0"}},
           {name: vllm-1.service, status: {ActiveState: active, NRestarts: "0"}}]
  expected: [vllm-0.service]
- id: not active first, then active but restarted by systemd
  states: [{name: vllm-0.service, status: {ActiveState: active, NRestarts: "2"}},
           {name: vllm-1.service, status: {ActiveState: activating, NRestarts: "1"}}]
  expected: [vllm-1.service, vllm-0.service]
- id: all up and never restarted (a failed warm-up) - every unit
  states: [{name: vllm-0.service, status: {ActiveState: active, NRestarts: "0"}},
           {name: vllm-1.service, status: {ActiveState: active, NRestarts: "0"}}]
  expected: [vllm-0.service, vllm-1.service]
- id: a unit that could not be read is left out; an empty status counts as down
  states: [{name: vllm-0.service}, {name: vllm-1.service, status: {}}]
  expected: [vllm-1.service]
- id: nothing read - every unit
  states: [{name: vllm-0.service}, {name: vllm-1.service}]
  expected: [vllm-0.service, vllm-1.service]
"""


@pytest.mark.parametrize("case", [pytest.param(case, id=case["id"]) for case in yaml.safe_load(UNITS_TO_QUOTE)])
def test_units_a_rollback_quotes(case):
    assert units_to_quote(case["states"], ["vllm-0.service", "vllm-1.service"]) == case["expected"]


# --- serving groups (issue 16) ----------------------------------------------------------------------------
GROUP = {"name": "mixtral", "role": "worker", "stage": 1, "head": "node1", "members": [],
         "ray": {"address": "10.0.0.1:6379", "port": 6379, "node_ip_address": "10.0.0.2", "num_gpus": 8,
                 "expected_nodes": 2, "expected_gpus": 16, "env": {"VLLM_HOST_IP": "10.0.0.2"}}}


def test_a_group_worker_records_a_release_without_replicas_serving_the_groups_model(plan):
    worker = dict(plan, replicas=[], env={}, group=GROUP)
    release = build_release(worker, VENV, HOST, StartTiming())
    assert release["replicas"] == [] and release["group"] == GROUP
    assert release["model"]["path"] == "/data/models/tiny-chat/rev1" and release["args"] == plan["args"]
    moved = build_release(dict(worker, group=dict(GROUP, ray=dict(GROUP["ray"], address="10.0.0.9:6379"))), VENV,
                          HOST, StartTiming())
    assert moved["id"] != release["id"]
    with pytest.raises(ReleaseError, match="has no 'replicas'"):
        build_release(dict(plan, replicas=[], group=dict(GROUP, role="head")), VENV, HOST, StartTiming())
    with pytest.raises(ReleaseError, match=r"serving group 'mixtral', worker\) has no --model"):
        build_release(dict(worker, args=[]), VENV, HOST, StartTiming())


def test_a_release_outside_any_group_keeps_the_id_it_had_before_groups(plan):
    import hashlib
    base = build_release(plan, VENV, HOST, StartTiming())
    identity = {key: base[key] for key in ("vllm_version", "venv", "venv_stamp", "python", "model")}
    identity["replicas"] = [{key: r[key] for key in ("name", "port", "argv", "env", "cpu_affinity", "numa_node")}
                            for r in base["replicas"]]
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    assert "group" not in base and base["id"] == hashlib.sha256(canonical.encode()).hexdigest()[:12]
