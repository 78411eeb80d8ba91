"""HAProxy's runtime API (the stats socket at `level admin`) for the front door: server states and draining.

Used by library/haproxy_server.py on the LB host (HAProxy 2.6, Debian 12's, docs/facts/lb-and-rolling.md §0.1)
and by the lab's front-door sampler. Standard library only, Python 3.9+.

Facts this relies on (docs/facts/lb-and-rolling.md §2, checked on 2.6.12):
- `set server BE/SRV state ready|drain|maint` answers nothing on success and a line of text on error
  ("No such server.", "No such backend.", "Permission denied"...).
- `show servers state BE`: `srv_op_state` (0 stopped, 1 starting, 2 running, 3 stopping) and the
  `srv_admin_state` bit mask: 0x01 FMAINT (forced by the API), 0x02 IMAINT (inherited), 0x04 CMAINT (the
  config's `disabled`), 0x08 FDRAIN, 0x10 IDRAIN, 0x20 RMAINT (DNS), 0x40 HMAINT. CMAINT stays set after
  `state ready` on a server configured `disabled`, and such a server serves: it is not part of MAINT here.
- `show stat BE 4 -1` (CSV): per server `qcur` (queued on it), `scur` (in flight: a running stream counts
  until its last byte is relayed), `status` (UP, DOWN, DRAIN, MAINT, "UP 1/2"...).
- A drained server is idle when its `scur` and `qcur` are both 0 (§2.3); with `option redispatch` its queue
  moves to other servers (§0.3). This says nothing about requests sent to the node directly (the warm-up):
  the rolling play also reads vLLM's own gauges.
"""
from __future__ import annotations

import csv
import io
import socket
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

FMAINT, IMAINT, CMAINT, FDRAIN, IDRAIN, RMAINT, HMAINT = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40
MAINT_MASK = FMAINT | IMAINT | RMAINT | HMAINT
DRAIN_MASK = FDRAIN | IDRAIN
TARGETS = ("ready", "drain", "maint")
OP_STATES = {0: "stopped", 1: "starting", 2: "running", 3: "stopping"}
ERROR_PREFIXES = ("No such", "Unknown command", "Permission denied", "Require ", "'set server", "Invalid",
                  "Can't", "Unexpected", "Missing")

# One runtime API command in, its answer out.
Send = Callable[[str], str]


class HAProxyError(Exception):
    """The runtime API refused or could not be reached; the message says where and what to do."""


def socket_sender(path: str, timeout: float = 10.0) -> Send:
    """Commands over the UNIX stats socket, one connection each (non-interactive mode closes after the answer)."""

    def send(command: str) -> str:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(path)
                sock.sendall(command.encode() + b"\n")
                chunks = []
                while True:
                    data = sock.recv(65536)
                    if not data:
                        break
                    chunks.append(data)
        except FileNotFoundError as error:
            raise HAProxyError(f"HAProxy's stats socket {path} does not exist: is haproxy running, and does its "
                               "global section have `stats socket ... level admin` at that path?") from error
        except PermissionError as error:
            raise HAProxyError(f"no permission on HAProxy's stats socket {path}: run as root or in group haproxy "
                               "(become: true)") from error
        except OSError as error:
            raise HAProxyError(f"cannot talk to HAProxy on {path}: {error}") from error
        return b"".join(chunks).decode("utf-8", errors="replace")

    return send


def _checked(send: Send, command: str) -> str:
    answer = send(command)
    first = answer.strip().splitlines()[0] if answer.strip() else ""
    if first.startswith(ERROR_PREFIXES):
        raise HAProxyError(f"HAProxy refused `{command}`: {answer.strip()}")
    return answer


@dataclass
class ServerState:
    """One server as HAProxy sees it: admin mode (ours to set), health status and load."""
    name: str
    mode: str               # ready | drain | maint (from srv_admin_state)
    admin_state: int
    op_state: str           # stopped | starting | running | stopping
    status: str             # show stat's status: UP, DOWN, DRAIN, MAINT, "UP 1/2", "no check"...
    scur: int
    qcur: int
    address: str

    def idle(self) -> bool:
        return self.scur == 0 and self.qcur == 0

    def serving(self) -> bool:
        """Takes new load-balanced requests: ready and not DOWN (a starting server counts as it gets traffic)."""
        return self.mode == "ready" and not self.status.startswith(("DOWN", "MAINT", "DRAIN", "NOLB"))

    def as_dict(self) -> Dict[str, object]:
        return asdict(self)


def admin_mode(admin_state: int) -> str:
    if admin_state & MAINT_MASK:
        return "maint"
    if admin_state & DRAIN_MASK:
        return "drain"
    return "ready"


