"""Benchmark: role model_sync against a plain `rsync -a` of the same model over the same link, and resume.

Issue 6 targets: syncing a generated multi-GiB FP16 model from the model-store host to a node with the role
takes <= 1.3x the time of a plain `rsync -a` of the same files over the same link (same ssh options, same key),
verification included; a transfer killed midway (SIGKILL to rsync) and resumed moves <= 110 % of the remainder.

A lab of its own (1 node + model-store; `bin/lab --state-dir`), so a running `make demo` lab is untouched.
The model: REVIVE_BENCH_MODEL_GIB (default 8) GiB of random FP16 in 1 GiB shards, written on the model-store
host (random so rsync cannot match blocks). Rounds alternate plain rsync and the role, each into a fresh
directory; medians are compared. The role's time is the whole `ansible-playbook` run (start-up, preflight,
access, pull with hashing as files arrive, verification, promotion with fsync); the manifest is made once
beforehand, as it is kept beside the model at the source. Also printed: the data path alone (the pull task,
which hashes files as they arrive, plus promotion), i.e. the role without Ansible's fixed per-task cost.
"""
from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bin"))
from revive_cli import use_module_utils  # noqa: E402

use_module_utils()
from ansible.module_utils.revive_sync.rsync import RsyncSource, ssh_command  # noqa: E402

MODEL_GIB = int(os.environ.get("REVIVE_BENCH_MODEL_GIB", "8"))
ROUNDS = int(os.environ.get("REVIVE_BENCH_ROUNDS", "2"))
SOURCE = "/srv/models/bench/rev1"
TIME_TARGET = 1.3
RESUME_TARGET = 1.10

# Runs on the model-store host: config.json plus shards with a real safetensors header and random F16 data.
MAKE_MODEL = r"""
import json, os, struct, sys
dest, gib = sys.argv[1], int(sys.argv[2])
os.makedirs(dest, exist_ok=True)
with open(os.path.join(dest, "config.json"), "w") as f:
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float16"}, f)
shard = 1 << 30
for i in range(gib):
    name = f"model-{i + 1:05d}-of-{gib:05d}.safetensors"
    values = (shard - 4096) // 2
    header = json.dumps({"__metadata__": {"format": "pt"},
                         f"layers.{i}.weight": {"dtype": "F16", "shape": [values], "data_offsets": [0, values * 2]}},
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with open(os.path.join(dest, name), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        left = values * 2
        while left:
            chunk = os.urandom(min(left, 64 << 20))
            f.write(chunk)
            left -= len(chunk)
"""


class Lab:
    def __init__(self, state_dir: Path):
        self.state_dir = state_dir
        self.lab = [sys.executable, str(REPO / "bin/lab"), "--state-dir", str(state_dir)]

    def up(self) -> None:
        subprocess.run(self.lab + ["up", "--nodes", "1", "--support-hosts", "model-store"], check=True,
                       capture_output=True, text=True)
        self.status = json.loads(subprocess.run(self.lab + ["status", "--json"], check=True, capture_output=True,
                                                text=True).stdout)

    def down(self) -> None:
        subprocess.run(self.lab + ["down"], capture_output=True)

    def ssh(self, host: str, command: str, stdin: str = "", check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-F", self.status["ssh_config"], host, command], input=stdin, text=True,
                              capture_output=True, check=check)

    def address(self, host: str) -> str:
        return next(h["address"] for h in self.status["hosts"] if h["name"] == host)


def playbook(path: Path, revision: str, **extra) -> Path:
    role_vars = {"model_sync_name": "bench", "model_sync_revision": revision, "model_sync_source_path": SOURCE,
                 "model_sync_allowed_dtypes": ["F16"], **extra}
    path.write_text(yaml.safe_dump([{"name": "Sync", "hosts": "node1", "gather_facts": False,
                                     "roles": [{"role": "model_sync", "vars": role_vars}]}]))
    return path


