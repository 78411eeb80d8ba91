"""The release matrix (`bin/revive releases`): every vLLM release of data/vllm-releases.yml on every compute
capability and GPU set that matters here, judged by the planner's own release rule.

Nothing in this file decides whether a release runs: each cell is `revive_plan.rules.release_for` run for that
release pinned on that GPU set (or the planner's default, for "picked"), so the matrix cannot drift from what
`site.yml` would plan. Installability is a column of its own: the hardware cells are judged with a mirror as the
package source, and the `pypi` column says whether the public index can install the release today (0.5.4: no,
its lock needs a distribution PyPI removed).

Per release: status, lowest CC, engine and attention backend on each CC of CCS, pins, locks (one per Python,
complete or listing what is missing), PyPI installability with its reason and remedy, known issues (the
refusal and experimental reasons the planner gives on those CCs, then the release's `known_issues`),
and for each GPU set whether a pinned plan would take it and whether the planner picks it by default.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible.module_utils.revive_lockfile import lock_file_name, parse_lock
from ansible.module_utils.revive_plan.gpus import gpu_set_from_facts, synthetic_gpu_facts
from ansible.module_utils.revive_plan.inputs import Decisions, Overrides, PackageSource, PlanRefusal
from ansible.module_utils.revive_plan.rules import release_for
from ansible.module_utils.revive_releases import ReleaseData

# Volta (V100), Turing (T4), Ampere (A100), Hopper (H100/H200).
CCS: Tuple[Tuple[int, int], ...] = ((7, 0), (7, 5), (8, 0), (9, 0))
# Hardware cells are judged as if a mirror served the release: installability is the `pypi` column's business.
MIRROR = PackageSource(type="mirror", index_url="https://mirror.example/simple")


def _judge(data: ReleaseData, facts: Dict[str, Any], version: Optional[str],
           source: PackageSource = MIRROR) -> Dict[str, Any]:
    """release_for on one GPU set: {"ok": True, "version", "warnings"} or {"ok": False, "reason"}."""
    decisions = Decisions()
    gpus = gpu_set_from_facts(facts, (), decisions)
    try:
        release = release_for(gpus, data, Overrides(vllm_version=version), decisions, source)
    except PlanRefusal as refusal:
        return {"ok": False, "reason": refusal.reason, "source": refusal.source}
    return {"ok": True, "version": release.version, "engine": release.engine_for(gpus.cc),
            "attention_backend": release.attention_backend_for(gpus.cc), "warnings": decisions.warnings}


def _cc_facts(cc: Tuple[int, int], driver_branch: int, cuda_driver: str) -> Dict[str, Any]:
    """A one-GPU set of compute capability `cc` on a driver new enough for every release (the cell judges the
    release against the CC; drivers are judged on the named GPU sets, whose facts carry their own)."""
    facts = synthetic_gpu_facts(1, 32, f"{cc[0]}.{cc[1]}")
    facts["driver_branch"] = driver_branch
    facts["driver_version"] = f"{driver_branch}.00"
    facts["cuda_driver_version"] = cuda_driver
    return facts


def _locks(version: str, pythons: Sequence[str], lock_dir: str) -> List[Dict[str, Any]]:
    out = []
    for python in pythons:
        name = lock_file_name(version, str(python))
        path = os.path.join(lock_dir, name)
        if not os.path.isfile(path):
            out.append({"python": str(python), "file": name, "present": False, "missing": []})
            continue
        with open(path, encoding="utf-8") as handle:
            lock = parse_lock(handle.read(), name)
        out.append({"python": str(python), "file": name, "present": True, "missing": list(lock.missing),
                    "distributions": len(lock.entries)})
    return out


def matrix(data: ReleaseData, lock_dir: str, gpu_sets: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """The matrix as data (`revive releases --json`). `gpu_sets`: name -> GPU facts (nvml_facts' `gpu`)."""
    drivers = [data.release(v).driver for v in data.versions()]
    newest_branch = max(int(d["min_branch"]) for d in drivers)
    newest_cuda = max((str(d["cuda_driver_min"]) for d in drivers if d.get("cuda_driver_min")),
                      key=lambda text: tuple(int(part) for part in text.split(".")), default="12.0")
    defaults = {name: _judge(data, facts, None, PackageSource()) for name, facts in gpu_sets.items()}
    rows = []
    for version in data.versions():
        release = data.release(version)
        by_cc = {}
        for cc in CCS:
            cell = _judge(data, _cc_facts(cc, newest_branch, newest_cuda), version)
            by_cc[f"{cc[0]}.{cc[1]}"] = cell
        on_sets = {name: _judge(data, facts, version) for name, facts in gpu_sets.items()}
        lock = release.raw.get("lock") or {}
        installability = release.installability
        issues = sorted({cell["reason"] for cell in by_cc.values() if not cell["ok"]} |
                        {w for cell in by_cc.values() if cell["ok"] for w in cell["warnings"]
                         if "experimental" in w})
        # then the failures the data records that the release rule does not refuse, each with its source
        issues += [f"on {item['scope']}: {item['issue']} ({item['source']})" for item in release.known_issues]
        rows.append({
            "version": version,
            "status": release.status,
            "min_compute_capability": f"{release.min_compute_capability[0]}.{release.min_compute_capability[1]}",
            "pins": dict(release.pins),
            "by_cc": by_cc,
            "gpu_sets": on_sets,
            "picked_for": sorted(name for name, cell in defaults.items() if cell.get("version") == version),
            "locks": _locks(version, lock.get("pythons") or [], lock_dir),
            "pypi": None if installability is None else installability.pypi,
            "installability": None if installability is None else {
                "reason": installability.reason, "remedy": installability.remedy},
            "known_issues": issues,
        })
    return {"ccs": [f"{cc[0]}.{cc[1]}" for cc in CCS], "gpu_sets": sorted(gpu_sets), "defaults": defaults,
            "releases": rows,
            "note": "cells: the planner's release rule with the release pinned and a mirror as the package source "
                    "(installability is the pypi column); picked: the planner's default with PyPI as the source"}


def _cell(cell: Dict[str, Any]) -> str:
    if not cell["ok"]:
        return "refused"
    experimental = any("experimental" in w for w in cell["warnings"])
    return f"{cell['engine']}/{cell['attention_backend']}{' (exp.)' if experimental else ''}"


def _lock_text(locks: List[Dict[str, Any]]) -> str:
    if not locks:
        return "none"
    parts = []
    for lock in locks:
        state = "missing file" if not lock["present"] else (
            f"incomplete: {len(lock['missing'])} missing" if lock["missing"] else "complete")
        parts.append(f"py{lock['python']} {state}")
    return ", ".join(parts)


def format_matrix(result: Dict[str, Any]) -> str:
    """The human table: one line per release and CC, then per GPU set, then the issues."""
    ccs = result["ccs"]
    head = ["release", "status"] + [f"CC {cc}" for cc in ccs] + ["PyPI today", "locks"]
    lines = []
    table = [head]
    for row in result["releases"]:
        pypi = "yes" if row["pypi"] else ("mirror only" if row["pypi"] is False else "unknown")
        table.append([row["version"], row["status"]] + [_cell(row["by_cc"][cc]) for cc in ccs] +
                     [pypi, _lock_text(row["locks"])])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines += ["  ".join(value.ljust(width) for value, width in zip(r, widths)).rstrip() for r in table]
    lines.append("")
    for name in result["gpu_sets"]:
        default = result["defaults"][name]
        picked = default["version"] if default["ok"] else f"none ({default['reason']})"
        runs = [row["version"] for row in result["releases"] if row["gpu_sets"][name]["ok"]]
        lines.append(f"{name}: the planner picks {picked}; a pinned plan runs {', '.join(runs) or 'none'}")
    lines.append("")
    for row in result["releases"]:
        for issue in row["known_issues"]:
            lines.append(f"{row['version']}: {issue}")
        if row["pypi"] is False and row["installability"]:
            lines.append(f"{row['version']}: not installable from PyPI: {row['installability']['reason']}")
    lines.append("")
    lines.append(result["note"])
    return "\n".join(lines)
