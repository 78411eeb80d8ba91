"""bin/lab: bring a local fleet of simulated GPU servers up and down (see lab/labctl/__init__.py)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import fleet, prepare, state, tls
from .errors import LabError
from .shape import DEFAULT_GPU_PROFILE, DEFAULT_NODES, DEFAULT_SUPPORT_HOSTS, SUPPORT_HOSTS, build_shape, \
    known_profiles, parse_support_hosts

USAGE = """\
examples:
  bin/lab up                                  2 GPU nodes (v100-pcie-8x) + model-store, bench1, lb1, monitor1
  bin/lab up --nodes 3 --gpu-profile node3=v100-pcie-8x-degraded
  bin/lab up --support-hosts model-store,bench1,lb1,lb2   two front doors (frontdoor_vip, docs/frontdoor-ha.md)
  bin/lab status                              hosts, addresses, systemd state, GPU profiles
  bin/lab ssh node1 systemctl is-system-running   run a command on a lab host (or log in)
  bin/lab set-profile node2 v100-pcie-8x-degraded
  bin/lab reboot node2                        halt node2 and boot it again (its disk kept), wait for SSH
  bin/lab link model-store down               cut a host's link (its peers' packets are dropped); `up` restores it
  bin/lab partition lb1 lb2 down              cut the path between two hosts only (each still reaches the rest)
  bin/lab down                                remove every host, namespace, link, mount and process
  bin/lab wheelhouse                          .lab/wheelhouse: the wheels roles copy to nodes (PyPI once)
  bin/lab seed-model                          the lab model onto model-store:/srv/models/tiny-chat/rev1
  bin/lab tls                                 a private CA and lb1's certificate in STATE_DIR/tls (openssl)
  bin/lab tls --address 10.213.0.250          ... covering a front doors' virtual address too
