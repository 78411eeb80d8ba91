"""The cached Debian rootfs: keyed by its recipe, customised for the lab, never used half-built."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab"))

from labctl import rootfs  # noqa: E402
from labctl.errors import LabError  # noqa: E402


def fake_debootstrap(bin_dir: Path, body: str) -> None:
    """A `debootstrap` on PATH that runs `body` (sh) with the target directory as $4."""
    script = bin_dir / "debootstrap"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("REVIVE_LAB_CACHE", str(tmp_path / "cache"))
    return tmp_path


def debootstrapped_tree(root: Path) -> None:
    """What a real debootstrap leaves that customize() changes."""
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True)
    for name in ("ssh_host_ed25519_key", "ssh_host_ed25519_key.pub", "ssh_host_rsa_key"):
        (root / "etc/ssh" / name).write_text("shared key")
    (root / "etc/machine-id").write_text("a6c44fb5d4434c3d9de6966cd5156457\n")
    (root / "etc/resolv.conf").write_text("nameserver 192.0.2.1\n")
    for wants, unit in [("multi-user.target.wants", "haproxy.service"), ("multi-user.target.wants", "ssh.service"),
                        ("timers.target.wants", "apt-daily.timer")]:
        (root / "etc/systemd/system" / wants).mkdir(parents=True, exist_ok=True)
        (root / "etc/systemd/system" / wants / unit).symlink_to(f"/lib/systemd/system/{unit}")
    (root / "var/cache/apt/archives").mkdir(parents=True)
    (root / "var/cache/apt/archives/haproxy_2.6.deb").write_text("deb")


def test_cache_key_follows_the_package_list(monkeypatch):
    before = rootfs.cache_key()
    assert rootfs.cache_key() == before
    monkeypatch.setattr(rootfs, "PACKAGES", rootfs.PACKAGES + ("nginx",))
    assert rootfs.cache_key() != before


def test_the_rootfs_carries_what_lab_hosts_cannot_download():
    assert {"haproxy", "python3-apt", "python3-venv", "rsync", "openssh-server", "systemd-sysv",
            "libjansson4"} <= set(rootfs.PACKAGES)


def test_the_rootfs_carries_every_distribution_package_a_role_installs_on_a_lab_host():
    """Lab hosts reach no mirror: a package a role's defaults install that the rootfs lacks fails the role there."""
    repo = Path(__file__).resolve().parents[2]
    monitoring = yaml.safe_load((repo / "roles/monitoring/defaults/main.yml").read_text())
    frontdoor = yaml.safe_load((repo / "roles/frontdoor/defaults/main.yml").read_text())
    wanted = set(monitoring["monitoring_packages"]) | set(monitoring["monitoring_node_exporter_packages"]) \
        | set(frontdoor["frontdoor_packages"])
    assert wanted <= set(rootfs.PACKAGES), sorted(wanted - set(rootfs.PACKAGES))
    # The packaged services start only where a role enables them.
    disabled = set(rootfs.DISABLED_UNITS["multi-user.target.wants"])
    assert {"haproxy.service", "prometheus.service", "prometheus-alertmanager.service",
            "prometheus-blackbox-exporter.service", "prometheus-node-exporter.service"} <= disabled


def test_customize_removes_shared_identity_and_units_that_would_fail_offline(tmp_path):
    debootstrapped_tree(tmp_path)
    rootfs.customize(tmp_path)
    assert sorted(p.name for p in (tmp_path / "etc/ssh").glob("ssh_host_*")) == []
    assert (tmp_path / "etc/machine-id").read_text() == ""
    assert "nameserver" not in (tmp_path / "etc/resolv.conf").read_text()
    dropin = (tmp_path / "etc/ssh/sshd_config.d/revive-lab.conf").read_text()
    assert "PermitRootLogin prohibit-password\n" in dropin and "PasswordAuthentication no\n" in dropin
    wants = tmp_path / "etc/systemd/system"
    assert not (wants / "multi-user.target.wants/haproxy.service").is_symlink()
    assert not (wants / "timers.target.wants/apt-daily.timer").is_symlink()
    assert (wants / "multi-user.target.wants/ssh.service").is_symlink()
    assert list((tmp_path / "var/cache/apt/archives").glob("*.deb")) == []


def test_a_cached_rootfs_is_reused_without_debootstrap(cache):
    final = cache / "cache" / f"rootfs-{rootfs.cache_key()}"
    final.mkdir(parents=True)
    fake_debootstrap(cache / "bin", "echo must not run >&2; exit 1")
    assert rootfs.ensure_rootfs(log=lambda _: None) == final


def test_a_half_built_rootfs_is_never_used(cache):
    building = cache / "cache" / f".building-{rootfs.cache_key()}"
    (building / "etc").mkdir(parents=True)
    fake_debootstrap(cache / "bin", 'echo "E: Failed getting release file" >&2; exit 1')
    with pytest.raises(LabError) as err:
        rootfs.ensure_rootfs(log=lambda _: None)
    assert "debootstrap failed (exit 1)" in str(err.value)
    assert "E: Failed getting release file" in str(err.value)
    assert "REVIVE_LAB_MIRROR" in str(err.value)
    assert not (cache / "cache" / f"rootfs-{rootfs.cache_key()}").exists()


def test_a_successful_build_is_customised_then_renamed_into_place(cache):
    fake_debootstrap(cache / "bin", 'mkdir -p "$4/etc/ssh" "$4/etc/systemd/system" && '
                                    'echo shared > "$4/etc/ssh/ssh_host_ed25519_key" && touch "$4/etc/machine-id"')
    messages: list[str] = []
    final = rootfs.ensure_rootfs(log=messages.append)
    assert final == cache / "cache" / f"rootfs-{rootfs.cache_key()}"
    assert not list((final / "etc/ssh").glob("ssh_host_*"))
    assert (final / "etc/revive-lab-rootfs").exists()
    assert not (cache / "cache" / f".building-{rootfs.cache_key()}").exists()
    assert messages[-1].startswith("rootfs: cold build took ")


def test_missing_debootstrap_says_how_to_install_it(cache, monkeypatch):
    monkeypatch.setattr(rootfs.shutil, "which", lambda name: None)
    with pytest.raises(LabError, match="debootstrap is not installed.*apt-get install debootstrap"):
        rootfs.ensure_rootfs(log=lambda _: None)
