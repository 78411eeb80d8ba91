#!/usr/bin/python3
"""Sample the front door's servers during a roll: how many GPU nodes serve at every moment (lab tooling).

Runs on the LB host with the system python3 and `revive_haproxy.py` (module_utils/revive_haproxy.py) beside it.
Every `--interval` seconds it reads the backend's servers through the runtime API; a node serves while at least
one of its servers takes new requests (READY and not DOWN). Until `--stop-file` exists; then it writes the
minimum, the samples taken, every change of state, how many times each node stopped serving and, for each time,
how many requests its servers held in the last sample that still saw it serve (`stops`: a drained node's finish,
a lost node's are cut) as JSON.

    lbwatch.py --nodes '{"node1": ["node1-vllm-0", "node1-vllm-1"], ...}' --stop-file /run/lbwatch.stop \
               --out /var/tmp/lbwatch.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List

# Deployed: the module_utils file lies beside this script; in the repository it is ../../module_utils.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from revive_haproxy import HAProxyError, list_servers, socket_sender  # noqa: E402


def serving_nodes(nodes: Dict[str, List[str]], serving: Dict[str, bool]) -> List[str]:
    return sorted(node for node, servers in nodes.items() if any(serving.get(name, False) for name in servers))


def left_serving(changes: List[dict], nodes: List[str]) -> Dict[str, int]:
    """How many times each node stopped serving (was serving in one change and not in the next)."""
    counts = {node: 0 for node in nodes}
    before: List[str] = []
    for change in changes:
        for node in before:
            if node not in change["serving_nodes"]:
                counts[node] += 1
        before = change["serving_nodes"]
    return counts


def stopped(nodes: Dict[str, List[str]], before: List[str], now: List[str], in_flight: Dict[str, int],
            t: float) -> Dict[str, dict]:
    """{node: {t, in_flight}} for each node serving in the sample `before` and not in `now`; `in_flight` is the
    requests (scur) its servers held in that earlier sample."""
    return {node: {"t": t, "in_flight": in_flight.get(node, 0)} for node in before if node in nodes and node not in now}


def held(nodes: Dict[str, List[str]], servers: dict) -> Dict[str, int]:
    """Requests in flight (scur) on each node's servers."""
    return {node: sum(servers[name].scur for name in names if name in servers) for node, names in nodes.items()}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", default="/run/haproxy/admin.sock")
    parser.add_argument("--backend", default="vllm")
    parser.add_argument("--nodes", required=True, help="JSON: node -> its server names")
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    nodes: Dict[str, List[str]] = json.loads(args.nodes)
    send = socket_sender(args.socket)
    started = time.time()
    samples = 0
    errors: List[str] = []
    minimum = len(nodes)
    changes: List[dict] = []
    last = None
    stops: Dict[str, List[dict]] = {node: [] for node in sorted(nodes)}
    serving_before: List[str] = []
    in_flight_before: Dict[str, int] = {}
    while not os.path.exists(args.stop_file):
        try:
            servers = list_servers(send, args.backend)
        except HAProxyError as error:
            errors.append(f"{round(time.time() - started, 2)}: {error}")
            time.sleep(args.interval)
            continue
        samples += 1
        serving = {name: state.serving() for name, state in servers.items()}
        up = serving_nodes(nodes, serving)
        minimum = min(minimum, len(up))
        for node, event in stopped(nodes, serving_before, up, in_flight_before,
                                   round(time.time() - started, 2)).items():
            stops[node].append(event)
        serving_before, in_flight_before = up, held(nodes, servers)
        view = {name: f"{state.mode}/{state.status}" for name, state in sorted(servers.items())}
        if view != last:
            changes.append({"t": round(time.time() - started, 2), "serving_nodes": up, "servers": view})
            last = view
        time.sleep(args.interval)
    summary = {"samples": samples, "duration_s": round(time.time() - started, 2), "min_serving_nodes": minimum,
               "nodes": sorted(nodes),
               "left_serving": left_serving(changes, sorted(nodes)), "stops": stops, "changes": changes,
               "errors": errors[:20]}
    temporary = args.out + ".tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump(summary, out, indent=1)
    os.replace(temporary, args.out)
    print(json.dumps({k: summary[k] for k in ("samples", "min_serving_nodes")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