def start_role(lab: Lab, play: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    return subprocess.Popen([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                             str(lab.state_dir / "hosts.yml"), str(play), *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_role(proc: subprocess.Popen) -> tuple[int, dict]:
    stdout, _ = proc.communicate()
    tasks = {}
    for task in json.loads(stdout)["plays"][0]["tasks"]:
        result = task["hosts"].get("node1")
        if result is not None:
            # Role tasks are named "<role> : <task>".
            tasks[task["task"]["name"].split(" : ")[-1]] = dict(result, duration=task["task"]["duration"])
    return proc.returncode, tasks


def run_role(lab: Lab, play: Path, *args: str) -> tuple[float, int, dict]:
    started = time.monotonic()
    proc = start_role(lab, play, *args)
    rc, tasks = finish_role(proc)
    return time.monotonic() - started, rc, tasks


def task_seconds(task: dict) -> float:
    from datetime import datetime

    parse = lambda text: datetime.fromisoformat(text.replace("Z", "+00:00"))  # noqa: E731
    return (parse(task["duration"]["end"]) - parse(task["duration"]["start"])).total_seconds()


def plain_rsync(lab: Lab, dest: str) -> float:
    """`rsync -a` on the node pulling the same files with the same ssh command and key as the role."""
    source = RsyncSource(path="bench/rev1", host=lab.address("model-store"),
                         identity_file="/root/.ssh/revive_model_sync",
                         known_hosts_file="/etc/revive/model_sync_known_hosts")
    rsh = " ".join(shlex.quote(part) for part in ssh_command(source))
    timer = "import subprocess, sys, time; t = time.monotonic(); subprocess.run(sys.argv[1:], check=True); " \
            "print(time.monotonic() - t)"
    command = shlex.join(["python3", "-c", timer, "rsync", "-a", "-e", rsh, source.spec(), dest + "/"])
    return float(lab.ssh("node1", command).stdout.strip())


def kill_rsync_midway(lab: Lab, role: subprocess.Popen, staging: str, total: int, fraction: float) -> int:
    """SIGKILL the node's rsync (found by its staging path) once `fraction` of the model is in staging."""
    while role.poll() is None:
        out = lab.ssh("node1", f"du -sb --apparent-size {staging} 2>/dev/null | cut -f1", check=False).stdout.strip()
        if out and int(out) >= total * fraction:
            pids = lab.ssh("node1", f"pgrep -f -x 'rsync .* {staging}/'", check=False).stdout.split()
            lab.ssh("node1", "kill -KILL " + " ".join(pids))
            return int(out)
        time.sleep(0.2)
    raise AssertionError("the transfer finished before it could be killed; raise REVIVE_BENCH_MODEL_GIB")


def test_model_sync_against_plain_rsync_and_resume(tmp_path):
    lab = Lab(tmp_path / "lab")
    try:
        lab.up()
        made = time.monotonic()
        lab.ssh("model-store", f"python3 - {SOURCE} {MODEL_GIB}", stdin=MAKE_MODEL)
        made = time.monotonic() - made
        total = int(lab.ssh("model-store", f"du -sb --apparent-size {SOURCE} | cut -f1").stdout.split()[0])
        manifest_s, rc, tasks = run_role(lab, playbook(tmp_path / "pre.yml", "pre"), "--tags", "model_sync_preflight")
        assert rc == 0, tasks
        # Access (key, rrsync, pinned host key) is set up by the role's first run; the baseline then uses it.
        warm_s, rc, tasks = run_role(lab, playbook(tmp_path / "warm.yml", "warm"))
        assert rc == 0, tasks
        lab.ssh("node1", "rm -rf /data/models/bench/warm")
        plain, role, stage, promote = [], [], [], []
        for round_index in range(ROUNDS):
            plain.append(plain_rsync(lab, f"/data/plain{round_index}"))
            lab.ssh("node1", f"rm -rf /data/plain{round_index}; sync")
            elapsed, rc, tasks = run_role(lab, playbook(tmp_path / f"r{round_index}.yml", f"r{round_index}"))
            assert rc == 0, tasks
            role.append(elapsed)
            stage.append(task_seconds(tasks["Pull the model into staging and verify it as files arrive"]))
            promote.append(task_seconds(tasks["Promote the verified copy and point current at it"]))
            lab.ssh("node1", f"rm -rf /data/models/bench/r{round_index}; sync")
            print(f"\n  round {round_index}: plain rsync {plain[-1]:.1f} s, role {role[-1]:.1f} s "
                  f"(pull + verify {stage[-1]:.1f} s, promote {promote[-1]:.1f} s)", flush=True)

        staging = "/data/models/bench/.resume.staging"
        resume_play = playbook(tmp_path / "resume.yml", "resume")
        cut_role = start_role(lab, resume_play)
        staged_at_kill = kill_rsync_midway(lab, cut_role, staging, total, 0.5)
        cut_rc, _ = finish_role(cut_role)
        resumed_s, rc, tasks = run_role(lab, resume_play)
        assert rc == 0, tasks
        resumed = tasks["Pull the model into staging and verify it as files arrive"]
    finally:
        lab.down()

    ratio = statistics.median(role) / statistics.median(plain)
    data_path_ratio = statistics.median(s + p for s, p in zip(stage, promote)) / statistics.median(plain)
    resume_ratio = resumed["bytes_received"] / resumed["remainder_bytes"]
    print(f"\nmodel_sync benchmark: {MODEL_GIB} GiB random FP16 ({total} bytes, {MODEL_GIB} shards), model-store -> "
          f"node1 over the lab bridge, ssh, {os.cpu_count()} CPUs")
    print(f"  model written on the store:            {made:6.1f} s")
    print(f"  manifest made at the source (once):    {manifest_s:6.1f} s (role run with --tags model_sync_preflight)")
    print(f"  first role run incl. access setup:     {warm_s:6.1f} s (same model into a first revision)")
    print(f"  plain rsync -a (median of {ROUNDS}):         {statistics.median(plain):6.1f} s  "
          f"({', '.join(f'{x:.1f}' for x in plain)})")
    print(f"  role, whole ansible-playbook (median): {statistics.median(role):6.1f} s  "
          f"({', '.join(f'{x:.1f}' for x in role)})")
    print(f"    of which pull + verify task:         {statistics.median(stage):6.1f} s, "
          f"promote (seal, fsync, rename):      {statistics.median(promote):6.1f} s")
    print(f"  ratio role / plain rsync:              {ratio:6.2f}  (target <= {TIME_TARGET}: "
          f"{'met' if ratio <= TIME_TARGET else 'MISSED'})")
    print(f"  ratio data path (pull+verify+promote) / plain rsync: {data_path_ratio:.2f}")
    print(f"  resume: rsync killed (SIGKILL) at {staged_at_kill} bytes staged (first run rc={cut_rc}); "
          f"remainder {resumed['remainder_bytes']} bytes; resumed run received {resumed['bytes_received']} bytes "
          f"({100 * resume_ratio:.1f} % of the remainder, target <= {100 * RESUME_TARGET:.0f} %: "
          f"{'met' if resume_ratio <= RESUME_TARGET else 'MISSED'}), {resumed_s:.1f} s")
    assert resume_ratio <= RESUME_TARGET
    assert ratio <= TIME_TARGET
