"""Releases on a GPU node: what runs, what ran before, and how to go back.

A *release* is the unit of change on a node (docs/design.md): the vLLM venv, the model revision and the
planned argv/environment of every replica. The node keeps a record, by default
``/var/lib/revive/releases.json``::

    {"schema": 1,
     "current":  {release the systemd units point at and that passed its start},
     "previous": {the release before it},
     "last_failure": {a release that failed to start or warm up, why, and what was restored}}

The units point at exactly one release: the vllm_service role renders them from a release dict built here
(`build_release`), so a rollback is the same template rendered from the recorded release. Used by
library/vllm_release.py (thin wiring); everything here is pure and unit-tested
(tests/unit/test_release*.py).

systemd quoting (`exec_start`, `environment_assignment`) follows systemd.service(5) "Command lines" and
systemd.exec(5) "Environment=": words are double-quoted when they need it, ``\\`` and ``"`` escaped, and
``%`` doubled because unit files expand specifiers; ``$`` is doubled in ExecStart= because systemd expands
``$VAR`` there (it does not in Environment=).
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

SCHEMA = 1
ID_LENGTH = 12
VENV_PINS_HASH_LENGTH = 8
# Keys of the planner's `pins` that are not Python packages (revive_releases / data/vllm-releases.yml).
NON_PACKAGE_PINS = ("cuda", "python")
# FlashAttention packages: vLLM 0.5.4 selects XFORMERS below compute capability 8.0 whatever is installed
# (reference/vllm-0.5.4-and-volta.md §1.3), and flash-attn 2.5.8 fails to build on V100 (field notes).
FLASH_ATTENTION_PACKAGES = ("flash-attn", "vllm-flash-attn")


class ReleaseError(Exception):
    """A release or the record cannot be used; the message says what, where and how to fix it."""


# --- package pins of a release venv --------------------------------------------------------------------

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
                         "XFORMERS (reference/vllm-0.5.4-and-volta.md §1.3)")
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


# --- CPU lists and pinning ------------------------------------------------------------------------------

def parse_cpu_list(text: str) -> List[int]:
    """'0-19,40-59' (or the kernel's /sys list, or systemd's space-separated form) -> sorted CPU indices."""
    cpus: Set[int] = set()
    for part in re.split(r"[,\s]+", (text or "").strip()):
        if not part:
            continue
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise ReleaseError(f"CPU list {text!r}: {part!r} is not N or N-M")
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        if high < low:
            raise ReleaseError(f"CPU list {text!r}: range {part!r} runs backwards")
        cpus.update(range(low, high + 1))
    return sorted(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    ordered = sorted(set(cpus))
    ranges: List[str] = []
    start = previous = None
    for cpu in ordered + [None]:
        if cpu is not None and previous is not None and cpu == previous + 1:
            previous = cpu
            continue
        if start is not None:
            ranges.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = cpu
    return ",".join(ranges)


@dataclass(frozen=True)
class Pinning:
    cpu_affinity: Optional[str]
    numa_node: Optional[int]
    note: Optional[str]


def host_pinning(replica: Dict[str, Any], online_cpus: Sequence[int], numa_nodes: Sequence[int], simulated: bool,
                 host: str) -> Pinning:
    """The planner's CPU/NUMA pinning of a replica, as the unit applies it on this host.

    On real GPUs the plan's CPUs and NUMA node come from NVML on this very host, so they must exist; a
    mismatch means the plan is for another machine and is refused. On the lab's simulated GPUs the plan
    describes the simulated server, not the host that runs the twin: the pinning is recorded in the unit
    as a comment and not applied (it would name CPUs and nodes the host does not have).
    """
    planned = [int(c) for c in replica.get("cpus") or []]
    numa = replica.get("numa_node")
    if not planned:
        return Pinning(None, None, None)
    planned_text = format_cpu_list(planned)
    if simulated:
        return Pinning(None, None, f"planned CPUs {planned_text}, NUMA node {numa}: not applied, the GPUs are "
                                   "simulated and this host is not the planned server")
    missing = sorted(set(planned) - set(online_cpus))
    if missing:
        raise ReleaseError(f"{replica.get('name')}: the plan pins CPUs {planned_text} but {host} has no online CPUs "
                           f"{format_cpu_list(missing)} (online: {format_cpu_list(online_cpus) or 'none'}); the plan "
                           "is for other hardware: run the preflight (probe and plan) on this host again")
    if numa is not None and int(numa) not in set(numa_nodes):
        raise ReleaseError(f"{replica.get('name')}: the plan binds memory to NUMA node {numa} but {host} has nodes "
                           f"{format_cpu_list(numa_nodes) or 'none'}; run the preflight on this host again")
    return Pinning(planned_text, None if numa is None else int(numa), None)


# --- systemd quoting ------------------------------------------------------------------------------------

# Words of only these characters need no quotes (no space, quote, backslash, `%` specifier or `$` variable).
_SAFE_WORD = re.compile(r"[A-Za-z0-9_@+=:,./-]+")


def _escape(text: str, dollar: bool) -> str:
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if dollar:
        text = text.replace("$", "$$")
    for char, escaped in (("\n", "\\n"), ("\t", "\\t")):
        text = text.replace(char, escaped)
    return text


def exec_word(word: str) -> str:
    """One argument of ExecStart=, quoted only when systemd would otherwise split or expand it."""
    if word and _SAFE_WORD.fullmatch(word):
        return word
    return f'"{_escape(word, dollar=True)}"'


def exec_start(argv: Sequence[str]) -> str:
    if not argv or not str(argv[0]).startswith("/"):
        raise ReleaseError(f"ExecStart needs an absolute program path, got {list(argv)[:1]}")
    return " ".join(exec_word(str(word)) for word in argv)


def environment_assignment(name: str, value: Any) -> str:
    """One Environment= word: `"NAME=value"`, quoted and escaped."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
        raise ReleaseError(f"environment variable name {name!r} is not valid for systemd")
    return f'"{_escape(f"{name}={value}", dollar=False)}"'


