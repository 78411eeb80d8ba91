#!/usr/bin/python3
"""Stop vLLM replicas the way systemd's default KillMode=control-group does: SIGTERM to every process of the unit
at once, so vLLM 0.5.4's engine and TP workers die with the API server and open streams are cut
(reference/lb-and-rolling.md §4.3-§4.4). With --wait-busy, each replica is stopped only once vLLM reports a request
running (its /metrics gauge), so a stop "while it serves" is sure to meet one. Prints what it did as JSON.

    stop_replicas.py [--wait-busy] UNIT:PORT [UNIT:PORT ...]
"""
import json
import subprocess
import sys
import time
import urllib.request

GAUGE = "vllm:num_requests_running"


def running(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(GAUGE))


def main(argv):
    wait_busy = "--wait-busy" in argv
    done = []
    for target in [a for a in argv if a != "--wait-busy"]:
        unit, port = target.rsplit(":", 1)
        busy = running(port)
        deadline = time.monotonic() + 60
        while wait_busy and busy == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
            busy = running(port)
        subprocess.run(["systemctl", "kill", "--kill-whom=all", "--signal=SIGTERM", unit], check=True)
        while subprocess.run(["systemctl", "is-active", "--quiet", unit]).returncode == 0:
            time.sleep(0.1)
        done.append({"unit": unit, "running_at_stop": busy})
    print(json.dumps(done))
    return 0 if not wait_busy or all(d["running_at_stop"] > 0 for d in done) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