def parse_servers_state(text: str) -> Dict[Tuple[str, str], Dict[str, str]]:
    """`show servers state` -> {(backend, server): fields}; the header line names the fields (schema 1)."""
    lines = [line for line in text.splitlines() if line.strip()]
    header: List[str] = []
    rows: Dict[Tuple[str, str], Dict[str, str]] = {}
    for line in lines:
        if line.startswith("#"):
            header = line.lstrip("#").split()
            continue
        if not header or line.strip() == "1":
            continue  # the format version line
        values = line.split()
        row = dict(zip(header, values))
        if "be_name" in row and "srv_name" in row:
            rows[(row["be_name"], row["srv_name"])] = row
    return rows


def parse_show_stat(text: str) -> Dict[Tuple[str, str], Dict[str, str]]:
    """`show stat` CSV -> {(proxy, server): fields}; the first line is `# pxname,svname,...`."""
    body = text.lstrip()
    if body.startswith("# "):
        body = body[2:]
    reader = csv.DictReader(io.StringIO(body))
    return {(row["pxname"], row["svname"]): row for row in reader if row.get("pxname")}


def _int(value: Optional[str]) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def read_servers(send: Send, backend: str, names: Sequence[str]) -> Dict[str, ServerState]:
    """The servers `names` of `backend`; a missing one is an error naming what the backend has."""
    states = parse_servers_state(_checked(send, f"show servers state {backend}"))
    stats = parse_show_stat(_checked(send, f"show stat {backend} 4 -1"))
    known = sorted(server for (be, server) in states if be == backend)
    missing = [name for name in names if (backend, name) not in states]
    if missing:
        raise HAProxyError(f"backend {backend} has no server {', '.join(missing)} (it has: {', '.join(known) or 'none'}); "
                           "render the front door's configuration first (role frontdoor)")
    result = {}
    for name in names:
        state = states[(backend, name)]
        stat = stats.get((backend, name), {})
        admin = _int(state.get("srv_admin_state"))
        result[name] = ServerState(name=name, mode=admin_mode(admin), admin_state=admin,
                                   op_state=OP_STATES.get(_int(state.get("srv_op_state")), "unknown"),
                                   status=stat.get("status", ""), scur=_int(stat.get("scur")),
                                   qcur=_int(stat.get("qcur")),
                                   address=f"{state.get('srv_addr', '')}:{state.get('srv_port', '')}")
    return result


def list_servers(send: Send, backend: str) -> Dict[str, ServerState]:
    """Every server of `backend`."""
    states = parse_servers_state(_checked(send, f"show servers state {backend}"))
    names = [server for (be, server) in states if be == backend]
    if not names:
        raise HAProxyError(f"HAProxy has no backend {backend!r} with servers")
    return read_servers(send, backend, names)


def set_mode(send: Send, backend: str, name: str, target: str) -> None:
    if target not in TARGETS:
        raise HAProxyError(f"state {target!r} is not one of {', '.join(TARGETS)}")
    _checked(send, f"set server {backend}/{name} state {target}")


@dataclass
class Outcome:
    changed: bool
    before: Dict[str, Dict[str, object]]
    after: Dict[str, Dict[str, object]]
    waited_s: float = 0.0
    polls: int = 0


def ensure(send: Send, backend: str, names: Sequence[str], target: Optional[str], check_mode: bool,
           wait_idle: bool = False, timeout_s: float = 300.0, interval_s: float = 1.0,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """Put every server of `names` into `target` (None: only read), then optionally wait until they are idle.

    `changed` is True only when a server's admin mode differs from `target`; load (scur) never counts.
    In check mode nothing is sent but reads, and there is no wait.
    """
    before = read_servers(send, backend, names)
    to_change = [name for name in names if target and before[name].mode != target]
    if check_mode:
        after = {name: ServerState(**{**before[name].as_dict(), "mode": target}) if name in to_change else before[name]
                 for name in names}
        return Outcome(bool(to_change), {n: s.as_dict() for n, s in before.items()},
                       {n: s.as_dict() for n, s in after.items()})
    for name in to_change:
        set_mode(send, backend, name, target)  # type: ignore[arg-type]
    start = clock()
    polls = 0
    current = read_servers(send, backend, names) if to_change else before
    if wait_idle:
        while True:
            polls += 1
            busy = {n: s for n, s in current.items() if not s.idle()}
            if not busy:
                break
            waited = clock() - start
            if waited >= timeout_s:
                raise HAProxyError(
                    f"backend {backend}: still busy after {timeout_s:g} s: " +
                    ", ".join(f"{n} scur={s.scur} qcur={s.qcur} ({s.status})" for n, s in busy.items()) +
                    "; long streams may need a larger wait timeout (the longest generation plus queueing)")
            sleep(min(interval_s, max(0.0, timeout_s - waited)))
            current = read_servers(send, backend, names)
    return Outcome(bool(to_change), {n: s.as_dict() for n, s in before.items()},
                   {n: s.as_dict() for n, s in current.items()}, round(clock() - start, 2) if wait_idle else 0.0,
                   polls)