def parse_exec_words(line: str) -> List[str]:
    """The argv systemd makes of an ExecStart= value rendered by `exec_start` (the inverse, for tests)."""
    words: List[str] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] == " ":
            i += 1
        if i >= n:
            break
        word = []
        quoted = line[i] == '"'
        if quoted:
            i += 1
        while i < n and (line[i] != '"' if quoted else line[i] != " "):
            char = line[i]
            if char == "\\" and i + 1 < n:
                word.append({"n": "\n", "t": "\t"}.get(line[i + 1], line[i + 1]))
                i += 2
                continue
            if char in "%$" and i + 1 < n and line[i + 1] == char:
                word.append(char)
                i += 2
                continue
            word.append(char)
            i += 1
        i += 1 if quoted else 0
        words.append("".join(word))
    return words


# --- start deadline ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class StartTiming:
    base_seconds: int = 120
    load_bytes_per_second: int = 200_000_000
    per_rank_seconds: int = 5
    slack_seconds: int = 30
    restart_seconds: int = 10
    start_limit_burst: int = 3


def health_deadline(weight_bytes: int, tensor_parallel_size: int, timing: StartTiming) -> int:
    """Seconds from the process start until /health must answer 200.

    Process start-up, profiling and the port opening take a fixed part; loading the weights from local
    SSD takes time proportional to their bytes (field notes: 41 GB, cold start 1-2 minutes); NCCL set-up
    adds a little per rank.
    """
    if timing.load_bytes_per_second <= 0:
        raise ReleaseError("the start load rate (bytes per second) must be positive")
    load = math.ceil(max(int(weight_bytes or 0), 0) / timing.load_bytes_per_second)
    return int(timing.base_seconds + load + timing.per_rank_seconds * max(int(tensor_parallel_size or 1), 1))


def start_limit_interval(start_timeout: int, restart_seconds: int, burst: int) -> int:
    """StartLimitIntervalSec= long enough that `burst` failed starts (each up to TimeoutStartSec, then
    RestartSec) fall inside it: a shorter window never reaches the limit and the unit loops forever."""
    return int(burst * (start_timeout + restart_seconds) + start_timeout)


