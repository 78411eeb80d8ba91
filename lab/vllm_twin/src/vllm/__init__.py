"""vLLM *twin*: a simulation of one vLLM release's outward behaviour for the revive lab (no GPU needed).

This is not vLLM. It reproduces the release's command line, start-up checks and messages, KV-cache sizing,
OpenAI-compatible API and SSE format, Prometheus metrics and continuous-batching latency, calibrated to
the project's field notes, so that the unchanged production path (locked install, systemd unit, warm-up,
hand-over, load test, monitoring) can run on lab nodes. Which release (0.5.4, 0.8.5.post1, ...) is fixed when
the wheel is built (vllm/_twin/release.py). See lab/vllm_twin/README.md.
"""
from vllm.version import __commit__, __simulated__, __version__

__all__ = ["__version__", "__commit__", "__simulated__"]
