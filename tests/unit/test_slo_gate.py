"""The hand-over's SLO gate (module_utils/revive_slo_gate.py, library/vllm_slo_gate.py): its concurrency from the
front door's limits, refusals before any request, and real gates against the lab twin on loopback - PASS, FAIL on
the SLO, FAIL on a replica restart seen by the node's sampler, INCONCLUSIVE with what to change - and the module
through Ansible (documentation, check mode, a bad input, a run)."""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from test_warmup_module import adhoc, doc

from ansible.module_utils.revive_bench import sampler
from ansible.module_utils.revive_frontdoor import backend_servers
from ansible.module_utils.revive_slo_gate import GateError, GateSpec, gate_concurrency, run_gate

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))

import harness  # noqa: E402

MODEL = "chat-7b"
PROMPTS = (REPO / "data" / "bench" / "prompts.jsonl").read_bytes()
TIME_SCALE = 0.2
FLAGS = ["--dtype", "float16", "--max-model-len", "4096"]


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """Two twins of a 7B on one V100 each at a time scale of 0.2 (one simulated second lasts 0.2 s: requests long
    enough beside the client's own overhead on a busy 2-core machine), and the node's release record naming them
    (what the sampler and the gate read)."""
    tmp = tmp_path_factory.mktemp("gate")
    model = harness.write_model("llama-2-7b-chat", tmp / "chat-7b-fp16")
    servers = [harness.start(model, FLAGS, harness.twin_env(tmp, time_scale=TIME_SCALE), tmp / f"twin{i}.log",
                             served_name=MODEL) for i in range(2)]
    record = tmp / "releases.json"
    record.write_text(json.dumps({"current": {
        "id": "abc123def456", "vllm_version": "0.5.4", "simulated": True, "model": MODEL,
        "replicas": [{"name": f"vllm-{i}", "unit": f"vllm-{i}.service", "port": s.port, "gpus": [str(i)],
                      "tensor_parallel_size": 1, "argv": ["--served-model-name", MODEL]}
                     for i, s in enumerate(servers)]}}))
    yield {"record": str(record), "servers": servers}
    for server in servers:
        server.stop()


class Units(sampler.Probes):
    """The node's reads with the units faked (no systemd here): /health and /metrics are the twins' own.
    `restart_after` seconds after the first sample (inside the measured window), vllm-1's NRestarts goes up and its
    MainPID changes, as after a kill that systemd restarted."""

    def __init__(self, restart_after=None):
        super().__init__()
        self.first, self.restart_after = None, restart_after

    def open_nvml(self):
        self.nvml_note = "GPUs not sampled: the test has no NVML"

    def units(self, units):
        now = time.monotonic()
        self.first = self.first or now
        restarted = self.restart_after is not None and now - self.first > self.restart_after
        blocks = []
        for unit in units:
            again = restarted and unit == "vllm-1.service"
            blocks.append(f"Id={unit}\nNRestarts={1 if again else 0}\nActiveState=active\nSubState=running\n"
                          f"MainPID={200 if again else 100}")
        return sampler.parse_systemctl_show("\n\n".join(blocks))      # what `systemctl show` prints

    def journal(self, units, since, until):
        return []


def spec(twins, **changes) -> GateSpec:
    values = dict(node="node1", model=MODEL, concurrency={"vllm-0": 4, "vllm-1": 4}, prompts=PROMPTS,
                  record_path=twins["record"], duration_s=5.0, warmup_s=0.5, max_tokens=24,
                  sample_interval_s=0.2, max_dispatch_lag_p99_s=0.25)
    values.update(changes)
    return GateSpec(**values)


def with_probes(probes):
    return lambda *args: sampler.run(*args, probes=probes)


