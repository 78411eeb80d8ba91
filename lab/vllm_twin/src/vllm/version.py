"""Version of the twin. The local version label `+sim` keeps `pip install vllm==0.5.4` matching it
(PEP 440: a specifier without a local label matches any local label) while every listing shows it is
a simulation."""
__version__ = "0.5.4+sim"
# The real 0.5.4 wheel's vllm/commit_id.py (reference/vllm-0.5.4-and-volta.md §0); the twin mimics that release.
__commit__ = "4db5176d9758b720b05460c50ace3c01026eb158"
__simulated__ = True
