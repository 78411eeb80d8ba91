"""The lab's fault tools that the fleet scenario's controller-kill and link-cut steps rely on (issue 17 §4;
docs/faults.md): molecule/resources/interrupt.py, which interrupts a running command the way a controller dies or
makes a fault under it, and the front-door sampler's count of how many times each node stopped serving and what it
held then (lab/loadgen/lbwatch.py left_serving, stopped, held)."""
from __future__ import annotations

import http.server
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INTERRUPT = REPO / "molecule" / "resources" / "interrupt.py"


def _load_lbwatch():
    spec = importlib.util.spec_from_file_location("lbwatch", REPO / "lab" / "loadgen" / "lbwatch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def interrupt(tmp_path, *args, command):
    done = subprocess.run([sys.executable, str(INTERRUPT), "--interval", "0.05", "--log", str(tmp_path / "run.log"),
                           *args, "--", *command], capture_output=True, text=True, timeout=60)
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else None, done.stderr


# A stand-in for a playbook: takes Ctrl-C as ansible-playbook does (exit 99) from its first line on, starts a child,
# then writes both pids (the condition the tests wait for) and sleeps.
CHILDREN = """
import os, signal, subprocess, sys, time
def interrupted(signum, frame):
    print("User interrupted execution", flush=True)
    child.terminate()
    sys.exit(99)
signal.signal(signal.SIGINT, interrupted)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(sys.argv[1] + ".tmp", "w") as out:
    out.write(f"{os.getpid()} {child.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""


def _pids(path: Path, deadline: float = 10.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if path.exists() and path.read_text().strip():
            return [int(pid) for pid in path.read_text().split()]
        time.sleep(0.02)
    raise AssertionError("the stand-in never started")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
        return stat.read().split()[2] != "Z"


def test_sigint_reaches_the_whole_group_when_the_command_condition_holds(tmp_path):
    pids = tmp_path / "pids"
    script = tmp_path / "standin.py"
    script.write_text(CHILDREN)
    status, account, _ = interrupt(tmp_path, "--signal", "INT", "--until-cmd", f"test -s {pids}",
                                   command=[sys.executable, str(script), str(pids)])
    assert status == 0, account
    assert account["rc"] == 99 and account["sigints"] == 1 and not account["ended_first"] and not account["timed_out"]
    assert account["seconds"] is not None
    assert "User interrupted execution" in (tmp_path / "run.log").read_text()
    time.sleep(0.2)
    assert not any(_alive(pid) for pid in _pids(pids))


def test_sigkill_kills_every_process_of_the_run_at_once(tmp_path):
    pids = tmp_path / "pids"
    script = tmp_path / "standin.py"
    script.write_text(CHILDREN)
    status, account, _ = interrupt(tmp_path, "--signal", "KILL", "--until-cmd", f"test -s {pids}",
                                   command=[sys.executable, str(script), str(pids)])
    assert status == 0 and account["rc"] == -9
    time.sleep(0.2)
    assert not any(_alive(pid) for pid in _pids(pids)), "a child of the killed run lives on"
    assert "User interrupted" not in (tmp_path / "run.log").read_text()


class _Metrics(http.server.BaseHTTPRequestHandler):
    """HAProxy's exporter, which lists every state of a server with 1 for the one it is in: UP for the first polls,
    MAINT from the fourth on (counted by the server, so the test does not race the machine's load)."""
    gets = 0

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).gets += 1
        up, maint = (1, 0) if self.gets <= 3 else (0, 1)
        body = (f'haproxy_server_status{{proxy="vllm",server="node2-vllm-0",state="UP"}} {up}\n'
                f'haproxy_server_status{{proxy="vllm",server="node2-vllm-0",state="MAINT"}} {maint}\n').encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_url_condition_waits_for_the_server_state_in_the_exporter(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, account, _ = interrupt(
            tmp_path, "--signal", "KILL", "--url", f"http://127.0.0.1:{server.server_port}/metrics",
            "--regex", 'server="node2-vllm-0",state="MAINT"} 1$', command=["sleep", "30"])
    finally:
        server.shutdown()
    # the three bodies with 'state="MAINT"} 0' did not match: the signal came on the fourth poll
    assert status == 0 and account["rc"] == -9 and _Metrics.gets == 4


def test_a_command_that_ends_before_the_condition_is_not_an_interruption(tmp_path):
    status, account, _ = interrupt(tmp_path, "--signal", "INT", "--until-cmd", "false", command=["true"])
    assert status == 3 and account["ended_first"] and account["rc"] == 0 and account["seconds"] is None


def test_a_condition_that_never_holds_times_out_and_kills(tmp_path):
    status, account, _ = interrupt(tmp_path, "--signal", "INT", "--timeout", "0.5", "--until-cmd", "false",
                                   command=["sleep", "30"])
    assert status == 4 and account["timed_out"] and account["rc"] == -9


def test_a_command_that_ignores_sigint_is_killed_after_the_grace(tmp_path):
    script = tmp_path / "deaf.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('x', flush=True)\n"
                      "time.sleep(30)\n")
    status, account, _ = interrupt(tmp_path, "--signal", "INT", "--grace", "0.5", "--until-cmd",
                                   f"grep -q x {tmp_path / 'run.log'}", command=[sys.executable, str(script)])
    assert status == 5 and account["rc"] == -9 and account["sigints"] == 1


# As ansible-playbook's main process when its SIGINT handler ran inside a finalizer: the handler puts the default
# action back and raises KeyboardInterrupt, which Python drops there, so the run goes on (stop 36's CI).
SWALLOWS_ONE = """
import signal, time
def swallowed(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    print("swallowed", flush=True)
signal.signal(signal.SIGINT, swallowed)
print("x", flush=True)
time.sleep(30)
"""


def test_a_ctrl_c_the_command_did_not_end_on_is_pressed_again(tmp_path):
    script = tmp_path / "swallows.py"
    script.write_text(SWALLOWS_ONE)
    started = time.monotonic()
    status, account, _ = interrupt(tmp_path, "--signal", "INT", "--again", "0.5", "--until-cmd",
                                   f"grep -q x {tmp_path / 'run.log'}", command=[sys.executable, str(script)])
    assert status == 0 and account["sigints"] == 2 and account["rc"] == -2, account
    assert "swallowed" in (tmp_path / "run.log").read_text()
    assert time.monotonic() - started < 20


def test_with_no_signal_the_fault_is_made_when_the_condition_holds_and_the_command_runs_to_its_end(tmp_path):
    started, fault = tmp_path / "started", tmp_path / "fault"
    # the stand-in says it started, then ends only after the fault was made: it waits for the fault's file
    command = ["sh", "-c", f"touch {started}; while [ ! -e {fault} ]; do sleep 0.05; done; echo after the fault; exit 2"]
    status, account, _ = interrupt(tmp_path, "--signal", "NONE", "--until-cmd", f"test -e {started}",
                                   "--then-cmd", f"touch {fault}", command=command)
    assert status == 0, account
    assert account["then_rc"] == 0 and account["rc"] == 2 and account["seconds"] is not None
    assert not account["ended_first"] and not account["timed_out"]
    assert "after the fault" in (tmp_path / "run.log").read_text()


def test_a_fault_command_that_fails_says_so_and_the_command_still_ends(tmp_path):
    status, account, _ = interrupt(tmp_path, "--signal", "NONE", "--until-cmd", "true", "--then-cmd", "exit 7",
                                   command=["sleep", "0.3"])
    assert status == 6 and account["then_rc"] == 7 and account["rc"] == 0


def test_with_no_signal_a_command_that_never_ends_is_killed_at_the_timeout(tmp_path):
    status, account, _ = interrupt(tmp_path, "--signal", "NONE", "--timeout", "0.8", "--until-cmd", "true",
                                   "--then-cmd", "true", command=["sleep", "30"])
    assert status == 4 and account["timed_out"] and account["rc"] == -9 and account["then_rc"] == 0


@pytest.mark.parametrize("args", [
    ["--signal", "NONE", "--until-cmd", "true"],                      # no fault to make
    ["--signal", "INT", "--until-cmd", "true", "--then-cmd", "true"],  # a fault with a signal
    ["--signal", "INT"],                                              # no condition
    ["--signal", "INT", "--url", "http://127.0.0.1:1/"],              # a URL without its regex
    ["--signal", "INT", "--until-cmd", "true", "--url", "http://x/", "--regex", "y"],  # both
    ["--signal", "TERM", "--until-cmd", "true"],                      # not a controller's death
])
def test_bad_arguments_are_refused(tmp_path, args):
    done = subprocess.run([sys.executable, str(INTERRUPT), "--log", str(tmp_path / "l"), *args, "--", "true"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "error" in done.stderr


LEFT_SERVING = [
    ([], {"node1": 0, "node2": 0}),
    ([{"serving_nodes": ["node1", "node2"]}], {"node1": 0, "node2": 0}),
    # node2 leaves, comes back, leaves again; node1 stays
    ([{"serving_nodes": ["node1", "node2"]}, {"serving_nodes": ["node1"]}, {"serving_nodes": ["node1"]},
      {"serving_nodes": ["node1", "node2"]}, {"serving_nodes": ["node1"]}], {"node1": 0, "node2": 2}),
    # a node that was never serving never left; both leave at once
    ([{"serving_nodes": ["node1"]}, {"serving_nodes": []}, {"serving_nodes": ["node1", "node2"]}],
     {"node1": 1, "node2": 0}),
]


@pytest.mark.parametrize("changes,expected", LEFT_SERVING)
def test_the_sampler_counts_each_time_a_node_stopped_serving(changes, expected):
    assert _load_lbwatch().left_serving(changes, ["node1", "node2"]) == expected


def test_the_sampler_keeps_what_a_node_held_in_the_last_sample_that_saw_it_serve():
    lbwatch = _load_lbwatch()

    class State:  # what list_servers gives: scur per server
        def __init__(self, scur):
            self.scur = scur

    nodes = {"node1": ["node1-vllm-0", "node1-vllm-1"], "node2": ["node2-vllm-0", "node2-vllm-1"]}
    servers = {"node1-vllm-0": State(1), "node1-vllm-1": State(0), "node2-vllm-0": State(2), "node2-vllm-1": State(3),
               "other-vllm-0": State(9)}
    assert lbwatch.held(nodes, servers) == {"node1": 1, "node2": 5}
    # node2 stops serving between the samples: the earlier sample's 5 requests are what it held
    assert lbwatch.stopped(nodes, ["node1", "node2"], ["node1"], {"node1": 1, "node2": 5}, 12.5) == {
        "node2": {"t": 12.5, "in_flight": 5}}
    assert lbwatch.stopped(nodes, ["node1"], ["node1", "node2"], {"node1": 1}, 13.0) == {}  # coming back is no stop
    assert lbwatch.stopped(nodes, ["node1", "node2"], [], {"node1": 1}, 14.0) == {
        "node1": {"t": 14.0, "in_flight": 1}, "node2": {"t": 14.0, "in_flight": 0}}
