"""Benchmark (issue 17 §6): `site.yml` from a fresh lab on 1, 2, 4 and 8 GPU nodes, a second `site.yml` against the
first, and `rolling.yml` per node.

Each size gets a lab of its own (`bin/lab --state-dir`, so a `make demo` lab is untouched): N GPU nodes
(v100-pcie-8x, the lab's default plan of two TP-4 replicas each) + model-store, bench1, lb1, monitor1. Ansible runs
with forks = every host at once (N + 4, at least 5): what runs on every node runs in parallel, the hand-over too
(each node warms up and goes READY in the front doors on its own). What grows with N is the controller's work per
host and, in the lab only, the nodes' own work: the lab's hosts share this machine's CPUs. Printed per size:

- site.yml, first run from the fresh lab (goal: 8 nodes in <= 2x the time of 1);
- site.yml again: its time against the first (goal <= 25 %) and its changed tasks (must be 0);
- rolling.yml with a changed plan (--max-num-seqs 64: a new release on every node), total and per node.
- for each playbook run, where the CPU went (bench/cpu_use.py): the machine's busy share, the controller's CPU
  seconds, the GPU nodes' (in all and per node) and the other lab hosts'. A run whose busy share is near 100 % was
  bound by this machine's CPUs; a per-node figure that stays flat from 1 to N nodes is work real servers do on
  their own CPUs.

REVIVE_FLEET_SIZES="1,2" picks other sizes. Needs the lab's wheelhouse (`bin/lab wheelhouse`, once) and, at 8 nodes,
about 12 GB of memory and 20 GB of disk for the labs' hosts. What is simulated: the GPUs (fake NVML) and vLLM (the
twin). What is real: systemd, sshd, rsync, HAProxy, Prometheus, the roles.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from cpu_use import sample, use
from logged_run import run_logged, tail

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "lab"))
from labctl import state as lab_state  # noqa: E402
LAB = [sys.executable, str(REPO / "bin/lab")]
SIZES = [int(n) for n in os.environ.get("REVIVE_FLEET_SIZES", "1,2,4,8").split(",")]
ROLLED = {"revive_plan_overrides": {"tensor_parallel_size": 4, "max_num_seqs": 64}}


def changed(log: Path) -> dict:
    """Changed tasks per host from the JSON callback's stats (the log holds only its JSON)."""
    text = log.read_text(errors="replace")
    stats = json.loads(text[text.index("{\n"):])["stats"]
    return {host: counts.get("changed", 0) for host, counts in stats.items()}


def one_fleet(nodes: int, tmp: Path) -> dict:
    state = tmp / f"lab{nodes}"
    lab = [*LAB, "--state-dir", str(state)]
    forks = max(5, nodes + 4)
    playbook = ["ansible-playbook", "-i", "inventory/lab", "-i", str(state / "hosts.yml"), "--forks", str(forks)]
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0")
    quiet = dict(env, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    times = {"forks": forks, "cpu": {}}
    cgroups = {}
    try:
        for name, argv, environment in [
            ("lab up", [*lab, "up", "--nodes", str(nodes)], env),
            ("seed", [*lab, "seed-model"], env),
            ("site.yml", [*playbook, "site.yml"], env),
            ("site.yml again", [*playbook, "site.yml"], quiet),
            ("rolling.yml", [*playbook, "playbooks/rolling.yml", "-e", json.dumps(ROLLED)], env),
        ]:
            log = tmp / f"{nodes}-{name.replace(' ', '-')}.log"
            before = sample(cgroups) if cgroups and ".yml" in name else None
            rc, times[name] = run_logged(argv, log, environment)
            assert rc == 0, f"{nodes} node(s): {name} failed:\n{tail(log)}"
            if before is not None:
                times["cpu"][name] = use(before, sample(cgroups), times[name])
            elif name == "lab up":
                cgroups = {host.name: host.cgroups for host in lab_state.load(state).hosts}
            if name == "site.yml again":
                times["changed again"] = changed(log)
    finally:
        subprocess.run([*lab, "down"], cwd=REPO, capture_output=True)
    return times


def test_site_yml_scales_with_the_fleet(tmp_path):
    rc, _ = run_logged([*LAB, "wheelhouse"], tmp_path / "wheelhouse.log")
    assert rc == 0, tail(tmp_path / "wheelhouse.log")
    results = {}
    for nodes in SIZES:
        results[nodes] = one_fleet(nodes, tmp_path)
        r = results[nodes]
        print(f"\n{nodes} GPU node(s), forks {r['forks']}: site.yml {r['site.yml']:.0f} s; again "
              f"{r['site.yml again']:.0f} s ({100 * r['site.yml again'] / r['site.yml']:.0f} %, changed "
              f"{sum(r['changed again'].values())}); rolling.yml {r['rolling.yml']:.0f} s "
              f"({r['rolling.yml'] / nodes:.0f} s per node); lab up {r['lab up']:.0f} s", flush=True)
        for name, cpu in r["cpu"].items():
            print(f"  {name}: {cpu.summary(f'node{i}' for i in range(1, nodes + 1))}", flush=True)
    print(f"\nfleet scale on {os.cpu_count()} CPUs (simulated GPUs and vLLM; real systemd, sshd, rsync, HAProxy):")
    print(f"  {'nodes':>5} {'site.yml':>9} {'vs 1 node':>9} {'again':>7} {'again %':>8} {'changed':>8} "
          f"{'roll/node':>10}")
    base = results[min(results)]["site.yml"]
    for nodes, r in results.items():
        print(f"  {nodes:>5} {r['site.yml']:>8.0f}s {r['site.yml'] / base:>8.2f}x {r['site.yml again']:>6.0f}s "
              f"{100 * r['site.yml again'] / r['site.yml']:>7.0f}% {sum(r['changed again'].values()):>8} "
              f"{r['rolling.yml'] / nodes:>9.0f}s")
    largest = max(results)
    ratio = results[largest]["site.yml"] / base
    print(f"  goal: {largest} nodes in <= 2x the time of {min(results)}: {ratio:.2f}x "
          f"{'met' if ratio <= 2 else 'MISSED'}")
    again = max(r["site.yml again"] / r["site.yml"] for r in results.values())
    print(f"  goal: a second site.yml <= 25 % of the first: worst {100 * again:.0f} % "
          f"{'met' if again <= 0.25 else 'MISSED'}")
    for nodes, r in results.items():
        assert sum(r["changed again"].values()) == 0, (nodes, r["changed again"])
