"""The node's release record: load it, promote a release, which release a rollback restores, what it records."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ansible.module_utils.revive_record import ReleaseError

SCHEMA = 1


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