def test_the_gate_concurrency_is_the_front_doors_limit_per_replica_or_the_operators():
    release = {"vllm_version": "0.5.4", "settings": {"max_num_seqs": 64},
               "replicas": [{"name": "vllm-0", "port": 8000, "streams": 32, "args": []},
                            {"name": "vllm-1", "port": 8001, "streams": 24, "args": []}]}
    servers = backend_servers([{"name": "node1", "release": release}, {"name": "node10", "release": release}])
    both = ["vllm-0", "vllm-1"]
    assert gate_concurrency(servers, "node1", both) == {"vllm-0": 32, "vllm-1": 24}
    assert gate_concurrency(servers, "node1", both, 12) == {"vllm-0": 12, "vllm-1": 12}
    assert gate_concurrency(backend_servers([{"name": "node1", "release": release}], 200), "node1", both) == {
        "vllm-0": 64, "vllm-1": 64}                       # never above --max-num-seqs, as the front door
    # a restored release with a replica the plan does not have: the node's smallest limit
    assert gate_concurrency(servers, "node1", ["vllm-0", "vllm-2"]) == {"vllm-0": 32, "vllm-2": 24}
    with pytest.raises(GateError, match="node2: the front door has no server of this node .*set "
                                        "handover_slo_gate_concurrency"):
        gate_concurrency(servers, "node2", both)
    with pytest.raises(GateError, match="handover_slo_gate_concurrency -1 is negative"):
        gate_concurrency(servers, "node1", both, -1)
    with pytest.raises(GateError, match="handover_slo_gate_concurrency 'many' is not an integer"):
        gate_concurrency(servers, "node1", both, "many")


@pytest.mark.parametrize("changes, words", [
    ({"duration_s": 0}, "duration must be above 0 (got 0)"),
    ({"warmup_s": -1}, "warmup must be 0 or more"),
    ({"kind": "embeddings"}, "kind must be one of completions, chat"),
    ({"concurrency": {}}, "no replica to bench"),
    ({"concurrency": {"vllm-0": 0, "vllm-1": 4}}, "concurrency per replica must be 1 or more (got {'vllm-0': 0})"),
    ({"max_gpu_imbalance": 1.5}, "max_gpu_imbalance is a share in (0, 1]"),
    ({"model": ""}, "model (the served model name) is empty"),
])
def test_bad_settings_are_refused_before_any_request(changes, words):
    values = dict(node="node1", model=MODEL, concurrency={"vllm-0": 4}, prompts=PROMPTS)
    values.update(changes)
    with pytest.raises(GateError, match="the SLO gate's settings: .*" + re.escape(words)):
        run_gate(GateSpec(**values), bench=pytest.fail)


def test_replicas_the_record_does_not_name_or_forgets_are_refused(twins, tmp_path):
    with pytest.raises(GateError, match=r"concurrency names \['vllm-7'\], which the current release abc123def456"):
        run_gate(spec(twins, concurrency={"vllm-0": 4, "vllm-1": 4, "vllm-7": 4}), bench=pytest.fail)
    with pytest.raises(GateError, match=r"no concurrency for \['vllm-1'\] of release abc123def456: every replica"):
        run_gate(spec(twins, concurrency={"vllm-0": 4}), bench=pytest.fail)
    with pytest.raises(GateError, match="cannot read the release record .*provision the node"):
        run_gate(spec(twins, record_path=str(tmp_path / "none.json")), bench=pytest.fail)
    with pytest.raises(GateError, match="the SLO gate's prompts: .*bundled:1: not JSON"):
        run_gate(spec(twins, prompts=b"not json\n"), bench=pytest.fail)