# --- releases -------------------------------------------------------------------------------------------

IDENTITY_KEYS = ("vllm_version", "venv", "venv_stamp", "python", "model")


def release_id(release: Dict[str, Any]) -> str:
    """A digest of what the units run: venv (and its build), model (and its bytes), every replica's argv,
    environment and pinning. Timestamps and derived timing are not part of it."""
    identity = {key: release.get(key) for key in IDENTITY_KEYS}
    identity["replicas"] = [{key: replica.get(key) for key in ("name", "port", "argv", "env", "cpu_affinity",
                                                               "numa_node")}
                            for replica in release.get("replicas") or []]
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:ID_LENGTH]


def _model_path(args: Sequence[str]) -> Optional[str]:
    args = list(args)
    for index, word in enumerate(args):
        if word == "--model" and index + 1 < len(args):
            return args[index + 1]
        if word.startswith("--model="):
            return word.split("=", 1)[1]
    return None


@dataclass(frozen=True)
class HostView:
    """What the module read on the node."""

    name: str
    online_cpus: Tuple[int, ...] = ()
    numa_nodes: Tuple[int, ...] = ()
    venv_stamp: Optional[str] = None
    model_content_id: Optional[str] = None


def build_release(plan: Dict[str, Any], venv: str, host: HostView, timing: StartTiming,
                  extra_environment: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The release the units will run, from the planner's release (vllm_plan's `release`, the host fact
    revive_release) and the venv the runtime role built for it.

    ExecStart is the venv's python, the plan's entrypoint, then the replica's argv exactly as planned.
    The plan's environment wins over `extra_environment` (the role's defaults such as usage-stats opt-out).
    """
    for key in ("vllm_version", "entrypoint", "replicas"):
        if not plan.get(key):
            raise ReleaseError(f"the release for {host.name} has no {key!r}: pass the planner's release (host fact "
                               "revive_release from the preflight), not a partial dict")
    if not venv.startswith("/"):
        raise ReleaseError(f"the release venv {venv!r} is not an absolute path")
    python = f"{venv.rstrip('/')}/bin/python"
    simulated = bool((plan.get("gpu") or {}).get("simulated"))
    model = plan.get("model") or {}
    weight_bytes = int(model.get("weight_bytes") or 0)
    replicas: List[Dict[str, Any]] = []
    model_paths: Set[str] = set()
    names: Set[str] = set()
    ports: Set[int] = set()
    for replica in plan["replicas"]:
        name = str(replica.get("name") or "")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
            raise ReleaseError(f"replica name {name!r} cannot name a systemd unit")
        port = int(replica["port"])
        if name in names or port in ports:
            raise ReleaseError(f"replica {name} (port {port}) repeats a name or port of another replica")
        names.add(name)
        ports.add(port)
        args = [str(arg) for arg in replica.get("args") or []]
        path = _model_path(args)
        if path is None:
            raise ReleaseError(f"replica {name} has no --model in its argv {args}")
        model_paths.add(path)
        env = {str(k): str(v) for k, v in (extra_environment or {}).items()}
        env.update({str(k): str(v) for k, v in (replica.get("env") or {}).items()})
        argv = [python] + [str(word) for word in plan["entrypoint"]] + args
        pinning = host_pinning(replica, host.online_cpus, host.numa_nodes, simulated, host.name)
        tensor_parallel_size = int(replica.get("tensor_parallel_size") or plan.get("tensor_parallel_size") or 1)
        deadline = health_deadline(weight_bytes, tensor_parallel_size, timing)
        replicas.append({
            "name": name, "unit": f"{name}.service", "port": port, "argv": argv, "env": env,
            "exec_start": exec_start(argv),
            "environment": [environment_assignment(k, env[k]) for k in sorted(env)],
            "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES", ""),
            "gpus": list(replica.get("gpus") or []), "tensor_parallel_size": tensor_parallel_size,
            "cpu_affinity": pinning.cpu_affinity, "numa_node": pinning.numa_node, "pinning_note": pinning.note,
            "health_deadline_seconds": deadline, "start_timeout_seconds": deadline + timing.slack_seconds,
            "start_limit_interval_seconds": start_limit_interval(deadline + timing.slack_seconds,
                                                                 timing.restart_seconds, timing.start_limit_burst),
        })
    if len(model_paths) != 1:
        raise ReleaseError(f"the replicas load different models {sorted(model_paths)}; a release serves one model")
    release = {
        "vllm_version": str(plan["vllm_version"]), "venv": venv.rstrip("/"), "python": python,
        "venv_stamp": host.venv_stamp,
        "model": {"path": model_paths.pop(), "content_id": host.model_content_id, "weight_bytes": weight_bytes},
        "args": replicas[0]["argv"][1 + len(plan["entrypoint"]):], "replicas": replicas, "simulated": simulated,
    }
    release["id"] = release_id(release)
    return release


def summary(release: Optional[Dict[str, Any]]) -> str:
    """'release 3f9a1c2e0b7d (vLLM 0.5.4, venv ..., model ...)' for messages."""
    if not release:
        return "no release"
    return (f"release {release.get('id')} (vLLM {release.get('vllm_version')}, venv {release.get('venv')}, "
            f"model {(release.get('model') or {}).get('path')})")


# --- the record -----------------------------------------------------------------------------------------

@dataclass
class Record:
    current: Optional[Dict[str, Any]] = None
    previous: Optional[Dict[str, Any]] = None
    last_failure: Optional[Dict[str, Any]] = None

    def as_dict(self) -> Dict[str, Any]:
        return {"schema": SCHEMA, "current": self.current, "previous": self.previous,
                "last_failure": self.last_failure}

    def text(self) -> str:
        return json.dumps(self.as_dict(), indent=1, sort_keys=True) + "\n"


def load_record(text: Optional[str], where: str) -> Record:
    """The record from the file's text (None or empty: a node that never had a release)."""
    if text is None or not text.strip():
        return Record()
    try:
        data = json.loads(text)
    except ValueError as error:
        raise ReleaseError(f"{where} is not JSON ({error}); it is the node's release record: restore it from a "
                           "backup, or remove it to forget the node's releases (no rollback until the next one)") \
            from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ReleaseError(f"{where} is not a release record of schema {SCHEMA} (found "
                           f"{data.get('schema') if isinstance(data, dict) else type(data).__name__}); remove it to "
                           "start a new record")
    for key in ("current", "previous", "last_failure"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise ReleaseError(f"{where}: {key} is not an object")
    for key in ("current", "previous"):
        if data.get(key) is not None and not data[key].get("id"):
            raise ReleaseError(f"{where}: {key} has no id")
    return Record(data.get("current"), data.get("previous"), data.get("last_failure"))


def same_release(a: Optional[Dict[str, Any]], b: Optional[Dict[str, Any]]) -> bool:
    return bool(a) and bool(b) and a.get("id") == b.get("id")


def promote(record: Record, release: Dict[str, Any], now: str) -> Tuple[Record, bool]:
    """The release passed its start: it becomes current, the current one becomes previous."""
    if same_release(record.current, release):
        return record, False
    promoted = dict(release, recorded_at=now)
    previous = record.current if record.current else record.previous
    return Record(promoted, previous, record.last_failure), True


@dataclass(frozen=True)
class RollbackTarget:
    target: Optional[Dict[str, Any]]
    failed: Optional[Dict[str, Any]]
    failed_was_current: bool


def rollback_target(record: Record, failed_id: str) -> RollbackTarget:
    """Which release to restore when `failed_id` failed ('' = the release recorded as current).

    During the switch the new release is not yet recorded, so the current one is restored; after the switch
    (a failed warm-up, issue 7) the failed release is current and the previous one is restored.
    """
    current = record.current
    if not failed_id or (current and current.get("id") == failed_id):
        if not current:
            return RollbackTarget(None, None, False)
        return RollbackTarget(record.previous, current, True)
    return RollbackTarget(current, None, False)


def record_rollback(record: Record, failed: Dict[str, Any], restored: Optional[Dict[str, Any]], serving: bool,
                    message: str, now: str) -> Record:
    """After a rollback: the restored release is current (the units point at it), the failure is kept."""
    failure = {"release": {k: failed.get(k) for k in ("id", "vllm_version", "venv", "model", "args")},
               "message": message, "at": now, "restored": restored.get("id") if restored else None,
               "restored_serving": serving}
    if restored is None:
        return Record(None, None, failure)
    if same_release(record.current, restored):
        return Record(record.current, record.previous, failure)
    # The failed release had been promoted: the restored one (its previous) is current again, and nothing
    # older is known.
    return Record(restored, None, failure)


def stale_units(current: Optional[Dict[str, Any]], desired: Dict[str, Any]) -> List[str]:
    """Units of the current release that the desired one no longer has (a plan with fewer replicas)."""
    keep = {replica["unit"] for replica in desired.get("replicas") or []}
    return sorted(replica["unit"] for replica in (current or {}).get("replicas") or [] if replica["unit"] not in keep)


# --- venv pruning ---------------------------------------------------------------------------------------

def venvs_to_prune(venvs: Sequence[Tuple[str, float]], keep: int, protected: Iterable[Optional[str]]) -> List[str]:
    """Release venvs to remove: all but the `keep` newest (by build time) and the protected ones (the
    desired, current and previous releases'), which are never removed."""
    if keep < 0:
        raise ReleaseError(f"keep must be >= 0, got {keep}")
    guard = {path.rstrip("/") for path in protected if path}
    newest_first = [path.rstrip("/") for path, _ in sorted(venvs, key=lambda item: (-item[1], item[0]))]
    kept = set(newest_first[:keep]) | guard
    return sorted(path for path in newest_first if path not in kept)


# --- journal excerpt of a failed start -----------------------------------------------------------------

def _message(entry: Dict[str, Any]) -> str:
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # journalctl -o json writes non-UTF-8 messages as byte arrays
        message = bytes(int(b) & 0xFF for b in message).decode("utf-8", "replace")
    return str(message if message is not None else "")


def journal_excerpt(entries: Sequence[Dict[str, Any]], lines: int, redact: Sequence[str] = (),
                    since_usec: int = 0) -> List[str]:
    """The last `lines` messages of one run of a unit, from `journalctl -u UNIT -o json` entries (oldest first).

    A run is an invocation: its output carries _SYSTEMD_INVOCATION_ID, systemd's own messages about it
    INVOCATION_ID. With `since_usec` (a switch's start, CLOCK_REALTIME in microseconds) it is the first run
    that began after it - the start that failed, not a later automatic restart, nor the old run being stopped;
    without, the last run (a failed warm-up of the running release). Without invocation ids, the last entries.
    Secrets in `redact` are masked, in case a process printed one.
    """
    first_seen: Dict[str, int] = {}
    for entry in entries:
        for key in ("_SYSTEMD_INVOCATION_ID", "INVOCATION_ID"):
            invocation = entry.get(key)
            if invocation:
                stamp = int(entry.get("__REALTIME_TIMESTAMP") or 0)
                first_seen[invocation] = min(first_seen.get(invocation, stamp), stamp)
    if since_usec:
        candidates = [i for i, stamp in first_seen.items() if stamp >= since_usec]
        chosen_id = min(candidates, key=lambda i: first_seen[i]) if candidates else None
    else:
        chosen_id = max(first_seen, key=lambda i: first_seen[i]) if first_seen else None
    if chosen_id is not None:
        chosen = [e for e in entries if chosen_id in (e.get("_SYSTEMD_INVOCATION_ID"), e.get("INVOCATION_ID"))]
    elif since_usec:
        chosen = [e for e in entries if int(e.get("__REALTIME_TIMESTAMP") or 0) >= since_usec]
    else:
        chosen = list(entries)
    messages = [_message(entry) for entry in chosen][-lines:] if lines > 0 else []
    for secret in (s for s in redact if s):
        messages = [message.replace(secret, "********") for message in messages]
    return messages
