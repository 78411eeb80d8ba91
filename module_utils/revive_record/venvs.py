"""The exact pins of a release venv and its name; which old release venvs to remove."""
from __future__ import annotations

import hashlib
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ansible.module_utils.revive_record import ReleaseError

VENV_PINS_HASH_LENGTH = 8
# Keys of the planner's `pins` that are not Python packages (revive_releases / data/vllm-releases.yml).
NON_PACKAGE_PINS = ("cuda", "python")
# FlashAttention packages: vLLM 0.5.4 selects XFORMERS below compute capability 8.0 whatever is installed
# (docs/facts/vllm-volta.md §1.3), and flash-attn 2.5.8 fails to build on V100 (docs/field-report.md
# ('Software stack that worked')).
FLASH_ATTENTION_PACKAGES = ("flash-attn", "vllm-flash-attn")


# --- package pins ----------------------------------------------------------------------------------------

def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def cc_below_8(compute_capability: Any) -> bool:
    """'7.0' -> True, '8.0' -> False; an unknown capability counts as modern (no exclusion)."""
    match = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?\s*", str(compute_capability or ""))
    return bool(match) and int(match.group(1)) < 8


def venv_packages(pins: Dict[str, Any], compute_capability: Any) -> Tuple[List[str], List[str]]:
    """The exact pins a release venv must hold (its lock pins them and everything else), and what was left out.

    The planner's pins hold non-package keys (cuda, python) and, for 0.5.4, vllm-flash-attn; below CC 8.0
    FlashAttention is never asked for.
    """
    volta = cc_below_8(compute_capability)
    packages: List[str] = []
    notes: List[str] = []
    for name in sorted(pins, key=_canonical):
        if name in NON_PACKAGE_PINS:
            continue
        if volta and _canonical(name) in FLASH_ATTENTION_PACKAGES:
            notes.append(f"{name}=={pins[name]} left out: compute capability {compute_capability} < 8.0 runs "
                         "XFORMERS (docs/facts/vllm-volta.md §1.3)")
            continue
        packages.append(f"{name}=={pins[name]}")
    return packages, notes


def venv_name(vllm_version: str, packages: Sequence[str], python: str, lock_sha256: str = "") -> str:
    """`<version>-<hash>`: the hash covers the pins, the interpreter and the lock, so a new Python or a
    regenerated lock never rebuilds the venv a running release uses in place."""
    digest = hashlib.sha256("\n".join(sorted(packages) + [python] + ([lock_sha256] if lock_sha256 else [])).encode())
    return f"{vllm_version}-{digest.hexdigest()[:VENV_PINS_HASH_LENGTH]}"


def python_satisfies(version: str, spec: str) -> bool:
    """'3.11.2' against '>=3.8,<3.13' (the release data's python pin)."""
    def key(text: str) -> Tuple[int, ...]:
        parts = [int(p) for p in re.findall(r"\d+", text)[:3]]
        return tuple(parts + [0] * (3 - len(parts)))

    have = key(version)
    for clause in (c.strip() for c in spec.split(",") if c.strip()):
        match = re.fullmatch(r"(>=|<=|==|<|>|!=)\s*([\d.]+)", clause)
        if not match:
            raise ReleaseError(f"python pin clause {clause!r} in {spec!r} is not like '>=3.8'")
        op, bound = match.group(1), key(match.group(2))
        # '==3.11' means any 3.11.x, as pip reads a version with fewer parts.
        width = len(re.findall(r"\d+", match.group(2)))
        if op in ("==", "!=") and width < 3:
            equal = have[:width] == bound[:width]
            ok = equal if op == "==" else not equal
        else:
            ok = {">=": have >= bound, "<=": have <= bound, "<": have < bound, ">": have > bound,
                  "==": have == bound, "!=": have != bound}[op]
        if not ok:
            return False
    return True


# --- pruning ------------------------------------------------------------------------------------------

def venvs_to_prune(venvs: Sequence[Tuple[str, float]], keep: int, protected: Iterable[Optional[str]]) -> List[str]:
    """Release venvs to remove: all but the `keep` newest (by build time) and the protected ones (the
    desired, current and previous releases'), which are never removed."""
    if keep < 0:
        raise ReleaseError(f"keep must be >= 0, got {keep}")
    guard = {path.rstrip("/") for path in protected if path}
    newest_first = [path.rstrip("/") for path, _ in sorted(venvs, key=lambda item: (-item[1], item[0]))]
    kept = set(newest_first[:keep]) | guard
    return sorted(path for path in newest_first if path not in kept)

