"""The twin's Ray worker: one real Ray actor per GPU bundle, standing in for 0.5.4's `RayWorkerWrapper`.

0.5.4's Ray executor starts one `RayWorkerWrapper` actor per bundle of its placement group (v0.5.4
vllm/executor/ray_gpu_executor.py:122-150) and asks each for its node's IP (`get_node_ip`, vLLM's `get_ip()`,
ray_utils.py:26-27) and its Ray node id and GPU ids (`get_node_and_gpu_ids`, ray_utils.py:29-32). The twin's actor
answers the same questions for real - from the environment the actor inherited from its node's raylet and from
Ray itself - and computes nothing: no model runs. It lives as long as the server (vLLM's workers do), so Ray
reports its death or its node's (`serve` never returns while it lives), and it writes the simulated GPU
utilisation of its node's GPUs into the fake NVML's file on that node.

This module is imported in the actor's process on every node of the cluster (Ray unpickles the class by
reference), so it imports nothing of the twin beyond the utilisation writer.
"""
from __future__ import annotations

import os
import socket
import threading
import warnings
from typing import List, Optional, Tuple

from vllm._twin.utilization import DEFAULT_UTILIZATION_FILE, UtilizationReporter


def get_ip() -> str:
    """vLLM 0.5.4's get_ip (v0.5.4 vllm/utils.py:352-382, VLLM_HOST_IP or HOST_IP per envs.py:133-134): the
    environment's address, else the source address of a UDP socket towards a public address, else 0.0.0.0."""
    host_ip = os.environ.get("VLLM_HOST_IP", "") or os.environ.get("HOST_IP", "")
    if host_ip:
        return host_ip
    for family, target in ((socket.AF_INET, ("8.8.8.8", 80)), (socket.AF_INET6, ("2001:4860:4860::8888", 80))):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(target)  # nothing is sent: connect() on UDP only picks the route
                return probe.getsockname()[0]
        except OSError:
            pass
    warnings.warn("Failed to get the IP address, using 0.0.0.0 by default.The value can be set by the environment "
                  "variable VLLM_HOST_IP or HOST_IP.", stacklevel=2)
    return "0.0.0.0"


class RayWorkerWrapper:
    """A real Ray actor holding one GPU of the placement group; the work it stands for is simulated."""

    def __init__(self) -> None:
        self._gone = threading.Event()

    def get_node_ip(self) -> str:
        return get_ip()

    def get_node_and_gpu_ids(self) -> Tuple[str, List[int]]:
        import ray
        return ray.get_runtime_context().get_node_id(), [int(i) for i in ray.get_gpu_ids()]

    def get_pid(self) -> int:
        return os.getpid()

    def serve(self) -> None:
        """Runs until the actor dies: the driver's liveness watch holds this call, and Ray fails it with
        RayActorError (ActorDiedError) when the actor, its process or its node dies."""
        self._gone.wait()

    def write_utilization(self, nvml_indices: List[int], gpu: Optional[int], memory: Optional[int]) -> None:
        """The node's share of the simulated GPU utilisation, into the fake NVML's file on this node (the path
        of FAKE_NVML_UTILIZATION in the raylet's environment, else the fake NVML's default); None clears it."""
        reporter = UtilizationReporter(os.environ.get("FAKE_NVML_UTILIZATION", DEFAULT_UTILIZATION_FILE),
                                       nvml_indices)
        if gpu is None:
            reporter.clear()
        else:
            reporter.write({str(index): {"gpu": gpu, "memory": memory or 0} for index in nvml_indices})
