#!/usr/bin/python3
"""Stop vLLM replicas the way systemd's default KillMode=control-group does: SIGTERM to every process of the unit
at once, so vLLM's engine and TP workers die with the API server and open streams end unfinished
(docs/facts/lb-and-rolling.md §4.3-§4.4). With --wait-busy, each replica is stopped only once vLLM reports a request
running (its /metrics gauge), so a stop "while it serves" is sure to meet one: the signals go straight to the
processes of the unit's cgroup (what systemd's control-group kill does) within a millisecond of the gauge's answer,
not through a systemctl round trip in which a short answer could end. Prints what it did as JSON.

    stop_replicas.py [--wait-busy] UNIT=BASE_URL [UNIT=BASE_URL ...]

BASE_URL is where the replica listens (http://ADDRESS:PORT: replicas bind the node's serving address, not loopback).
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

GAUGE = "vllm:num_requests_running"
# Where the unit's cgroup lists its processes: cgroup v2, or the hybrid layout's unified / name=systemd trees.
CGROUP_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd")


def running(base_url):
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(GAUGE))


def unit_processes(cgroup):
    """Every process of the cgroup and its children, from the first hierarchy that has it."""
    for root in CGROUP_ROOTS:
        top = root + cgroup
        if os.path.isfile(os.path.join(top, "cgroup.procs")):
            pids = []
            for directory, _, files in os.walk(top):
                if "cgroup.procs" in files:
                    with open(os.path.join(directory, "cgroup.procs"), encoding="ascii") as procs:
                        pids += [int(pid) for pid in procs.read().split()]
            return pids
    raise SystemExit(f"no cgroup.procs for {cgroup} under {', '.join(CGROUP_ROOTS)}")


def kill_all(cgroup):
    pids = unit_processes(cgroup)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    return pids


def main(argv):
    wait_busy = "--wait-busy" in argv
    done = []
    for target in [a for a in argv if a != "--wait-busy"]:
        unit, base_url = target.split("=", 1)
        cgroup = subprocess.run(["systemctl", "show", "--property=ControlGroup", "--value", unit], check=True,
                                capture_output=True, text=True).stdout.strip()
        if not cgroup:
            raise SystemExit(f"{unit} has no cgroup: is it running?")
        busy = running(base_url)
        deadline = time.monotonic() + 60
        while wait_busy and busy == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
            busy = running(base_url)
        pids = kill_all(cgroup)
        while subprocess.run(["systemctl", "is-active", "--quiet", unit]).returncode == 0:
            time.sleep(0.1)
        done.append({"unit": unit, "running_at_stop": busy, "signalled": len(pids)})
    print(json.dumps(done))
    return 0 if not wait_busy or all(d["running_at_stop"] > 0 for d in done) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
