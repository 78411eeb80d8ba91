"""Wait, over SSH with paramiko, until booted lab hosts answer and systemd has finished starting up."""
from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import paramiko

from .errors import LabError

READY_STATES = ("running", "degraded")


@dataclass
class HostReadiness:
    name: str
    address: str
    system_state: str
    seconds: float
    failed_units: str = ""


def _connect(address: str, key: Path, known_hosts: Path, timeout: float) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    # Host keys come from the lab's known_hosts only: an unknown or different key is an error, not a prompt.
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(address, username="root", key_filename=str(key), timeout=timeout, banner_timeout=timeout,
                   auth_timeout=timeout, allow_agent=False, look_for_keys=False)
    return client


def run_command(client: paramiko.SSHClient, command: str, timeout: float) -> tuple[int, str]:
    _, stdout, _ = client.exec_command(command, timeout=timeout)
    output = stdout.read().decode(errors="replace").strip()
    return stdout.channel.recv_exit_status(), output


def wait_for_host(name: str, address: str, key: Path, known_hosts: Path, deadline: float,
                  started: float) -> HostReadiness:
    last_error = "no attempt yet"
    while time.monotonic() < deadline:
        try:
            client = _connect(address, key, known_hosts, timeout=min(3.0, max(0.5, deadline - time.monotonic())))
        except paramiko.BadHostKeyException as exc:
            raise LabError(f"{name} ({address}) presented a host key that is not the one in {known_hosts}: "
                           f"{exc}; run `bin/lab down` then `bin/lab up`") from exc
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise LabError(f"{name} ({address}) is not in {known_hosts}; run `bin/lab down` then "
                               f"`bin/lab up` to rewrite it") from exc
            last_error = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
            continue
        except (OSError, socket.timeout, EOFError) as exc:
            # Not listening yet, or sshd still starting: normal during boot.
            last_error = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
            continue
        with client:
            # --wait returns once systemd has finished starting up (or failed to).
            _, state = run_command(client, "systemctl is-system-running --wait",
                                   timeout=max(1.0, deadline - time.monotonic()))
            failed = ""
            if state == "degraded":
                _, failed = run_command(client, "systemctl --failed --no-legend --plain", timeout=10)
        if state not in READY_STATES:
            raise LabError(f"{name} ({address}): systemd reports {state!r} after boot, expected running or "
                           f"degraded; inspect with `bin/lab ssh {name} systemctl --failed`")
        return HostReadiness(name, address, state, time.monotonic() - started, failed)
    raise LabError(f"{name} ({address}) did not answer SSH before the deadline (last error: {last_error}); "
                   f"see its console log, and `bin/lab status`")


def wait_for_hosts(hosts: list[tuple[str, str]], key: Path, known_hosts: Path,
                   timeout_s: float = 120.0) -> list[HostReadiness]:
    """Wait for every (name, address) in parallel; raises a LabError naming the first host that failed."""
    started = time.monotonic()
    deadline = started + timeout_s
    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        futures = [pool.submit(wait_for_host, name, address, key, known_hosts, deadline, started)
                   for name, address in hosts]
        return [f.result() for f in futures]


def query_system_state(name: str, address: str, key: Path, known_hosts: Path) -> str:
    """One quick look for `status`: systemd's state, or why the host cannot be asked."""
    try:
        with _connect(address, key, known_hosts, timeout=2.0) as client:
            return run_command(client, "systemctl is-system-running", timeout=5)[1] or "unknown"
    except (OSError, socket.timeout, paramiko.SSHException, EOFError) as exc:
        return f"unreachable ({type(exc).__name__})"
