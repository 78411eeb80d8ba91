"""vLLM 0.5.4's Ray executor in the twin, against a real Ray cluster (issue 16: TP inside a node, PP across nodes).

With `--distributed-executor-backend ray`, or the backend left unset and TP x PP above the visible GPUs (0.5.4 then
takes Ray when it imports, v0.5.4 vllm/config.py:700-726), the engine does for real what 0.5.4's does
(docs/facts/multi-node.md §1.3):

* `ray.init(address=None, ignore_reinit_error=True)` (v0.5.4 vllm/executor/ray_utils.py:103-108): Ray takes
  RAY_ADDRESS, else the cluster last started on this machine (`ray_current_cluster` in Ray's temp directory), else
  starts a private one-node instance without an error - 0.5.4's trap, whose GPUs are this node's only.
* the cluster's GPUs against TP x PP, else `The number of required GPUs exceeds the total number of available GPUs
  in the placement group.` (ray_utils.py:136-141); a placement group of TP x PP bundles of one GPU, Ray's default
  PACK strategy, waited for up to 1800 s (ray_utils.py:142-151; the twin scales the wait by VLLM_SIM_TIME_SCALE like
  its other modelled durations).
* one actor per bundle, `num_cpus=0, num_gpus=1` (TP = PP = 1: the GPU memory utilisation), scheduled into its
  bundle (v0.5.4 vllm/executor/ray_gpu_executor.py:92-136), asked for its IP; the first on the driver's IP (vLLM's
  get_ip(): VLLM_HOST_IP / HOST_IP, which the actors inherit from their raylet) holds the driver's GPU, else `Ray
  does not allocate any GPUs on the driver node. ...` (:137-158); ranks: the driver, then the other workers sorted
  by (not on the driver's IP, workers on their IP, IP) (:160-184); stage k holds ranks [k TP, (k + 1) TP).
* the actors live as long as the server. vLLM's Ray executor has no health check (0.5.4's GPUExecutor.check_health
  passes, v0.5.4 vllm/executor/gpu_executor.py:147-150): it learns of a dead worker from the next model execution,
  whose remote call raises RayActorError, and the engine loop dies with it (engine/async_llm_engine.py:37-62). The
  twin watches every actor with a call that only ends when the actor dies (`ray.wait`, without a timeout on Ray's
  side) and hands Ray's error to the runner, which kills the engine now if it runs requests, else at the next step.

Real: Ray, its placement group, the actors (processes on their nodes, GPUs reserved in Ray's accounting), their
IPs, node ids and GPU ids, Ray's errors. Simulated: what the actors would compute (nothing runs), their log lines
(printed by the twin with Ray's `(RayWorkerWrapper pid=N, ip=IP)` prefix, without Ray's log deduplication) and the
GPU utilisation they write.
"""
from __future__ import annotations

import asyncio
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from vllm._twin import vlog
from vllm._twin.ray_worker import RayWorkerWrapper, get_ip
from vllm._twin.startup import StartupFailure

PG_READY_TIMEOUT_SECONDS = 1800    # v0.5.4 vllm/executor/ray_utils.py:151
WATCH_INTERVAL_SECONDS = 0.25      # how often the twin asks Ray whether a worker's watch call ended
UTILIZATION_CLEAR_TIMEOUT_SECONDS = 5.0
# v0.5.4 vllm/config.py:711-715 (backend left unset, more GPUs than visible) and ray_utils.py:82-86 (backend ray)
RAY_MISSING_DEFAULTED = ("Unable to load Ray which is required for multi-node inference, please install Ray with "
                         "`pip install ray`.")
RAY_MISSING = "Failed to import Ray, please install Ray with `pip install ray`."
NO_DRIVER_GPU = ("Ray does not allocate any GPUs on the driver node. Consider adjusting the Ray placement group or "
                 "running the driver on a GPU node.")
TOO_FEW_GPUS = ("The number of required GPUs exceeds the total number of available GPUs in the placement group.")


def import_ray(defaulted: bool) -> Any:
    """`import ray`, or 0.5.4's ValueError: the default backend's words when Ray was chosen for more GPUs than
    visible, assert_ray_available's when the backend was asked for."""
    try:
        import ray
    except ImportError:
        raise StartupFailure("ValueError", RAY_MISSING_DEFAULTED if defaulted else RAY_MISSING) from None
    return ray


def qualified_name(exc: BaseException) -> str:
    """The exception's name as a traceback's last line shows it (`ray.exceptions.GetTimeoutError`)."""
    module = type(exc).__module__
    return type(exc).__qualname__ if module == "builtins" else f"{module}.{type(exc).__qualname__}"


