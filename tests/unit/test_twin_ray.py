"""vLLM 0.5.4's Ray executor in the twin, against a real Ray cluster (issue 16: TP inside a node, PP across nodes).

Nothing of Ray is mocked. The module makes one lab-node venv (Python 3.11, the lab's Debian 12) from the lab
wheelhouse's 0.5.4 lock - the twin's pins and ray[default]==2.34.0, which has no wheels for the controller's Python -
and one Ray cluster of two nodes with 8 GPUs each on this machine: the head on the address Ray picks for this
machine, the worker on the loopback alias 127.0.0.2 (its own address, as a lab node has), each `ray start --block`
with the node's VLLM_HOST_IP and its own fake-NVML utilisation file in its environment, as the lab's Ray units
run. The twin runs from this checkout (PYTHONPATH, on the driver and in every Ray worker) with that venv's Python,
so the code under test is the working tree's while Ray and nvidia-ml-py are the locked ones. Two nodes on one
machine share Ray's session directory, whose node_ip_address.json names the raylet a driver started here attaches
to: the fixture keeps the head's there, as on the lab's head (a lab node is a machine of its own), and Ray's
sessions live in a short directory under /tmp (their unix sockets allow 107 bytes of path).

Covered: the planner's TP 8 x PP 2 argv for Mixtral-8x22B serves across the two nodes, a stage per node, with the
planner's KV blocks; too few GPUs in the cluster, no bundle on the driver's node and Ray's private local instance
(no RAY_ADDRESS) end the start-up with 0.5.4's messages; a worker node whose Ray stops while requests run kills the
engine as 0.5.4's does (streams cut, /health 500, the server stays up), a restart after the node rejoins serves
again, and a node lost while idle is noticed at the next request (0.5.4's Ray executor has no health check); Ray
missing and a bad VLLM_SIM_NODE_LINK_GBIT. Timings are printed (pytest -s).

The cluster is stopped by the ids of the `ray start --block` processes this module started (their process
groups), never with `ray stop`, which ends every Ray on the machine.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
from ansible.module_utils.revive_model import model_from_config
from ansible.module_utils.revive_plan import NodeGroup, Overrides, PackageSource, Serve, Workload, plan_release
from ansible.module_utils.revive_releases import load_release_file
from fixtures.gpus import lab_facts, lab_ram_bytes
from fixtures.models import model_config

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))
sys.path.insert(0, str(REPO / "lab"))

import harness  # noqa: E402
from labctl import prepare  # noqa: E402

LOCK = prepare.WHEELHOUSE / "locks" / "vllm-0.5.4-py3.11.txt"
RAY_PIN = "2.34.0"
GPUS_PER_NODE = 8
WORKER_IP = "127.0.0.2"      # a loopback alias: the second node's own address on this machine
TIME_SCALE = 0.01            # modelled durations x this; the placement-group wait becomes 18 s
STARTUP_TIMEOUT_S = 180.0
IN_PROCESS = ["--disable-frontend-multiprocessing"]
MIXTRAL = "mixtral-8x22b-instruct"
CUDA_TOTAL_V100 = 34089730048  # what CUDA reports for a V100-32GB (torch.cuda.mem_get_info)


def say(message: str) -> None:
    print(f"[test_twin_ray] {message}", flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


# --- the lab node's Python and venv -----------------------------------------------------------------------------

def node_python() -> Optional[str]:
    """A CPython 3.11 with venv and ensurepip (the lab nodes' Debian 12 Python; the lock is for 3.11), or None."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which("python3.11")]
    candidates += sorted(str(p) for p in root.glob("3.11.*/bin/python3")) if root.is_dir() else []
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "import venv, ensurepip"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.fixture(scope="module")
def node_venv(tmp_path_factory) -> Path:
    """The 0.5.4 lock installed as a lab node installs it (hash-checked, wheels only, offline from the wheelhouse).
    A missing Python 3.11, wheelhouse or Ray in the lock fails with how to fix it."""
    python = node_python()
    if python is None:
        pytest.fail("no CPython 3.11 with venv and ensurepip for the lab node's venv (Ray 2.34.0 has no wheels for "
                    "the controller's Python): apt-get install python3.11-venv, or pyenv install 3.11")
    if not LOCK.is_file():
        pytest.fail(f"{LOCK.relative_to(REPO)} is missing: run bin/lab wheelhouse (make unit and make test do)")
    pins = prepare.lock_requirements(LOCK.read_text())
    if f"ray=={RAY_PIN}" not in pins:
        pytest.fail(f"{LOCK.relative_to(REPO)} does not pin ray=={RAY_PIN}: the 0.5.4 twin requires ray[default]=="
                    f"{RAY_PIN} (data/vllm-releases.yml, lab/vllm_twin/build_wheelhouse.py); rebuild the wheelhouse "
                    "with bin/lab wheelhouse")
    missing = [pin for pin in pins if not prepare.wheel_present(prepare.WHEELHOUSE, pin)]
    if missing:
        pytest.fail(f"the lab wheelhouse {prepare.WHEELHOUSE} lacks {', '.join(missing)} of {LOCK.name}: run "
                    "bin/lab wheelhouse (make unit and make test do)")
    started = time.monotonic()
    venv = tmp_path_factory.mktemp("node") / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "--isolated", "--quiet", "--require-hashes",
                           "--only-binary", ":all:", "--no-deps", "--no-index", "--find-links",
                           str(prepare.WHEELHOUSE), "-r", str(LOCK)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"installing {LOCK.name} from {prepare.WHEELHOUSE} failed:\n{done.stderr[-3000:]}"
    say(f"lab node venv from {LOCK.name}: {time.monotonic() - started:.1f} s")
    return venv


def short_temp_dir() -> Path:
    """A directory for Ray's sessions in /tmp: they hold unix sockets, whose paths (session_<date>_<pid>/sockets/
    plasma_store under it) must stay within 107 bytes, which pytest's temporary directories can exceed."""
    return Path(tempfile.mkdtemp(prefix="revive-ray-", dir="/tmp"))


# --- the cluster --------------------------------------------------------------------------------------------------

def worker_ports(index: int) -> List[str]:
    """A range of worker ports of its own for each node: both raylets run on this machine, and with Ray's one
    default range (10002-19999) each picked ports the other's workers held ("Failed to start the grpc server.
    The specified port is 10014", seen in a unit run). Lab nodes are separate machines and keep the default."""
    low = 20000 + 1000 * index
    return ["--min-worker-port", str(low), "--max-worker-port", str(low + 999)]


@dataclass
class RayNode:
    name: str
    ip: str
    process: subprocess.Popen
    utilization_file: Path


@dataclass
class Cluster:
    """Two `ray start --block` nodes of 8 GPUs on this machine, as the lab's Ray units run them."""

    venv: Path
    temp_dir: Path
    head_ip: str
    port: int
    env: Dict[str, str]
    logs_dir: Path
    nodes: Dict[str, RayNode] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.port}"

    def _start(self, name: str, ip: str, args: List[str]) -> RayNode:
        """`ray start --block` for one node; returns once Ray says the node runs (its log's `Ray runtime
        started.`): two nodes that start at once on one machine race for its session files."""
        utilization = self.logs_dir / f"{name}-utilization.json"
        env = dict(self.env, VLLM_HOST_IP=ip, FAKE_NVML_UTILIZATION=str(utilization))
        argv = [str(self.venv / "bin" / "ray"), "start", "--block", "--node-ip-address", ip,
                "--num-gpus", str(GPUS_PER_NODE), "--disable-usage-stats",
                "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port()), *args]
        log_path = self.logs_dir / f"{name}.log"
        log_path.write_bytes(b"")
        with open(log_path, "ab") as log:
            process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        node = RayNode(name, ip, process, utilization)
        self.nodes[name] = node
        deadline = time.monotonic() + 120
        while "Ray runtime started." not in log_path.read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, f"{name} did not start:\n{self.logs()}"
            time.sleep(0.2)
        return node

    def start_head(self) -> None:
        # only the head takes --temp-dir: the other nodes on the machine use the head's
        self._start("head", self.head_ip, ["--head", "--port", str(self.port), "--temp-dir", str(self.temp_dir),
                                           *worker_ports(0),
                                           "--include-dashboard=false", "--dashboard-port", str(free_port()),
                                           "--ray-client-server-port", str(free_port())])

    def start_worker(self) -> None:
        self._start("worker", WORKER_IP, ["--address", self.address, *worker_ports(1)])
        # Ray keeps one node address per machine in its session (node_ip_address.json), which a driver started here
        # attaches by; the second node's start overwrote it. Lab nodes are separate machines: restore the head's,
        # so the twin attaches to the head's raylet as it does on the lab's head (ray 2.34
        # ray/_private/services.py get_cached_node_ip_address, write_node_ip_address).
        for session in self.temp_dir.glob("session_2*"):
            cached = session / "node_ip_address.json"
            with open(f"{cached}.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                cached.write_text(json.dumps({"node_ip_address": self.head_ip}))

    def stop(self, name: str) -> None:
        """What systemd does to the unit: SIGTERM to `ray start --block`, which stops its node's processes."""
        node = self.nodes.pop(name)
        if node.process.poll() is None:
            node.process.send_signal(signal.SIGTERM)
            try:
                node.process.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(node.process.pid, signal.SIGKILL)  # whatever of its session is left
        except ProcessLookupError:
            pass

    def wait_for_gpus(self, gpus: int, free: bool = False, timeout: float = 120.0) -> None:
        """Until the cluster has `gpus` GPUs on live nodes - with `free`, that no placement group or actor holds
        (one driver that polls, then leaves)."""
        resources = "ray.available_resources()" if free else "ray.cluster_resources()"
        code = ("import ray, sys, time\n"
                f"ray.init(address={self.address!r}, logging_level='ERROR')\n"
                f"deadline = time.monotonic() + {timeout}\n"
                f"while {resources}.get('GPU', 0) != {gpus}:\n"
                "    if time.monotonic() > deadline:\n"
                f"        sys.exit(f'the cluster has {{{resources}}}')\n"
                "    time.sleep(0.2)\n")
        done = subprocess.run([str(self.venv / "bin" / "python"), "-c", code], env=self.env, capture_output=True,
                              text=True, timeout=timeout + 60)
        assert done.returncode == 0, (f"the Ray cluster never had {gpus} {'free ' if free else ''}GPUs: "
                                      f"{done.stderr[-2000:]}\n{self.logs()}")

    def require_worker(self) -> None:
        if "worker" not in self.nodes:
            started = time.monotonic()
            self.start_worker()
            self.wait_for_gpus(2 * GPUS_PER_NODE)
            say(f"worker node (re)joined in {time.monotonic() - started:.1f} s")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.logs_dir.glob("*.log")))


