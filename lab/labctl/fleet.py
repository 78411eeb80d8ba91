"""up / down / status / set-profile: a lab's life, composed from rootfs, system, access, ready and state."""
from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import shutil
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import access, ready, rootfs, state, system
from .errors import LabError
from .shape import LabShape, controller_address, host_address, profile_path, slot_network
from .state import HostRecord, LabState

REPO = Path(__file__).resolve().parents[2]
PROFILES_DIR = REPO / "lab/profiles"
FAKENVML_DIR = REPO / "lab/fakenvml"
FAKENVML_LIBRARY = FAKENVML_DIR / "libnvidia-ml.so.1"
# Where the NVIDIA driver installs it on Debian/Ubuntu, and where the fake library reads its profile.
NODE_LIBRARY_PATH = "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
NODE_PROFILE_PATH = "etc/fake-nvml/profile.json"
PROJECT_FACT_CACHE = REPO / ".cache/facts"
SLOTS = 256


@dataclass(frozen=True)
class LabPaths:
    """Where one lab keeps its state; the project's lab is .lab/, Molecule's live in their own dirs."""

    state_dir: Path

    @property
    def is_project_lab(self) -> bool:
        return self.state_dir.resolve() == (REPO / ".lab").resolve()

    @property
    def inventory(self) -> Path:
        return REPO / "inventory/lab/hosts.yml" if self.is_project_lab else self.state_dir / "hosts.yml"

    @property
    def key(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        return self.state_dir / "ssh_config"

    @property
    def control_dir(self) -> Path:
        """OpenSSH connection masters for this lab (ControlPath); short, as socket paths are capped at 108 bytes."""
        return self.state_dir / "cp"

    @property
    def hosts_dir(self) -> Path:
        return self.state_dir / "hosts"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"


def default_state_dir() -> Path:
    return Path(os.environ.get("REVIVE_LAB_DIR", REPO / ".lab")).absolute()


@contextmanager
def locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def lab_prefix(slot: int) -> str:
    """The bridge's name and the prefix of the lab's namespaces and veths (interface names: 15 bytes max)."""
    return f"rvlab{slot}"


# --- up ---------------------------------------------------------------------------------------------

def up(paths: LabPaths, shape: LabShape, recreate: bool = False, log=print) -> LabState:
    started = time.monotonic()
    system.check_host()
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    with locked(paths.state_dir / ".lock"):
        existing = state.load(paths.state_dir)
        if existing is not None:
            if lab_is_running(existing) and not recreate:
                if same_hosts(existing.shape, shape):
                    return _already_up(paths, existing, shape, started, log)
                raise LabError(f"a lab with another shape is up in {paths.state_dir}: "
                               f"{existing.shape.describe()}; asked for {shape.describe()}. "
                               f"Run `bin/lab down` first, or `bin/lab up --recreate ...`")
            log("lab: removing the previous lab first" if recreate else
                "lab: found a stopped or half-made lab; removing what is left of it")
            teardown(paths, existing)
        if shape.nodes:
            build_fake_nvml()
        lower = rootfs.ensure_rootfs(log=log)
        key = access.ensure_lab_key(paths.state_dir)
        lab = _create(paths, shape, lower, key, log)
        prepared = time.monotonic()
        try:
            readiness = ready.wait_for_hosts([(h.name, h.address) for h in lab.hosts], key, paths.known_hosts)
        except LabError as exc:
            raise LabError(f"{exc}\nThe lab is left up for inspection (`bin/lab status`, console logs in "
                           f"{paths.logs_dir}); `bin/lab down` removes it.") from exc
        for r in readiness:
            if r.failed_units:
                log(f"lab: {r.name} is degraded; failed units:\n  " + r.failed_units.replace("\n", "\n  "))
        log(f"lab: up: {len(lab.hosts)} host(s) on {lab.bridge} ({slot_network(lab.slot)}) in "
            f"{time.monotonic() - started:.1f} s (prepare {prepared - started:.1f} s, "
            f"boot to SSH + systemd {time.monotonic() - prepared:.1f} s); inventory: {paths.inventory}")
        return lab


def same_hosts(a: LabShape, b: LabShape) -> bool:
    return a.nodes == b.nodes and a.support_hosts == b.support_hosts


def _already_up(paths: LabPaths, lab: LabState, shape: LabShape, started: float, log) -> LabState:
    for host, profile in shape.node_profiles.items():
        if lab.shape.node_profiles.get(host) != profile:
            _swap_profile(lab, host, profile, log)
    state.save(paths.state_dir, lab)
    write_access_files(paths, lab)
    ready.wait_for_hosts([(h.name, h.address) for h in lab.hosts], paths.key, paths.known_hosts, timeout_s=30)
    log(f"lab: already up with this shape ({lab.shape.describe()}); checked in "
        f"{time.monotonic() - started:.1f} s")
    return lab


def build_fake_nvml() -> None:
    """`make -C lab/fakenvml` (a no-op when current), so a plain `bin/lab up` never installs a stale library."""
    if (FAKENVML_DIR / "Makefile").exists():
        proc = subprocess.run(["make", "-s", "-C", str(FAKENVML_DIR)], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise LabError(f"building the fake NVML library failed (`make -C {FAKENVML_DIR}`):\n"
                           f"{(proc.stderr or proc.stdout).strip()}\nIt needs gcc, make and libjansson-dev.")
    if not FAKENVML_LIBRARY.exists():
        raise LabError(f"{FAKENVML_LIBRARY} is missing; build it with `make -C {FAKENVML_DIR}`")


def allocate_slot() -> int:
    """The lowest 10.213.N.0/24 that no interface on this host uses and no other lab has claimed."""
    in_use = [ipaddress.ip_interface(a).network for a in system.ipv4_addresses_in_use()]
    netns = _netns_names()
    for slot in range(SLOTS):
        prefix = lab_prefix(slot)
        taken = (any(net.overlaps(slot_network(slot)) for net in in_use) or system.link_exists(prefix)
                 or any(n.startswith(prefix + "-") for n in netns))
        if not taken:
            return slot
    raise LabError(f"no free lab subnet in 10.213.0.0/16 (all {SLOTS} in use); run `bin/lab down` in other labs")


def _netns_names() -> list[str]:
    netns_dir = Path("/run/netns")
    return [p.name for p in netns_dir.iterdir()] if netns_dir.is_dir() else []


def _create(paths: LabPaths, shape: LabShape, lower: Path, key: Path, log) -> LabState:
    paths.hosts_dir.mkdir(parents=True, exist_ok=True)
    paths.logs_dir.mkdir(parents=True, exist_ok=True)
    # Labs of other checkouts may be picking a subnet at the same moment.
    with locked(rootfs.cache_dir() / ".slots.lock"):
        slot = allocate_slot()
        bridge = prefix = lab_prefix(slot)
        lab = LabState(slot=slot, bridge=bridge, rootfs=str(lower), shape=shape, inventory=str(paths.inventory))
        for h in shape.hosts:
            host_dir = paths.hosts_dir / h.name
            lab.hosts.append(HostRecord(
                name=h.name, group=h.group, address=host_address(slot, h), gpu_profile=h.gpu_profile,
                netns=f"{prefix}-{h.name}", veth=f"{prefix}h{h.octet}", root=str(host_dir / "root"),
                upper=str(host_dir / "upper"), work=str(host_dir / "work"), log=str(paths.logs_dir / f"{h.name}.log")))
        # Recorded before anything is made, so an interrupted `up` leaves a state `down` can clean.
        state.save(paths.state_dir, lab)
        network = slot_network(slot)
        system.create_bridge(bridge, f"{controller_address(slot)}/{network.prefixlen}")
    etc_hosts = access.render_etc_hosts(lab, controller_address(slot))
    authorized = key.with_name(key.name + ".pub").read_text()
    host_keys = {}
    for h in lab.hosts:
        _make_root(h, lower, log)
        state.save(paths.state_dir, lab)
        host_keys[h.name] = (h.address, _personalize(h, etc_hosts, authorized))
        system.create_netns(h.netns)
        system.connect_netns(h.netns, h.veth, bridge, f"{h.address}/{network.prefixlen}", controller_address(slot))
        h.cgroups = system.create_cgroups(h.netns)
        state.save(paths.state_dir, lab)
        Path(h.log).write_text("")
        h.pid, h.start_time = system.start_nspawn(Path(h.root), h.name, h.netns, h.cgroups, Path(h.log))
        state.save(paths.state_dir, lab)
    access.write_text_atomic(paths.known_hosts, access.render_known_hosts(host_keys))
    write_access_files(paths, lab)
    return lab


def _make_root(h: HostRecord, lower: Path, log) -> None:
    """A copy-on-write root: overlayfs over the cached rootfs, or a full copy where overlayfs cannot mount."""
    root, upper, work = Path(h.root), Path(h.upper), Path(h.work)
    for d in (root, upper, work):
        d.mkdir(parents=True, exist_ok=True)
    try:
        system.mount_overlay(lower, upper, work, root)
    except LabError as exc:
        log(f"lab: overlayfs unavailable for {h.name} ({exc}); copying the rootfs instead (slower)")
        shutil.rmtree(upper)
        work.rmdir()
        root.rmdir()
        system.run(["cp", "-a", "--reflink=auto", str(lower), str(upper)], f"copying the rootfs for {h.name}")
        h.root, h.work = h.upper, None


def _personalize(h: HostRecord, etc_hosts: str, authorized_keys: str) -> str:
    """Identity, access and (on GPU nodes) the fake driver, written into the host's root before it boots."""
    root = Path(h.root)
    (root / "etc/hostname").write_text(h.name + "\n")
    (root / "etc/hosts").write_text(etc_hosts)
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    access.write_text_atomic(ssh_dir / "authorized_keys", authorized_keys, mode=0o600)
    if h.gpu_profile:
        library = root / NODE_LIBRARY_PATH
        shutil.copyfile(FAKENVML_LIBRARY, library)
        os.chmod(library, 0o755)
        (root / NODE_PROFILE_PATH).parent.mkdir(parents=True, exist_ok=True)
        _install_profile(root, h.gpu_profile)
        # As the driver's installer does: refresh the linker cache so dlopen("libnvidia-ml.so.1") finds it.
        system.run(["ldconfig", "-r", str(root)], f"running ldconfig in {h.name}'s root")
    return access.write_host_key(root, h.name)


def _install_profile(root: Path, name: str) -> None:
    source = profile_path(PROFILES_DIR, name)
    access.write_text_atomic(root / NODE_PROFILE_PATH, source.read_text())


def write_access_files(paths: LabPaths, lab: LabState) -> None:
    paths.control_dir.mkdir(exist_ok=True)
    access.write_text_atomic(paths.ssh_config, access.render_ssh_config(lab, paths.key, paths.known_hosts))
    inventory = Path(lab.inventory)
    inventory.parent.mkdir(parents=True, exist_ok=True)
    access.write_text_atomic(inventory, access.render_inventory(lab, paths.key, paths.known_hosts,
                                                                paths.control_dir))
    if paths.is_project_lab:
        # New lab hosts reuse old names: facts cached from the previous lab must not stand in for theirs.
        for h in lab.hosts:
            (PROJECT_FACT_CACHE / h.name).unlink(missing_ok=True)


# --- set-profile ------------------------------------------------------------------------------------

def set_profile(paths: LabPaths, host: str, profile: str, log=print) -> None:
    system.check_host()
    with locked(paths.state_dir / ".lock"):
        lab = _running_lab(paths)
        _swap_profile(lab, host, profile, log)
        state.save(paths.state_dir, lab)
        write_access_files(paths, lab)


def _swap_profile(lab: LabState, host: str, profile: str, log) -> None:
    record = lab.host(host)
    nodes = [h.name for h in lab.hosts if h.gpu_profile]
    if record is None or not record.gpu_profile:
        raise LabError(f"{host!r} is not a GPU node of this lab (GPU nodes: {', '.join(nodes) or 'none'})")
    _install_profile(Path(record.root), profile)
    log(f"lab: {host}: GPU profile {record.gpu_profile} -> {profile} (at /{NODE_PROFILE_PATH}; processes "
        f"that already initialised NVML keep the old one until they re-initialise)")
    record.gpu_profile = profile
    lab.shape.node_profiles[host] = profile


def reboot(paths: LabPaths, host: str, timeout_s: float = 120.0, log=print) -> None:
    """Halt one host as `systemctl reboot` would end it (SIGTERM to its nspawn: systemd stops every unit), boot the
    same root again in the same namespace, and wait for SSH and systemd. What the host wrote survives (its overlay's
    upper layer); what lived in /run and memory does not, as on a real reboot."""
    system.check_host()
    with locked(paths.state_dir / ".lock"):
        lab = _running_lab(paths)
        record = _known_host(lab, host)
        started = time.monotonic()
        system.stop_processes([(record.pid, record.start_time)], grace_s=60.0)
        record.pid, record.start_time = 0, 0
        state.save(paths.state_dir, lab)
        record.pid, record.start_time = system.start_nspawn(Path(record.root), record.name, record.netns,
                                                            record.cgroups, Path(record.log))
        state.save(paths.state_dir, lab)
        readiness = ready.wait_for_hosts([(record.name, record.address)], paths.key, paths.known_hosts,
                                         timeout_s=timeout_s)[0]
        log(f"lab: {host} rebooted: SSH and systemd ({readiness.system_state}) after "
            f"{time.monotonic() - started:.1f} s")


def set_link(paths: LabPaths, host: str, up: bool, log=print) -> None:
    """Cut (down) or restore (up) a host's only link, its veth on the lab's bridge: the host keeps running and
    sees nothing of it; every peer's packets to it are dropped, as when a cable or a switch port dies."""
    system.check_host()
    with locked(paths.state_dir / ".lock"):
        lab = _running_lab(paths)
        record = _known_host(lab, host)
        state_word = "up" if up else "down"
        system.run(["ip", "link", "set", record.veth, state_word], f"setting {host}'s link {state_word}")
        log(f"lab: {host}: link {record.veth} {state_word}")


def set_partition(paths: LabPaths, a: str, b: str, up: bool, log=print) -> None:
    """Cut (down) or restore (up) the path between two hosts in the lab's bridge, both ways: each keeps its link
    and reaches every other host; only the frames between these two are dropped, as when the switch path or VLAN
    between two racks fails (two front doors that no longer hear each other's VRRP but still reach the clients)."""
    system.check_host()
    with locked(paths.state_dir / ".lock"):
        lab = _running_lab(paths)
        first, second = _known_host(lab, a), _known_host(lab, b)
        if first.name == second.name:
            raise LabError(f"a partition needs two hosts, not {a} twice")
        changed = system.set_cut(lab.bridge, first.veth, second.veth, cut=not up)
        log(f"lab: {a} <-> {b}: path {'up' if up else 'down'}{'' if changed else ' already'}")


def _known_host(lab: LabState, host: str) -> HostRecord:
    record = lab.host(host)
    if record is None:
        raise LabError(f"unknown host {host!r} (lab hosts: {', '.join(h.name for h in lab.hosts)})")
    return record


def _running_lab(paths: LabPaths) -> LabState:
    lab = state.load(paths.state_dir)
    if lab is None:
        raise LabError(f"no lab is up in {paths.state_dir}; start one with `bin/lab up`")
    if not lab_is_running(lab):
        raise LabError(f"the lab in {paths.state_dir} is not (fully) running; `bin/lab down` then `bin/lab up`")
    return lab


def lab_is_running(lab: LabState) -> bool:
    return bool(lab.hosts) and all(h.pid and h.start_time and system.is_same_process(h.pid, h.start_time)
                                   for h in lab.hosts)


# --- down -------------------------------------------------------------------------------------------

def down(paths: LabPaths, log=print) -> None:
    system.check_host()
    with locked(paths.state_dir / ".lock"):
        lab = state.load(paths.state_dir)
        if lab is None:
            log(f"lab: nothing to take down in {paths.state_dir}")
            return
        started = time.monotonic()
        teardown(paths, lab)
        log(f"lab: down: removed {len(lab.hosts)} host(s), their namespaces, links, mounts and processes, "
            f"and bridge {lab.bridge} in {time.monotonic() - started:.1f} s; nothing left behind")


def teardown(paths: LabPaths, lab: LabState) -> None:
    system.stop_processes([(h.pid, h.start_time) for h in lab.hosts if h.pid and h.start_time])
    for h in lab.hosts:
        if h.work is not None:
            system.unmount(Path(h.root))
        for cgroup in h.cgroups:
            system.remove_cgroup(Path(cgroup))
        # The veth first: deleting it removes its peer at once, while a namespace's links go asynchronously.
        system.delete_link(h.veth)
        system.delete_netns(h.netns)
        host_dir = paths.hosts_dir / h.name
        if host_dir.exists() and not system.is_mounted(Path(h.root)):
            shutil.rmtree(host_dir)
    system.delete_link(lab.bridge)
    system.delete_cut_table(lab.bridge)
    _close_ssh_masters(paths.control_dir)
    for path in (Path(lab.inventory), paths.ssh_config, paths.known_hosts):
        path.unlink(missing_ok=True)
    left = leftovers(paths, lab)
    if left:
        raise LabError("`down` could not remove: " + "; ".join(left) + f" (state kept in {paths.state_dir})")
    state.forget(paths.state_dir)


def _close_ssh_masters(control_dir: Path) -> None:
    """Ask each OpenSSH connection master Ansible left for this lab to exit (its host is gone)."""
    if not control_dir.is_dir():
        return
    for socket_path in control_dir.iterdir():
        subprocess.run(["ssh", "-o", f"ControlPath={socket_path}", "-O", "exit", "lab-host"],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        socket_path.unlink(missing_ok=True)


def leftovers(paths: LabPaths, lab: LabState) -> list[str]:
    """What of this lab still exists on the host, found by looking at the system, not at the state file."""
    prefix = lab_prefix(lab.slot)
    found = [f"network namespace {n}" for n in _netns_names() if n.startswith(prefix + "-")]
    found += [f"link {n}" for n in sorted(os.listdir("/sys/class/net"))
              if n == lab.bridge or n.startswith(prefix + "h")]
    state_dir = str(paths.state_dir.resolve())
    found += [f"mount {m}" for m in sorted(system.mount_points()) if m.startswith(state_dir + "/")]
    found += [f"process {pid} ({cmd})" for pid, cmd in nspawn_processes(state_dir)]
    found += [f"cgroup {c}" for h in lab.hosts for c in h.cgroups if Path(c).exists()]
    found += [f"nftables table bridge {system.cut_table(lab.bridge)}"] if system.cut_table_exists(lab.bridge) else []
    return found


def nspawn_processes(state_dir: str) -> list[tuple[int, str]]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"systemd-nspawn") and any(
                a.startswith(f"--directory={state_dir}/".encode()) for a in argv):
            found.append((int(proc.name), b" ".join(argv).decode(errors="replace").strip()))
    return found


# --- status -----------------------------------------------------------------------------------------

def status(paths: LabPaths, query_hosts: bool = True) -> dict:
    lab = state.load(paths.state_dir)
    if lab is None:
        return {"state_dir": str(paths.state_dir), "up": False, "hosts": []}
    hosts = []
    for h in lab.hosts:
        running = bool(h.pid and h.start_time and system.is_same_process(h.pid, h.start_time))
        hosts.append({"name": h.name, "group": h.group, "address": h.address, "gpu_profile": h.gpu_profile,
                      "netns": h.netns, "veth": h.veth, "pid": h.pid, "running": running})
    if query_hosts and paths.known_hosts.exists():
        with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            states = pool.map(lambda h: ready.query_system_state(h["name"], h["address"], paths.key,
                                                                 paths.known_hosts) if h["running"] else "stopped",
                              hosts)
            for h, s in zip(hosts, states):
                h["system_state"] = s
    return {
        "state_dir": str(paths.state_dir), "up": lab_is_running(lab), "slot": lab.slot, "bridge": lab.bridge,
        "network": str(slot_network(lab.slot)), "controller": controller_address(lab.slot),
        "rootfs": lab.rootfs, "shape": lab.shape.to_json(), "inventory": lab.inventory,
        "key": str(paths.key), "known_hosts": str(paths.known_hosts), "ssh_config": str(paths.ssh_config),
        "hosts": hosts,
    }


def format_status(report: dict) -> str:
    if not report["hosts"]:
        return f"no lab in {report['state_dir']} (start one with `bin/lab up`)"
    lines = [f"lab in {report['state_dir']}: {'up' if report['up'] else 'NOT fully running'}, bridge "
             f"{report['bridge']} {report['network']}, inventory {report['inventory']}",
             f"{'HOST':<12} {'GROUP':<12} {'ADDRESS':<14} {'SYSTEMD':<12} GPU PROFILE"]
    for h in report["hosts"]:
        systemd_state = h.get("system_state", "running" if h["running"] else "stopped")
        lines.append(f"{h['name']:<12} {h['group']:<12} {h['address']:<14} {systemd_state:<12} "
                     f"{h['gpu_profile'] or '-'}")
    return "\n".join(lines)


def status_json(report: dict) -> str:
    return json.dumps(report, indent=1)