def test_a_node_that_holds_the_slo_passes_with_every_replica_benchmarked_and_a_report(twins, tmp_path):
    outcome = run_gate(spec(twins, report_dir=str(tmp_path / "gate")), sample=with_probes(Units()))
    assert outcome.passed and outcome.verdict == "PASS", outcome.message
    level = outcome.summary["levels"][0]
    assert level["concurrency"] == outcome.concurrency == 8
    ports = [server.port for server in twins["servers"]]
    assert sorted(level["replicas"]) == sorted(f"http://127.0.0.1:{port}" for port in ports)
    assert {r["node"] for r in level["replicas"].values()} == {"node1"}        # loopback URLs are node1's
    assert {r["verdict"]["verdict"] for r in level["replicas"].values()} == {"PASS"}
    assert level["node"]["restarts"] == 0 and level["node"]["health_failures"] == 0
    assert outcome.summary["simulation"]["time_scale"] == TIME_SCALE
    assert outcome.message.startswith("node1: SLO gate PASS for release abc123def456 at 8 in flight over 2 "
                                      "replica(s): P95 E2E ")
    assert f"report {tmp_path / 'gate'}" in outcome.message
    names = sorted(p.name for p in (tmp_path / "gate").iterdir())
    assert names == ["levels.csv", "report.md", "requests.jsonl", "samples.jsonl", "stop", "summary.json"]
    written = json.loads((tmp_path / "gate" / "summary.json").read_text())
    assert written["levels"][0]["verdict"]["verdict"] == "PASS"
    assert written["provenance"]["command"].startswith("vllm_slo_gate on node1: release abc123def456, 8 in flight "
                                                       "(vllm-0 4, vllm-1 4)")


def test_a_node_over_the_slo_fails_naming_the_p95(twins):
    outcome = run_gate(spec(twins, slo_e2e_p95_s=0.2), sample=with_probes(Units()))
    assert not outcome.passed and outcome.verdict == "FAIL"
    assert "over the SLO" in outcome.message, outcome.message
    assert re.search(r"P95 E2E [0-9.]+ s \(lower bound [0-9.]+ s, upper bound [0-9.]+ s\) against 0.2 s",
                     outcome.message), outcome.message


def test_a_replica_restart_during_the_gate_fails_it_whatever_the_latencies(twins):
    outcome = run_gate(spec(twins), sample=with_probes(Units(restart_after=2.5)))
    assert not outcome.passed and outcome.verdict == "FAIL"
    level = outcome.summary["levels"][0]
    assert level["node"]["restarts"] >= 1
    assert "restart" in outcome.message and "vllm-1" in outcome.message, outcome.message
    port0, port1 = (server.port for server in twins["servers"])
    assert level["replicas"][f"http://127.0.0.1:{port1}"]["verdict"]["verdict"] == "FAIL"
    assert level["replicas"][f"http://127.0.0.1:{port0}"]["verdict"]["verdict"] == "PASS"


def test_too_short_a_gate_is_inconclusive_and_says_what_to_raise(twins):
    outcome = run_gate(spec(twins, duration_s=1.0), sample=with_probes(Units()))
    assert not outcome.passed and outcome.verdict == "INCONCLUSIVE", outcome.message
    assert "too few completions" in outcome.message
    assert "raise handover_slo_gate_duration_s" in outcome.message


def test_vllm_slo_gate_through_ansible(repo, twins, tmp_path):
    text = doc(repo, "vllm_slo_gate")
    assert "Only PASS passes" in text and "concurrency" in text
    args = {"node": "node1", "model": MODEL, "concurrency": {"vllm-0": 2, "vllm-1": 2},
            "prompts": PROMPTS.decode(), "record_path": twins["record"], "duration": 6, "warmup": 0.5,
            "max_tokens": 24, "sample_interval": 0.3, "max_dispatch_lag_p99": 0.25,
            "report_dir": str(tmp_path / "report")}
    checked = adhoc(repo, "vllm_slo_gate", args, "--check")
    assert checked["changed"] is False and checked["verdict"] == "" and checked["concurrency"] == 4
    assert checked["msg"].startswith("check mode: node1: nothing sent; would run the SLO gate at 4 in flight")
    assert not (tmp_path / "report").exists()
    refused = adhoc(repo, "vllm_slo_gate", dict(args, concurrency={"vllm-0": "two"}))
    assert refused["failed"] is True and "every value must be an integer" in refused["msg"]
    done = adhoc(repo, "vllm_slo_gate", args)
    # No systemd units by these names here: the sampler sees them inactive with no restarts, which the gate accepts.
    assert done.get("failed") is not True, done["msg"]
    assert done["passed"] is True and done["verdict"] == "PASS" and done["changed"] is True
    assert done["level"]["stats"]["completed"] > 0 and done["simulation"]["time_scale"] == TIME_SCALE
    assert (tmp_path / "report" / "summary.json").exists()
