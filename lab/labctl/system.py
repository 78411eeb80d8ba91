"""Namespaces, links, mounts, cgroups and nspawn processes: the host-side resources a lab is made of.

Every function takes the exact name or path it acts on; nothing here searches by pattern and removes
what it finds, so `down` can only remove what `up` recorded. Commands are argv lists.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .errors import LabError

REQUIRED_TOOLS = {
    "systemd-nspawn": "systemd-container",
    "ip": "iproute2",
    "ssh-keygen": "openssh-client",
    "ldconfig": "libc-bin",
    "nft": "nftables",
}


def run(argv: list[str], what: str, stdin: str | None = None) -> str:
    """Run a command (given `stdin`, else none); on failure raise a LabError that says what we were doing and what
    the tool said."""
    proc = subprocess.run(argv, input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
        raise LabError(f"{what} failed: `{' '.join(argv)}`: {said}")
    return proc.stdout


def check_host() -> None:
    """Refuse early, with the fix, when this machine cannot run the lab."""
    if os.geteuid() != 0:
        raise LabError("the lab needs root (network namespaces, mounts, systemd-nspawn): run `sudo bin/lab ...`")
    missing = [f"{tool} (package {pkg})" for tool, pkg in REQUIRED_TOOLS.items() if shutil.which(tool) is None]
    if missing:
        raise LabError(f"missing tools: {', '.join(missing)}; on Debian: apt-get install "
                       f"{' '.join(sorted({REQUIRED_TOOLS[t.split()[0]] for t in missing}))}")
    if not Path("/proc/self/ns/net").exists():
        raise LabError("this kernel has no network namespaces (/proc/self/ns/net is missing); the lab needs them")


# --- links and namespaces ---------------------------------------------------------------------------

def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def ipv4_addresses_in_use() -> list[str]:
    """Every IPv4 address/prefix configured on this host's interfaces (to pick a free lab subnet)."""
    data = json.loads(run(["ip", "-j", "-4", "addr", "show"], "listing addresses") or "[]")
    return [f"{a['local']}/{a['prefixlen']}" for link in data for a in link.get("addr_info", [])]


def create_bridge(name: str, address_cidr: str) -> None:
    run(["ip", "link", "add", name, "type", "bridge"], f"creating bridge {name}")
    run(["ip", "addr", "add", address_cidr, "dev", name], f"addressing bridge {name}")
    run(["ip", "link", "set", name, "up"], f"bringing up bridge {name}")


def create_netns(name: str) -> None:
    try:
        run(["ip", "netns", "add", name], f"creating network namespace {name}")
    except LabError as exc:
        raise LabError(f"{exc}\nThe lab needs network namespaces (`ip netns add` as root).") from exc


def connect_netns(netns: str, host_if: str, bridge: str, address_cidr: str, gateway: str) -> None:
    """A veth pair: `host_if` on the bridge, `eth0` inside the namespace with the host's address."""
    run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", netns],
        f"creating veth {host_if} for {netns}")
    run(["ip", "link", "set", host_if, "master", bridge, "up"], f"attaching {host_if} to {bridge}")
    for argv in (["ip", "-n", netns, "link", "set", "lo", "up"],
                 ["ip", "-n", netns, "addr", "add", address_cidr, "dev", "eth0"],
                 ["ip", "-n", netns, "link", "set", "eth0", "up"],
                 ["ip", "-n", netns, "route", "add", "default", "via", gateway]):
        run(argv, f"configuring eth0 in {netns}")


def delete_netns(name: str) -> None:
    if netns_exists(name):
        run(["ip", "netns", "delete", name], f"deleting network namespace {name}")


def delete_link(name: str) -> None:
    try:
        if link_exists(name):
            run(["ip", "link", "delete", name], f"deleting link {name}")
    except LabError:
        # A veth also goes away, asynchronously, with its peer's namespace; only a link still there is an error.
        if link_exists(name):
            raise


# --- partitions between two hosts (nftables on the lab's bridge) ------------------------------------
# One table of the bridge family per lab, made on the first cut: a set of (in port, out port) pairs of the bridge and
# one rule that drops every frame forwarded between such a pair. Only the bridge forwards between the lab's veths, so
# a pair in the set is a path cut in the "switch" while each host keeps its link to every other host.

def cut_table(bridge: str) -> str:
    return f"{bridge}_cuts"


