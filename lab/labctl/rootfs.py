"""The Debian 12 root filesystem every lab host starts from: debootstrapped once, cached, never half-built."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from .errors import LabError

SUITE = "bookworm"
VARIANT = "minbase"
DEFAULT_MIRROR = "http://deb.debian.org/debian"

# Lab hosts cannot reach a Debian mirror, so everything a role later installs "from the distribution's
# packages" must already be here, which makes that install a no-op in the lab:
#   haproxy        the front door (lb); its unit is left disabled, the lb role enables it
#   python3-apt    ansible.builtin.apt needs it on the target and would otherwise try to apt-get it
#   acl            become_user to an unprivileged user needs setfacl for Ansible's temporary files
#   python3-venv   the runtime and probe venvs
#   libjansson4    the fake libnvidia-ml.so.1 reads its JSON profile with jansson (lab/fakenvml/Makefile)
#   prometheus, prometheus-alertmanager, prometheus-blackbox-exporter
#                  the monitor host (roles/monitoring, entry point main); units left disabled, the role enables them
#   prometheus-node-exporter
#                  every GPU node (entry point exporters); unit left disabled, the role enables it
#   dbus           node exporter's systemd collector talks to systemd over the system bus
#   nftables       every GPU node's guard (roles/node_firewall); nftables.service itself stays as Debian ships it
#   keepalived     a second front door (lb2): VRRP holds frontdoor_vip (roles/frontdoor, docs/frontdoor-ha.md); its
#                  unit is left disabled, the role enables it where a VIP is set
PACKAGES = (
    "acl", "ca-certificates", "curl", "dbus", "haproxy", "iproute2", "iputils-ping", "keepalived", "less",
    "libjansson4", "nftables", "openssh-server", "procps", "prometheus", "prometheus-alertmanager",
    "prometheus-blackbox-exporter", "prometheus-node-exporter", "python3", "python3-apt", "python3-venv", "rsync",
    "sudo", "systemd", "systemd-sysv",
)

# Bump when customize() changes: the cache key covers it, so an old rootfs is never reused by mistake.
RECIPE_VERSION = 2

# Units that do nothing useful in a lab host without a network to Debian, a disk or a terminal, and would
# otherwise fail later (apt-daily) and turn `systemctl is-system-running` to degraded, and the packaged services
# that a role enables where it wants them (haproxy on lb, prometheus* on monitor and the GPU nodes).
DISABLED_UNITS = {
    "multi-user.target.wants": ("haproxy.service", "keepalived.service", "e2scrub_reap.service", "prometheus.service",
                                "prometheus-alertmanager.service", "prometheus-blackbox-exporter.service",
                                "prometheus-node-exporter.service"),
    "timers.target.wants": ("apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer"),
}

SSHD_DROPIN = """\
# revive lab: root logs in with the lab's key only; one ed25519 host key per host, made by `bin/lab up`.
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""

RESOLV_CONF = "# revive lab: no DNS server; every lab host is named in /etc/hosts.\n"


def recipe() -> dict:
    return {"suite": SUITE, "variant": VARIANT, "packages": sorted(PACKAGES), "recipe": RECIPE_VERSION}


def cache_key() -> str:
    return hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()[:12]


def cache_dir() -> Path:
    return Path(os.environ.get("REVIVE_LAB_CACHE", "/var/cache/revive-lab"))


def customize(root: Path) -> None:
    """Turn a fresh debootstrap into the shared lower layer; per-host identity is added at `up` time."""
    # Host keys made here would be shared by every host; `up` writes one per host instead.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/revive-lab.conf").write_text(SSHD_DROPIN)
    (root / "etc/machine-id").write_text("")
    resolv = root / "etc/resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text(RESOLV_CONF)
    for wants, units in DISABLED_UNITS.items():
        for unit in units:
            link = root / "etc/systemd/system" / wants / unit
            if link.is_symlink():
                link.unlink()
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    (root / "etc/revive-lab-rootfs").write_text(json.dumps({"key": cache_key(), **recipe()}, indent=1) + "\n")


def ensure_rootfs(log=print) -> Path:
    """The cached rootfs for the current recipe, building it first if needed (under a lock, atomically)."""
    base = cache_dir()
    final = base / f"rootfs-{cache_key()}"
    if final.is_dir():
        return final
    if shutil.which("debootstrap") is None:
        raise LabError("debootstrap is not installed; the lab builds its Debian 12 rootfs with it: "
                       "apt-get install debootstrap")
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir():  # another lab built it while we waited for the lock
            return final
        build_dir = base / f".building-{cache_key()}"
        if build_dir.exists():  # left by an interrupted build; never reused
            shutil.rmtree(build_dir)
        mirror = os.environ.get("REVIVE_LAB_MIRROR", DEFAULT_MIRROR)
        log_file = base / f"rootfs-{cache_key()}.log"
        log(f"rootfs: building {final.name} with debootstrap ({SUITE}, {len(PACKAGES)} packages from "
            f"{mirror}); log: {log_file}")
        started = time.monotonic()
        argv = ["debootstrap", f"--variant={VARIANT}", f"--include={','.join(sorted(PACKAGES))}",
                SUITE, str(build_dir), mirror]
        with open(log_file, "w") as out:
            rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            tail = "".join(log_file.read_text(errors="replace").splitlines(keepends=True)[-5:])
            raise LabError(f"debootstrap failed (exit {rc}) building {build_dir}; last lines of {log_file}:\n"
                           f"{tail}Check that {mirror} is reachable, or set REVIVE_LAB_MIRROR to a Debian mirror.")
        debootstrap_s = time.monotonic() - started
        customize(build_dir)
        os.rename(build_dir, final)
        log(f"rootfs: cold build took {time.monotonic() - started:.1f} s "
            f"(debootstrap {debootstrap_s:.1f} s) -> {final}")
    return final
