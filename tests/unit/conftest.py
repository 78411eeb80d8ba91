"""The unit suite's order for pytest-xdist: the longest files first.

`make unit` runs the suite on four workers with `--dist loadfile` (a file's tests stay on one worker, with its
module-scoped fixtures: a twin, a Ray cluster, a venv) and `--no-loadscope-reorder`, so files are handed out in the
order below. xdist's own reorder sorts files by their number of tests, which sent the few long tests of the files
that build real venvs or Ray clusters last, and one worker then ran them alone at the end. Longest first, the other
workers take the many short files meanwhile (docs/performance.md §3).

LAST: files whose checks time a twin's latency on a time scale (0.2: a 1 s stall of its process reads as 5
simulated seconds). Among the long files at the start they failed the SLO they must pass (a clean-clone make test,
2026-12-07: the field notes' level 64 at P95 13.5 simulated s against 12); at the end, beside the last short files,
they pass, as they always did under xdist's own order, which sent them last too.

LONGEST: the files whose tests took longest, in seconds summed over their tests (setup included; junit XML of a full
run on 2 cores, 2026-12-07), longest first. A file not named keeps its place after them. Refresh it from
`pytest -n 4 --dist loadfile --junitxml=unit.xml tests/unit` when a file grows past the last one here; a stale list
makes the suite slower, never wrong.
"""
from __future__ import annotations

from pathlib import Path

LONGEST = (
    "test_monitoring_role.py",  # 226 s
    "test_runtime_role.py",  # 222 s
    "test_twin_ray.py",  # 188 s
    "test_nvitop_exporter_lock.py",  # 146 s
    "test_module_bounds.py",  # 97 s
    "test_slo_gate.py",  # 70 s
    "test_nccl_module.py",  # 70 s
    "test_release_module.py",  # 63 s
    "test_sync_modules.py",  # 55 s
    "test_plan_module.py",  # 47 s
    "test_warmup_module.py",  # 46 s
    "test_twin_releases.py",  # 45 s
    "test_venv_build.py",  # 43 s
    "test_twin_085.py",  # 43 s
    "test_frontdoor_ha.py",  # 43 s
    "test_twin_wheelhouse.py",  # 42 s
)


LAST = (
    "test_bench_field_notes.py",  # 107 s
)


def order_key(path: Path) -> int:
    """A file's place: its index in LONGEST; after all of them when not named; LAST's after every other file."""
    if path.name in LAST:
        return len(LONGEST) + 1 + LAST.index(path.name)
    try:
        return LONGEST.index(path.name)
    except ValueError:
        return len(LONGEST)


def pytest_collection_modifyitems(items):
    # sorted() is stable: the tests of one file, and the files not named, keep their collected order
    items[:] = sorted(items, key=lambda item: order_key(Path(str(item.path))))