def cut_pairs(bridge: str) -> set[tuple[str, str]]:
    """The (in port, out port) pairs the bridge drops now; none when the table is not there."""
    proc = subprocess.run(["nft", "-j", "list", "set", "bridge", cut_table(bridge), "cut"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return set()
    found = set()
    for item in json.loads(proc.stdout)["nftables"]:
        for element in item.get("set", {}).get("elem", []):
            found.add(tuple(element["concat"]))
    return found


def set_cut(bridge: str, a_if: str, b_if: str, cut: bool) -> bool:
    """Drop (cut) or forward again every frame between bridge ports a_if and b_if, both ways; whether it changed."""
    pairs = {(a_if, b_if), (b_if, a_if)}
    have = cut_pairs(bridge)
    if (pairs <= have) if cut else not (pairs & have):
        return False
    table = cut_table(bridge)
    elements = ", ".join(f'"{i}" . "{o}"' for i, o in sorted(pairs if cut else pairs & have))
    script = "\n".join([
        f"add table bridge {table}",
        f"add set bridge {table} cut {{ type ifname . ifname; }}",
        f"add chain bridge {table} forward {{ type filter hook forward priority 0; policy accept; }}",
        f"flush chain bridge {table} forward",
        f"add rule bridge {table} forward iifname . oifname @cut drop",
        f"{'add' if cut else 'delete'} element bridge {table} cut {{ {elements} }}",
    ]) + "\n"
    run(["nft", "-f", "-"], f"{'cutting' if cut else 'restoring'} the path between {a_if} and {b_if} on {bridge}",
        stdin=script)
    return True


def cut_table_exists(bridge: str) -> bool:
    return subprocess.run(["nft", "list", "table", "bridge", cut_table(bridge)], stdin=subprocess.DEVNULL,
                          capture_output=True).returncode == 0


def delete_cut_table(bridge: str) -> None:
    if cut_table_exists(bridge):
        run(["nft", "delete", "table", "bridge", cut_table(bridge)], f"deleting nftables table {cut_table(bridge)}")


# --- mounts -----------------------------------------------------------------------------------------

def mount_points() -> set[str]:
    """Mount points in this mount namespace (field 5 of mountinfo, octal escapes decoded)."""
    points = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        raw = line.split()[4]
        points.add(raw.encode().decode("unicode_escape"))
    return points


def is_mounted(path: Path) -> bool:
    return str(path) in mount_points()


def mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    run(["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={lower},upperdir={upper},workdir={work}",
         str(target)], f"mounting the overlay root at {target}")


def unmount(path: Path) -> None:
    if is_mounted(path):
        run(["umount", str(path)], f"unmounting {path}")


# --- cgroups ----------------------------------------------------------------------------------------

def systemd_cgroup_parents() -> list[Path]:
    """The cgroup directories (this process's own, in the hierarchies systemd uses) to nest containers under.

    systemd-nspawn --keep-unit puts its payload/ and supervisor/ cgroups inside the cgroup it starts in;
    two containers started from the same cgroup would share payload/, so each gets a cgroup of its own.
    """
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            own["cgroup2"] = path
        elif controllers == "name=systemd":
            own["name=systemd"] = path
    parents = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fstype, _, options = right.split()[:3]
        mount_point = left.split()[4]
        root = left.split()[3]
        if fstype == "cgroup2" and "cgroup2" in own:
            key = "cgroup2"
        elif fstype == "cgroup" and "name=systemd" in options.split(",") and "name=systemd" in own:
            key = "name=systemd"
        else:
            continue
        relative = os.path.relpath(own.pop(key), root)
        parents.append(Path(mount_point) / relative)
    return parents


def create_cgroups(name: str) -> list[str]:
    paths = []
    for parent in systemd_cgroup_parents():
        path = parent / name
        path.mkdir(exist_ok=True)
        paths.append(str(path))
    return paths


def remove_cgroup(path: Path) -> None:
    """Remove a cgroup and the sub-cgroups the container's systemd made in it, deepest first."""
    if not path.is_dir():
        return
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        sub.rmdir()
    path.rmdir()


# --- processes --------------------------------------------------------------------------------------

def process_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat for a live (not zombie) process: with the PID it identifies a process
    even after PIDs are reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def is_same_process(pid: int, start_time: int) -> bool:
    """True while the systemd-nspawn recorded as (pid, start time) runs; a reused PID never matches."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return comm == "systemd-nspawn" and process_start_time(pid) == start_time


def start_nspawn(root: Path, machine: str, netns: str, cgroups: list[str], log_path: Path) -> tuple[int, int]:
    """Boot `root` with systemd as PID 1 in `netns`, detached from this process; returns (pid, start time)."""
    argv = ["systemd-nspawn", "--quiet", f"--directory={root}", f"--machine={machine}", "--boot",
            "--register=no", "--keep-unit", f"--network-namespace-path=/run/netns/{netns}",
            "--console=passive", "--link-journal=no", "--resolv-conf=off", "--timezone=off",
            # The host's own firewall (roles/node_firewall) loads nftables rules: allowed in its own namespace only
            "--capability=CAP_NET_ADMIN"]

    def enter_cgroups() -> None:
        for path in cgroups:
            Path(path, "cgroup.procs").write_text(str(os.getpid()))

    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=enter_cgroups)
    start_time = process_start_time(proc.pid)
    if start_time is None:
        raise LabError(f"systemd-nspawn for {machine} exited at once; see {log_path}")
    # The lab outlives this command; mark the Popen as finished so Python does not warn about it.
    proc.returncode = 0
    return proc.pid, start_time


def stop_processes(processes: list[tuple[int, int]], grace_s: float = 10.0) -> None:
    """SIGTERM each nspawn (a clean container halt), then SIGKILL what is left after `grace_s`."""
    live = [(pid, st) for pid, st in processes if is_same_process(pid, st)]
    for pid, _ in live:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        live = [(pid, st) for pid, st in live if is_same_process(pid, st) and not _reap(pid)]
        if live:
            time.sleep(0.05)
    for pid, _ in live:
        for child in _children(pid):
            _signal(child, signal.SIGKILL)
        _signal(pid, signal.SIGKILL)
    while [p for p, st in live if is_same_process(p, st) and not _reap(p)]:
        time.sleep(0.05)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> bool:
    """Collect the exit status if `pid` is our child (it is when `up` and `down` run in one process)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == pid


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            return []
        raise
