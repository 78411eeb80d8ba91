"""revive bench: the SLO acceptance load test of a vLLM (or any OpenAI-compatible) endpoint, standard library only.

client (raw-socket streaming HTTP/1.1) -> probe (the server's traits) -> load (closed/open-loop levels) -> metrics
(TTFT, E2E, TPOT, ITL per request) -> stats (percentiles, order-statistic bounds) -> verdict (PASS / FAIL /
INCONCLUSIVE / INVALID, knee, recommendation) -> report (requests.jsonl, summary.json, levels.csv, report.md);
run wires them. Modules import each other relatively, so the package also runs copied to a host as a plain
top-level package (next to revive_sse.py). docs/bench.md documents every definition and rule.
"""
from __future__ import annotations

BENCH_VERSION = "0.1.0"