@contextmanager
def ray_errors() -> Iterator[None]:
    """Ray's own exceptions end the start-up as they end 0.5.4's engine: their type and message."""
    try:
        yield
    except StartupFailure:
        raise
    except Exception as exc:  # whatever Ray raises, 0.5.4 lets it end the engine
        raise StartupFailure(qualified_name(exc), str(exc)) from None


@dataclass
class RayWorker:
    """One actor of the placement group, in rank order."""

    rank: int
    actor: Any
    ip: str                 # vLLM's get_ip() in the actor's process
    ray_ip: str             # Ray's address of the actor's node (`ray.nodes()`' NodeManagerAddress)
    node_id: str
    gpu_ids: List[int]
    pid: int


@dataclass
class RayExecutor:
    """The Ray side of one engine: the connection, the placement group, the workers by rank."""

    ray: Any
    tensor_parallel_size: int = 1
    placement_group: Any = None
    driver_ip: str = ""
    driver_node_id: str = ""
    workers: List[RayWorker] = field(default_factory=list)   # rank 0 is the actor holding the driver's GPU
    closing: bool = False
    lost: bool = False
    pending: List[Any] = field(default_factory=list)

    # --- initialize_ray_cluster (v0.5.4 vllm/executor/ray_utils.py:89-154) ------------------------------------
    def initialize_cluster(self, world_size: int, time_scale: float) -> None:
        with ray_errors():
            self.ray.init(address=None, ignore_reinit_error=True)
            gpus = self.ray.cluster_resources().get("GPU", 0)
            vlog.sim(f"Ray cluster {self.ray.get_runtime_context().gcs_address}: {gpus:g} GPUs, "
                     f"{world_size} needed (TP x PP)")
            if world_size > gpus:
                raise StartupFailure("ValueError", TOO_FEW_GPUS)
            self.placement_group = self.ray.util.placement_group([{"GPU": 1}] * world_size)
            timeout = PG_READY_TIMEOUT_SECONDS * time_scale
            vlog.sim(f"waiting for a placement group of {world_size} x {{'GPU': 1}} (PACK) for up to "
                     f"{PG_READY_TIMEOUT_SECONDS} s x time scale = {timeout:g} s")
            self.ray.get(self.placement_group.ready(), timeout=timeout)

    # --- RayGPUExecutor._init_workers_ray (v0.5.4 vllm/executor/ray_gpu_executor.py:91-184) -------------------
    def start_workers(self, tensor_parallel_size: int, pipeline_parallel_size: int,
                      gpu_memory_utilization: float) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.tensor_parallel_size = tensor_parallel_size
        single = tensor_parallel_size == 1 and pipeline_parallel_size == 1
        vlog.info("ray_gpu_executor.py:117", "use_ray_spmd_worker: False")
        self.driver_ip = get_ip()
        vlog.info("ray_gpu_executor.py:120", f"driver_ip: {self.driver_ip}")
        with ray_errors():
            self.driver_node_id = self.ray.get_runtime_context().get_node_id()
            # max_concurrency 2: the liveness watch holds one thread of each actor, utilisation writes use the other
            actor_class = self.ray.remote(num_cpus=0, num_gpus=gpu_memory_utilization if single else 1,
                                          max_concurrency=2)(RayWorkerWrapper)
            actors = [actor_class.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group, placement_group_capture_child_tasks=True,
                placement_group_bundle_index=index)).remote()
                for index, bundle in enumerate(self.placement_group.bundle_specs) if bundle.get("GPU", 0)]
            # 0.5.4 asks each new actor for its IP before it starts the next; the twin starts them all, then asks
            # (the same choice of driver worker and order, without waiting for each process in turn)
            ips = self.ray.get([actor.get_node_ip.remote() for actor in actors])
            driver = next((i for i, ip in enumerate(ips) if ip == self.driver_ip), None)
            if driver is None:
                raise StartupFailure("ValueError", NO_DRIVER_GPU)
            others = [i for i in range(len(actors)) if i != driver]
            ip_counts: Dict[str, int] = {}
            for i in others:
                ip_counts[ips[i]] = ip_counts.get(ips[i], 0) + 1
            others.sort(key=lambda i: (ips[i] != self.driver_ip, ip_counts[ips[i]], ips[i]))
            order = [driver] + others
            placed = self.ray.get([actors[i].get_node_and_gpu_ids.remote() for i in order])
            pids = self.ray.get([actors[i].get_pid.remote() for i in order])
            addresses = {node["NodeID"]: node["NodeManagerAddress"] for node in self.ray.nodes()}
        self.workers = [RayWorker(rank=rank, actor=actors[i], ip=ips[i], ray_ip=addresses.get(node_id, "?"),
                                  node_id=node_id, gpu_ids=gpu_ids, pid=pid)
                        for rank, (i, (node_id, gpu_ids), pid) in enumerate(zip(order, placed, pids))]
        self._log_stages(pipeline_parallel_size)

    def node_gpus(self) -> Dict[str, List[int]]:
        """Ray's GPU ids per node id, sorted: what 0.5.4 sets as each node's CUDA_VISIBLE_DEVICES (:186-214)."""
        gpus: Dict[str, List[int]] = {}
        for worker in self.workers:
            gpus.setdefault(worker.node_id, []).extend(worker.gpu_ids)
        return {node: sorted(ids) for node, ids in gpus.items()}

    def driver_node_gpus(self) -> List[int]:
        return self.node_gpus()[self.workers[0].node_id]

    def stages(self) -> List[List[RayWorker]]:
        tp = self.tensor_parallel_size
        return [self.workers[k:k + tp] for k in range(0, len(self.workers), tp)]

    def stage_nodes(self) -> List[List[str]]:
        """The Ray node ids each pipeline stage runs on, in rank order."""
        return [list(dict.fromkeys(w.node_id for w in stage)) for stage in self.stages()]

    def worker_prefixes(self) -> List[str]:
        """Ray's prefix of a worker's forwarded output (ray 2.34 ray/_private/worker.py print_worker_logs: the
        node's address only for another node than the driver's), for ranks 1 .. world - 1."""
        return [f"(RayWorkerWrapper pid={w.pid}" + ("" if w.node_id == self.driver_node_id else f", ip={w.ray_ip}")
                + ") " for w in self.workers[1:]]

    def _log_stages(self, pipeline_parallel_size: int) -> None:
        tp = self.tensor_parallel_size
        for index, stage in enumerate(self.stages()):
            nodes = list(dict.fromkeys((w.ip, w.node_id) for w in stage))
            where = "; ".join(f"node {ip} (Ray node {node_id[:12]}, GPUs "
                              f"{sorted(g for w in stage if w.node_id == node_id for g in w.gpu_ids)})"
                              for ip, node_id in nodes)
            vlog.sim(f"pipeline stage {index} of {pipeline_parallel_size} (ranks {index * tp}-{index * tp + tp - 1}) "
                     f"runs on {where}")
            if len(nodes) > 1:
                vlog.sim(f"pipeline stage {index} spans {len(nodes)} nodes: its tensor-parallel all-reduces would "
                         "cross the node network (0.5.4 does not check this); the twin still times it as one node's")

    # --- while serving ----------------------------------------------------------------------------------------
    async def watch(self, on_lost: Callable[[str], None]) -> None:
        """Call on_lost(Ray's error) once, when the first actor (or its node) dies."""
        calls = {worker.actor.serve.remote(): worker for worker in self.workers}
        ended: List[Any] = []
        while not ended:
            if self.closing:
                return
            ended, _ = self.ray.wait(list(calls), num_returns=1, timeout=0)
            if not ended:
                await asyncio.sleep(WATCH_INTERVAL_SECONDS)
        worker = calls[ended[0]]
        try:
            self.ray.get(ended[0])
            reason = f"RuntimeError: the Ray worker of rank {worker.rank} returned"
        except Exception as exc:  # Ray's error for the dead actor is the reason, whatever its class
            reason = f"{qualified_name(exc)}: {exc}"
        self.lost = True
        stage = worker.rank // self.tensor_parallel_size
        vlog.sim(f"Ray reports the worker of rank {worker.rank} (pipeline stage {stage}, node {worker.ip}, pid "
                 f"{worker.pid}) gone: {reason.splitlines()[0]}")
        on_lost(reason)

    def mirror_utilization(self, percent: Optional[Tuple[int, int]]) -> None:
        """The replica's GPU utilisation (gpu %, memory %) on every other node, written there by the node's
        lowest-rank worker; None clears it."""
        if self.lost or (self.closing and percent is not None):
            return
        driver_node = self.workers[0].node_id
        writers: Dict[str, RayWorker] = {}
        for worker in self.workers:
            if worker.node_id != driver_node:
                writers.setdefault(worker.node_id, worker)
        gpus = self.node_gpus()
        gpu, memory = percent if percent is not None else (None, None)
        self.pending = [writer.actor.write_utilization.remote(gpus[node], gpu, memory)
                        for node, writer in writers.items()]

    def shutdown(self) -> None:
        """Leave the cluster as 0.5.4's engine process does when it ends: Ray removes its actors and placement
        group when the driver disconnects (a private instance stops with it)."""
        self.closing = True
        if self.pending and not self.lost:
            try:
                self.ray.wait(self.pending, num_returns=len(self.pending), timeout=UTILIZATION_CLEAR_TIMEOUT_SECONDS)
            except Exception as exc:  # a node already gone: nothing left to clear there
                vlog.sim(f"the other nodes' GPU utilisation was not cleared: {qualified_name(exc)}")
        self.ray.shutdown()
