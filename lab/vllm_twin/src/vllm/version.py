"""Version of the twin: `<release>+sim` of the release its wheel was built for (vllm/_twin/release.py).

The local version label `+sim` keeps `pip install vllm==0.8.5.post1` (or `==0.5.4`) matching it (PEP 440: a
specifier without a local label matches any local label) while every listing shows it is a simulation.
"""
from vllm._twin.release import current

__version__ = current().version
# The upstream commit of the simulated release (None where its wheel records none).
__commit__ = current().commit
__simulated__ = True