@pytest.fixture(scope="module")
def cluster(node_venv, tmp_path_factory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("cluster")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "NCCL_", "CUDA_", "RAY_"))}
    # the twin's actors import the checkout's code, as the driver does
    env.update(PYTHONPATH=str(harness.TWIN_SRC), RAY_USAGE_STATS_ENABLED="0")
    ask = "import ray._private.services as s; print(s.get_node_ip_address())"
    head_ip = subprocess.run([str(node_venv / "bin" / "python"), "-c", ask], env=env, capture_output=True, text=True,
                             check=True).stdout.strip()
    temp_dir = short_temp_dir()
    cluster = Cluster(node_venv, temp_dir, head_ip, free_port(), env, logs_dir=base)
    started = time.monotonic()
    try:
        cluster.start_head()
        cluster.start_worker()
        cluster.wait_for_gpus(2 * GPUS_PER_NODE)
        say(f"Ray cluster {cluster.address} + {WORKER_IP}: 2 nodes x {GPUS_PER_NODE} GPUs in "
            f"{time.monotonic() - started:.1f} s")
        yield cluster
    finally:
        for name in list(cluster.nodes):
            cluster.stop(name)
        shutil.rmtree(temp_dir, ignore_errors=True)


# --- the twin on the cluster --------------------------------------------------------------------------------------

