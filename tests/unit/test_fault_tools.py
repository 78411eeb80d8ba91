"""The lab's fault tools that the fleet scenario's controller-kill steps rely on (issue 17 §4; docs/faults.md):
molecule/resources/interrupt.py, which interrupts a running command the way a controller dies, and the front-door
sampler's count of how many times each node stopped serving (lab/loadgen/lbwatch.py left_serving)."""
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


# A stand-in for a playbook: says it started, traps nothing, writes its children's pids, and sleeps.
CHILDREN = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(sys.argv[1], "w") as out:
    out.write(f"{os.getpid()} {child.pid}")
print("started", flush=True)
try:
    time.sleep(60)
except KeyboardInterrupt:
    print("User interrupted execution", flush=True)
    child.terminate()
    sys.exit(99)
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
    pids, flag = tmp_path / "pids", tmp_path / "flag"
    script = tmp_path / "standin.py"
    script.write_text(CHILDREN)
    threading.Timer(0.5, flag.touch).start()
    status, account, _ = interrupt(tmp_path, "--signal", "INT", "--until-cmd", f"test -e {flag}",
                                   command=[sys.executable, str(script), str(pids)])
    assert status == 0, account
    assert account["rc"] == 99 and not account["ended_first"] and not account["timed_out"]
    assert account["seconds"] >= 0.4
    assert "User interrupted execution" in (tmp_path / "run.log").read_text()
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
    body = b""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_the_url_condition_waits_for_the_server_state_in_the_exporter(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # HAProxy's exporter lists every state of a server, 1 for the one it is in: the regex must name the value.
    _Metrics.body = (b'haproxy_server_status{proxy="vllm",server="node2-vllm-0",state="UP"} 1\n'
                     b'haproxy_server_status{proxy="vllm",server="node2-vllm-0",state="MAINT"} 0\n')

    def maint():
        _Metrics.body = (b'haproxy_server_status{proxy="vllm",server="node2-vllm-0",state="UP"} 0\n'
                         b'haproxy_server_status{proxy="vllm",server="node2-vllm-0",state="MAINT"} 1\n')
    threading.Timer(0.6, maint).start()
    try:
        status, account, _ = interrupt(
            tmp_path, "--signal", "KILL", "--url", f"http://127.0.0.1:{server.server_port}/metrics",
            "--regex", 'server="node2-vllm-0",state="MAINT"} 1$', command=["sleep", "30"])
    finally:
        server.shutdown()
    assert status == 0 and account["rc"] == -9 and account["seconds"] >= 0.5


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
    assert status == 5 and account["rc"] == -9


@pytest.mark.parametrize("args", [
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