then: ansible-playbook -i inventory/lab site.yml
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bin/lab", description=__doc__, epilog=USAGE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-dir", type=Path, default=None,
                   help="where this lab keeps its state (default: $REVIVE_LAB_DIR or .lab/ in the repository; "
                        "only the default lab writes inventory/lab/hosts.yml, others write STATE_DIR/hosts.yml)")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="build (first time) and boot the lab, then write the inventory")
    up.add_argument("--nodes", type=int, default=DEFAULT_NODES, help=f"GPU nodes (default {DEFAULT_NODES})")
    up.add_argument("--gpu-profile", action="append", default=[], metavar="NAME|HOST=NAME",
                    help=f"GPU profile for every node (NAME) or one node (HOST=NAME); repeatable; "
                         f"default {DEFAULT_GPU_PROFILE}; names are lab/profiles/*.json")
    up.add_argument("--support-hosts", default=",".join(DEFAULT_SUPPORT_HOSTS), metavar="LIST",
                    help=f"which of {', '.join(SUPPORT_HOSTS)} to run (comma-separated) or `none` "
                         f"(default: {','.join(DEFAULT_SUPPORT_HOSTS)}; lb2 is a second front door)")
    up.add_argument("--recreate", action="store_true", help="take down a running lab of another shape first")

    st = sub.add_parser("status", help="show the lab's hosts and their systemd state")
    st.add_argument("--json", action="store_true", help="machine-readable (used by Molecule's create playbook)")

    ssh = sub.add_parser("ssh", help="ssh to a lab host as root (optionally running a command)")
    ssh.add_argument("host")
    ssh.add_argument("cmd", nargs=argparse.REMAINDER)

    sub.add_parser("down", help="stop and remove the lab and everything it made")

    sp = sub.add_parser("set-profile", help="swap a running GPU node's profile (e.g. to a degraded one)")
    sp.add_argument("host")
    sp.add_argument("profile")

    sub.add_parser("profiles", help="list the GPU profiles (lab/profiles/*.json)")

    link = sub.add_parser("link", help="cut (down) or restore (up) a lab host's network link")
    link.add_argument("host")
    link.add_argument("state", choices=["up", "down"])

    part = sub.add_parser("partition", help="cut (down) or restore (up) the path between two lab hosts only")
    part.add_argument("host")
    part.add_argument("other")
    part.add_argument("state", choices=["up", "down"])

    rb = sub.add_parser("reboot", help="halt a lab host and boot it again (its disk kept), then wait for SSH")
    rb.add_argument("host")

    sub.add_parser("wheelhouse", help="download the wheels the roles copy to nodes into .lab/wheelhouse (once)")
    seed = sub.add_parser("seed-model", help="put the lab model on the model-store host")
    seed.add_argument("--name", default=prepare.MODEL_NAME, help=f"default {prepare.MODEL_NAME}")
    seed.add_argument("--revision", default=prepare.MODEL_REVISION, help=f"default {prepare.MODEL_REVISION}")
    seed.add_argument("--fixture", default=prepare.MODEL_FIXTURE,
                      help=f"a model of tests/fixtures/models.py (default {prepare.MODEL_FIXTURE})")
    seed.add_argument("--size", choices=["tiny", "sparse"], default="tiny",
                      help="tiny (~10 MB of zeros) or sparse (the real size in sparse files: no disk, but a "
                           "sync moves every byte)")
    lab_tls = sub.add_parser("tls", help="make a private CA and the front door's certificate in STATE_DIR/tls")
    lab_tls.add_argument("--host", default="lb1", help="the front door's lab host (default lb1)")
    lab_tls.add_argument("--name", default=tls.FRONTDOOR_NAME,
                         help=f"DNS name the certificate covers besides the host's address (default {tls.FRONTDOOR_NAME})")
    lab_tls.add_argument("--address", action="append", default=[], metavar="IP",
                         help="another IP address the certificate covers, e.g. the front doors' frontdoor_vip "
                              "(repeat for more)")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    paths = fleet.LabPaths(args.state_dir.absolute() if args.state_dir else fleet.default_state_dir())
    try:
        if args.command == "up":
            shape = build_shape(args.nodes, args.gpu_profile, parse_support_hosts(args.support_hosts),
                                fleet.PROFILES_DIR)
            lab = fleet.up(paths, shape, recreate=args.recreate)
            print(fleet.format_status(fleet.status(paths, query_hosts=False)))
            return 0 if lab else 1
        if args.command == "status":
            report = fleet.status(paths)
            print(fleet.status_json(report) if args.json else fleet.format_status(report))
            return 0
        if args.command == "ssh":
            ssh(paths, args.host, args.cmd)
        if args.command == "down":
            fleet.down(paths)
            return 0
        if args.command == "set-profile":
            fleet.set_profile(paths, args.host, args.profile)
            return 0
        if args.command == "wheelhouse":
            prepare.build_wheelhouse()
            return 0
        if args.command == "seed-model":
            lab = state.load(paths.state_dir)
            if lab is None or not fleet.lab_is_running(lab):
                raise LabError(f"no running lab in {paths.state_dir}; start one with `bin/lab up`")
            prepare.seed_model(lab, args.name, args.revision, fixture=args.fixture, size=args.size)
            return 0
        if args.command == "link":
            fleet.set_link(paths, args.host, args.state == "up")
            return 0
        if args.command == "partition":
            fleet.set_partition(paths, args.host, args.other, args.state == "up")
            return 0
        if args.command == "reboot":
            fleet.reboot(paths, args.host)
            return 0
        if args.command == "tls":
            lab = state.load(paths.state_dir)
            host = lab.host(args.host) if lab else None
            if host is None:
                raise LabError(f"no lab host {args.host!r} in {paths.state_dir}; start one with `bin/lab up`")
            made = tls.issue(paths.state_dir / "tls", host.address, args.name, also=args.address)
            print(f"{'made' if made else 'kept'} {paths.state_dir / 'tls'}: "
                  f"{tls.describe(paths.state_dir / 'tls')}")
            return 0
        if args.command == "profiles":
            print("\n".join(known_profiles(fleet.PROFILES_DIR)))
            return 0
    except LabError as exc:
        print(f"bin/lab {args.command}: {exc}", file=sys.stderr)
        return 1
    return 2


def ssh(paths: fleet.LabPaths, host: str, cmd: list[str]) -> None:
    """Replace this process with `ssh -F <lab ssh_config> HOST [cmd...]`."""
    names = [h["name"] for h in fleet.status(paths, query_hosts=False)["hosts"]]
    if host not in names:
        where = f"lab hosts: {', '.join(names)}" if names else f"no lab is up in {paths.state_dir}"
        raise LabError(f"unknown host {host!r} ({where})")
    argv = ["ssh", "-F", str(paths.ssh_config), host, *cmd]
    os.execvp(argv[0], argv)
