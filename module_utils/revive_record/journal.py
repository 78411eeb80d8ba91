"""The journal excerpt of a failed start: the messages of one run of a unit, secrets masked."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence


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
    Besides its own messages, a run holds every message in its time: from its first message to the next run's
    start as systemd (PID 1) logged it. journald takes a process's invocation id from the unit's cgroup when it
    handles the line, and a short-lived process - an ExecStartPre= check that prints why it refuses and exits - may
    be handled late: after Restart= began the next run (the line then carries the next run's id), or after the
    process is gone (no id). Secrets in `redact` are masked, in case a process printed one.
    """
    first_seen: Dict[str, int] = {}
    started: Dict[str, int] = {}    # by systemd's own messages (INVOCATION_ID), written as the run begins
    for entry in entries:
        stamp = int(entry.get("__REALTIME_TIMESTAMP") or 0)
        for key in ("_SYSTEMD_INVOCATION_ID", "INVOCATION_ID"):
            invocation = entry.get(key)
            if invocation:
                first_seen[invocation] = min(first_seen.get(invocation, stamp), stamp)
                if key == "INVOCATION_ID":
                    started[invocation] = min(started.get(invocation, stamp), stamp)
    if since_usec:
        candidates = [i for i, stamp in first_seen.items() if stamp >= since_usec]
        chosen_id = min(candidates, key=lambda i: first_seen[i]) if candidates else None
    else:
        chosen_id = max(first_seen, key=lambda i: first_seen[i]) if first_seen else None
    if chosen_id is not None:
        start = first_seen[chosen_id]
        end = min((started.get(i, stamp) for i, stamp in first_seen.items()
                   if i != chosen_id and started.get(i, stamp) > start), default=None)

        def in_run(entry: Dict[str, Any]) -> bool:
            if chosen_id in (entry.get("_SYSTEMD_INVOCATION_ID"), entry.get("INVOCATION_ID")):
                return True
            stamp = int(entry.get("__REALTIME_TIMESTAMP") or 0)
            return stamp >= start and (end is None or stamp < end)
        chosen = [e for e in entries if in_run(e)]
    elif since_usec:
        chosen = [e for e in entries if int(e.get("__REALTIME_TIMESTAMP") or 0) >= since_usec]
    else:
        chosen = list(entries)
    messages = [_message(entry) for entry in chosen][-lines:] if lines > 0 else []
    for secret in (s for s in redact if s):
        messages = [message.replace(secret, "********") for message in messages]
    return messages


def units_to_quote(states: Sequence[Dict[str, Any]], units: Sequence[str]) -> List[str]:
    """Which units of a failed release a rollback quotes the journal of: those not active, then those active but
    restarted by systemd; when none is either (a failed warm-up of a running release), all of `units`.

    `states` are the systemd_service results of reading the units before they are stopped (`name`, and
    `status` with ActiveState and NRestarts); a result without `status` is left out.
    """
    read = [state for state in states if isinstance(state.get("status"), Mapping)]
    units = list(units)
    down = [state["name"] for state in read if state["status"].get("ActiveState") != "active"]
    restarted = [state["name"] for state in read if state["status"].get("ActiveState") == "active"
                 and str(state["status"].get("NRestarts")) != "0"]
    return (down + restarted) or units
