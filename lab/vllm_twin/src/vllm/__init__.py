"""vLLM 0.5.4 *twin*: a simulation of vLLM 0.5.4's outward behaviour for the revive lab (no GPU needed).

This is not vLLM. It reproduces 0.5.4's command line, start-up checks and messages, KV-cache sizing,
OpenAI-compatible API and SSE format, Prometheus metrics and continuous-batching latency, calibrated to
the project's field notes, so that the unchanged production path (pip pin, systemd unit, warm-up,
hand-over, load test, monitoring) can run on lab nodes. See lab/vllm_twin/README.md.
"""
from vllm.version import __commit__, __simulated__, __version__

__all__ = ["__version__", "__commit__", "__simulated__"]