def plan_for_two_nodes() -> dict:
    """The planner's group plan for Mixtral-8x22B on two v100-pcie-8x nodes (0.5.4 from a mirror), for GPUs whose
    CUDA total is what the twin takes for a V100-32GB: the fake NVML reports no driver-reserved memory, so the
    twin deducts CUDA's share itself (vllm/_twin/gpus.py DEFAULT_DRIVER_RESERVED_FRACTION)."""
    releases = load_release_file(str(REPO / "data" / "vllm-releases.yml"))
    model = model_from_config(dict(model_config(MIXTRAL, dtype="F16")), f"/data/models/{MIXTRAL}")
    facts = lab_facts("v100-pcie-8x")
    for device in facts["devices"]:
        device["memory"]["reserved_bytes"] = device["memory"]["total_bytes"] - CUDA_TOTAL_V100
    return plan_release(facts, model, releases, Workload(), Overrides(vllm_version="0.5.4"),
                        Serve(), lab_ram_bytes("v100-pcie-8x"), PackageSource("mirror", "https://pypi.internal/simple"),
                        NodeGroup(nodes=2, link_gbit=25.0))


def without(args: List[str], *flags: str) -> List[str]:
    """argv without the given flags and their values."""
    out: List[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        else:
            out.append(arg)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {MIXTRAL: harness.write_model(MIXTRAL, root / MIXTRAL, dtype="F16"),
            "7b": harness.write_model("llama-2-7b-chat", root / "llama-2-7b", dtype="F16")}


def twin_env(tmp_path: Path, cluster: Optional[Cluster], extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = harness.twin_env(tmp_path, time_scale=TIME_SCALE, extra=extra)
    env = {k: v for k, v in env.items() if not k.startswith("RAY_")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    if cluster is not None:
        env.update(RAY_ADDRESS=cluster.address, VLLM_HOST_IP=cluster.head_ip)
    return env


def run_to_exit(python: str, model: Path, args: List[str], env: Dict[str, str], timeout: float = 240.0):
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(harness.free_port()), *args]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    say(f"{' '.join(args[:6])} ... exited {done.returncode} after {time.monotonic() - started:.1f} s")
    return done


def start_twin(cluster: Cluster, model: Path, args: List[str], tmp_path: Path, name: str,
               extra: Optional[Dict[str, str]] = None, served_name: Optional[str] = None) -> harness.Twin:
    started = time.monotonic()
    twin = harness.start(model, args, twin_env(tmp_path, cluster, extra), tmp_path / f"{name}.log",
                         timeout=STARTUP_TIMEOUT_S, served_name=served_name,
                         python=str(cluster.venv / "bin" / "python"))
    say(f"{name}: serving after {time.monotonic() - started:.1f} s")
    return twin


def completion(twin: harness.Twin, max_tokens: int = 8) -> dict:
    status, _, body = harness.request(twin, "POST", "/v1/completions", {
        "model": twin.model, "prompt": "Say hello", "max_tokens": max_tokens, "ignore_eos": True}, timeout=60)
    assert status == 200, body
    return json.loads(body)


def health(twin: harness.Twin) -> int:
    return harness.request(twin, "GET", "/health", timeout=10)[0]


def wait_for_line(twin: harness.Twin, pattern: str, timeout: float = 60.0) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, twin.log())
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{twin.log()[-4000:]}")


def is_ray_actor(pid: int) -> bool:
    """A live process that Ray named after the actor class (Ray sets the title `ray::RayWorkerWrapper`)."""
    try:
        return "ray::RayWorkerWrapper" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


# --- serving across two nodes, a worker node lost, a restart ----------------------------------------------------

@pytest.fixture(scope="module")
def serving(cluster, models, tmp_path_factory) -> Iterator[Tuple[harness.Twin, dict]]:
    """The planner's TP 8 x PP 2 replica of Mixtral-8x22B on the two nodes, with its environment, decode steps 20x
    slower (a twin fault knob) so that a stream is still running when a node is lost under it. The tests that read
    it come first; test_a_lost_worker_node_kills_the_engine_and_a_restart_serves_again ends its engine."""
    result = plan_for_two_nodes()
    assert (result["tensor_parallel_size"], result["pipeline_parallel_size"]) == (8, 2)
    replica = result["replicas"][0]
    args = without(replica["args"], "--model", "--host", "--port", "--served-model-name")
    assert "--distributed-executor-backend" in args and "--disable-frontend-multiprocessing" in args
    twin = start_twin(cluster, models[MIXTRAL], args, tmp_path_factory.mktemp("serving"), "tp8-pp2",
                      extra=dict(replica["env"], VLLM_SIM_FAULT_DECODE_SLOWDOWN="20"), served_name=MIXTRAL)
    yield twin, result
    twin.stop()


def test_the_planners_tp8_pp2_argv_serves_across_two_ray_nodes_with_its_kv(cluster, serving):
    twin, result = serving
    answer = completion(twin)
    assert answer["choices"][0]["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 8
    log = twin.log()
    # 0.5.4's executor lines, then the stages: ranks 0-7 on the driver's node, 8-15 on the worker
    assert f"ray_gpu_executor.py:120] driver_ip: {cluster.head_ip}" in log
    assert re.search(rf"\[twin\] pipeline stage 0 of 2 \(ranks 0-7\) runs on node {re.escape(cluster.head_ip)} "
                     r"\(Ray node \w+, GPUs \[0, 1, 2, 3, 4, 5, 6, 7\]\)", log), log[-4000:]
    assert re.search(rf"\[twin\] pipeline stage 1 of 2 \(ranks 8-15\) runs on node {re.escape(WORKER_IP)} "
                     r"\(Ray node \w+, GPUs \[0, 1, 2, 3, 4, 5, 6, 7\]\)", log), log[-4000:]
    assert "spans" not in log
    # the KV line as 0.5.4 logs it: the whole cache, which the 2 virtual engines then share
    gpu_blocks, cpu_blocks = map(int, re.search(r"# GPU blocks: (\d+), # CPU blocks: (\d+)", log).groups())
    assert (gpu_blocks // 2, cpu_blocks // 2) == (result["kv_cache"]["num_gpu_blocks"],
                                                   result["kv_cache"]["num_cpu_blocks"])
    assert log.count("# GPU blocks:") == 1
    # the 15 other workers are live Ray actors, 8 of them on the worker node (Ray's prefix names its IP)
    workers = re.findall(r"\(RayWorkerWrapper pid=(\d+)(, ip=([\d.]+))?\) INFO \S+ \S+ selector\.py:54\] Using "
                         r"XFormers backend\.", log)
    assert len(workers) == 15, log[-4000:]
    assert sum(1 for _, _, ip in workers if ip == WORKER_IP) == 8
    assert all(is_ray_actor(int(pid)) for pid, _, _ in workers)
    version = json.loads(harness.request(twin, "GET", "/version")[2])
    assert version["simulated"] is True and version["twin"]["node_link_gbit"] == 25.0
    # the worker node's simulated GPU utilisation, written there by its Ray worker (the driver writes its own)
    deadline = time.monotonic() + 30
    while not cluster.nodes["worker"].utilization_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    written = json.loads(cluster.nodes["worker"].utilization_file.read_text())
    assert sorted(written) == [str(i) for i in range(8)], written


def test_a_lost_worker_node_kills_the_engine_and_a_restart_serves_again(cluster, serving, models, tmp_path):
    twin, result = serving
    completion(twin)
    under_way = threading.Event()
    outcome: Dict[str, harness.StreamResult] = {}

    def read() -> None:
        outcome["stream"] = harness.stream(twin, "/v1/completions", {
            "model": twin.model, "prompt": "Tell a long story", "max_tokens": 2000, "ignore_eos": True,
            "stream": True}, timeout=120, on_event=lambda _: under_way.set())

    reader = threading.Thread(target=read)
    reader.start()
    assert under_way.wait(60), twin.log()[-3000:]
    stopped = time.monotonic()
    cluster.stop("worker")  # the worker node's Ray unit stops (systemd's SIGTERM)
    wait_for_line(twin, r"Engine background task failed: ray\.exceptions\.ActorDiedError: The actor died")
    say(f"worker node stopped -> engine dead in {time.monotonic() - stopped:.1f} s")
    reader.join(60)
    cut = outcome["stream"]
    # 0.5.4 cuts the stream: no finish_reason, no [DONE], an incomplete chunked body
    assert cut.status == 200 and cut.error is not None and "[DONE]" not in cut.events, cut
    assert 0 < len(cut.chunks()) < 2000 and all(c["choices"][0]["finish_reason"] is None for c in cut.chunks())
    assert health(twin) == 500
    assert twin.process.poll() is None  # 0.5.4 stays up with a dead engine
    assert "The actor died because its node has died" in twin.log()
    assert twin.stop() == 0, twin.log()[-3000:]

    # the worker rejoins and the vLLM unit is restarted: a fresh placement group, serving again
    cluster.require_worker()
    replica = result["replicas"][0]
    args = without(replica["args"], "--model", "--host", "--port", "--served-model-name")
    again = start_twin(cluster, models[MIXTRAL], args, tmp_path, "restarted", extra=replica["env"],
                       served_name=MIXTRAL)
    try:
        completion(again)
        # lost while idle: 0.5.4 has no health check on its Ray workers; the next request finds out
        cluster.stop("worker")
        wait_for_line(again, r"\[twin\] the engine is idle: vLLM 0\.5\.4 learns of the lost worker")
        assert health(again) == 200
        status, _, _ = harness.request(again, "POST", "/v1/completions", {
            "model": again.model, "prompt": "Hello", "max_tokens": 4}, timeout=30)
        assert status == 500
        assert health(again) == 500
        assert "Engine background task failed: ray.exceptions.ActorDiedError" in again.log()
    finally:
        assert again.stop() == 0, again.log()[-3000:]
    cluster.require_worker()


# --- start-up failures --------------------------------------------------------------------------------------------

def test_too_few_gpus_in_the_cluster_ends_the_start_up_with_0_5_4s_message(cluster, models, tmp_path):
    cluster.require_worker()
    args = ["-tp", "8", "-pp", "3", "--distributed-executor-backend", "ray", "--dtype", "half", *IN_PROCESS]
    done = run_to_exit(str(cluster.venv / "bin" / "python"), models[MIXTRAL], args, twin_env(tmp_path, cluster))
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr.rstrip().splitlines()[-1] == ("ValueError: The number of required GPUs exceeds the total "
                                                     "number of available GPUs in the placement group.")
    assert "Connected to Ray cluster" in done.stderr  # Ray's own line: the twin joined the real cluster
    assert f"[twin] Ray cluster {cluster.address}: 16 GPUs, 24 needed (TP x PP)" in done.stdout


def test_no_gpu_bundle_on_the_drivers_node_ends_the_start_up_with_0_5_4s_message(cluster, models, tmp_path):
    cluster.require_worker()
    # the driver's VLLM_HOST_IP names no node of the cluster (#2406: a mismatch between vLLM's and Ray's IP)
    env = twin_env(tmp_path, cluster)
    env["VLLM_HOST_IP"] = "10.255.255.1"
    # the default mode: the engine fails, 0.5.4's API process then waits for it forever (#7213)
    twin = harness.start(models["7b"], ["-pp", "2", "--distributed-executor-backend", "ray", "--dtype", "half"], env,
                         tmp_path / "twin.log", wait=False, python=str(cluster.venv / "bin" / "python"))
    try:
        wait_for_line(twin, r"\[twin\] the engine failed to start; like vLLM 0\.5\.4", 120)
        log = twin.log()
        assert "ray_gpu_executor.py:120] driver_ip: 10.255.255.1" in log
        assert "Process Process-1:" in log and ("\nValueError: Ray does not allocate any GPUs on the driver node. "
                                                "Consider adjusting the Ray placement group or running the driver on "
                                                "a GPU node.\n") in log
        # the failed engine left the cluster - its placement group and actors are gone - while the server waits
        cluster.wait_for_gpus(2 * GPUS_PER_NODE, free=True)
        assert twin.process.poll() is None
        with pytest.raises(OSError):
            harness.request(twin, "GET", "/health", timeout=2)
    finally:
        twin.stop(signal.SIGKILL)


def test_without_ray_address_ray_starts_a_private_local_instance_and_the_gpus_do_not_suffice(models, node_venv,
                                                                                             tmp_path):
    # Ray's temp directory of its own, so that no cluster started on this machine is found (0.5.4's trap: no error)
    ray_tmp = short_temp_dir()
    env = twin_env(tmp_path, None)
    env["RAY_TMPDIR"] = str(ray_tmp)
    try:
        done = run_to_exit(str(node_venv / "bin" / "python"), models[MIXTRAL],
                           ["-tp", "8", "-pp", "2", "--dtype", "half"] + IN_PROCESS, env)
        # the private instance ended with the engine. Ray's own processes notice their raylet's end by polling;
        # with both cores busy (make test) the last of them took more than 30 s once, so the bound is generous and
        # a failure names what was left.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and leftovers(ray_tmp):
            time.sleep(0.5)
        left = leftovers(ray_tmp)
        assert not left, [command_line(pid) for pid in left]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Defaulting to use ray for distributed inference" in done.stdout  # 16 GPUs > the 8 this node has
    assert "Started a local Ray instance." in done.stderr  # Ray's own line
    assert re.search(r"\[twin\] Ray cluster \S+: 8 GPUs, 16 needed", done.stdout)  # the fake NVML's, seen by Ray
    assert done.stderr.rstrip().splitlines()[-1] == ("ValueError: The number of required GPUs exceeds the total "
                                                     "number of available GPUs in the placement group.")


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return f"{pid} (gone)"


def leftovers(directory: Path) -> List[int]:
    """Processes whose command line names `directory` (Ray's processes carry their session directory)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(directory).encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


# --- without Ray, and the link setting (the controller's Python, no cluster) -------------------------------------

@pytest.fixture
def no_ray(tmp_path) -> Path:
    """A `ray` that cannot be imported, first on the path: 0.5.4 installed without Ray."""
    shadow = tmp_path / "no-ray"
    (shadow / "ray").mkdir(parents=True)
    (shadow / "ray" / "__init__.py").write_text("raise ImportError('No module named ray (test_twin_ray)')\n")
    return shadow


@pytest.mark.parametrize("backend, expected", [
    (["--distributed-executor-backend", "ray"], "ValueError: Failed to import Ray, please install Ray with "
                                               "`pip install ray`."),
    ([], "ValueError: Unable to load Ray which is required for multi-node inference, please install Ray with "
         "`pip install ray`."),
])
def test_without_ray_the_start_up_ends_with_0_5_4s_message(models, tmp_path, no_ray, backend, expected):
    env = twin_env(tmp_path, None)
    env["PYTHONPATH"] = f"{no_ray}{os.pathsep}{env['PYTHONPATH']}"
    done = run_to_exit(sys.executable, models[MIXTRAL], ["-tp", "8", "-pp", "2", "--dtype", "half", *backend,
                                                         *IN_PROCESS], env)
    assert done.returncode == 1
    assert done.stderr.rstrip().splitlines()[-1] == expected


LINK_BOUND = "a link speed in Gbit/s above 0 and at most 10000"


@pytest.mark.parametrize("value, expected", [("0", LINK_BOUND), ("-25", LINK_BOUND), ("10001", LINK_BOUND),
                                             ("nan", LINK_BOUND), ("fast", "a number")])
def test_a_bad_node_link_setting_stops_the_twin_with_exit_2(models, tmp_path, value, expected):
    env = twin_env(tmp_path, None, {"VLLM_SIM_NODE_LINK_GBIT": value})
    done = run_to_exit(sys.executable, models["7b"], ["--dtype", "half"], env, timeout=60)
    assert done.returncode == 2
    assert done.stderr == (f"vLLM twin: VLLM_SIM_NODE_LINK_GBIT={value!r}: expected {expected}. Fix or unset it "
                           "(lab/vllm_twin/README.md).\n")
