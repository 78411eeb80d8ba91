"""pytest plugin for Molecule's testinfra verifier on lab hosts (loaded through PYTEST_PLUGINS=lab_testinfra).

- testinfra's paramiko backend accepts any host key (paramiko.WarningPolicy). Here every connection is
  opened from the same ssh_config testinfra was given, but with the lab's known_hosts and RejectPolicy.
- `lab_status()` / the `lab` fixture: `bin/lab status --json` of the scenario's lab (addresses, profiles).
- `lab_hosts(group)`: the scenario's hosts in an inventory group, for a test module's `testinfra_hosts`.
- `nvml_view(host)`: what unmodified pynvml (the controller's pinned nvidia-ml-py) reports on a lab host.
- `haproxy_runtime(host, command)` / `haproxy_servers(host)`: HAProxy's runtime API on the lb host (the rootfs has
  no socat: the host's python3 talks to the socket).
- `knock(host, address, ports)`: what a TCP connect from that host to each port finds (open, refused, or the error).
"""
from __future__ import annotations

import base64
import functools
import json
import os
import subprocess
from pathlib import Path

import paramiko
import pytest

PROJECT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
LAB_STATE_DIR = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "lab"
PROFILES_DIR = PROJECT / "lab/profiles"
NVML_PROBE = Path(__file__).with_name("nvml_probe.py")
REMOTE_PROBE_DIR = "/tmp/lab-nvml-probe"


@functools.cache
def lab_status() -> dict:
    out = subprocess.run([str(PROJECT / "bin/lab"), "--state-dir", str(LAB_STATE_DIR), "status", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def lab_hosts(group: str) -> list[str]:
    return [h["name"] for h in lab_status()["hosts"] if h["group"] == group]


def lab_host(name: str) -> dict:
    return next(h for h in lab_status()["hosts"] if h["name"] == name)


@pytest.fixture(scope="session")
def lab() -> dict:
    return lab_status()


def connect_verified(name: str, ssh_config: str) -> paramiko.SSHClient:
    entry = paramiko.SSHConfig.from_path(ssh_config).lookup(name)
    client = paramiko.SSHClient()
    client.load_host_keys(entry["userknownhostsfile"])
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(entry["hostname"], username=entry["user"], key_filename=entry["identityfile"][0],
                   timeout=10, allow_agent=False, look_for_keys=False)
    return client


@pytest.fixture(autouse=True)
def _lab_host_key_checked(request: pytest.FixtureRequest) -> None:
    if "host" not in request.fixturenames:
        return
    backend = request.getfixturevalue("host").backend
    # ParamikoBackend.client is a cached_property: a client stored first is the one it uses.
    if backend.NAME == "paramiko" and "client" not in vars(backend):
        vars(backend)["client"] = connect_verified(backend.host.name, backend.ssh_config)


def nvml_view(host) -> dict:
    """Copy pynvml.py (the pinned nvidia-ml-py) and the probe to the host, run it there, return its JSON."""
    import pynvml

    sftp = host.backend.client.open_sftp()
    try:
        host.run_test(f"mkdir -p {REMOTE_PROBE_DIR}")
        sftp.put(pynvml.__file__, f"{REMOTE_PROBE_DIR}/pynvml.py")
        sftp.put(str(NVML_PROBE), f"{REMOTE_PROBE_DIR}/nvml_probe.py")
    finally:
        sftp.close()
    return json.loads(host.check_output(f"python3 {REMOTE_PROBE_DIR}/nvml_probe.py"))


def profile_as_nvml_view(name: str) -> dict:
    """What nvml_view must return on a node given lab/profiles/<name>.json (in the GPU profile format)."""
    profile = json.loads((PROFILES_DIR / f"{name}.json").read_text())
    return {
        "driver_version": profile["driver_version"],
        "cuda_driver_version": profile["cuda_driver_version"],
        "nvml_version": profile["nvml_version"],
        "gpus": [{
            "name": g["name"], "uuid": g["uuid"], "serial": g["serial"], "pci_bus_id": g["pci_bus_id"],
            "pci_device_id": int(g["pci_device_id"], 16), "minor_number": g["minor_number"],
            "memory_total_bytes": g["memory_total_bytes"], "compute_capability": list(g["compute_capability"]),
            "power_limit_mw": g["power_limit_mw"],
            "pcie": {k: g["pcie"][k] for k in ("max_gen", "max_width", "cur_gen", "cur_width")},
        } for g in profile["gpus"]],
        "topology": profile["topology"]["common_ancestor"],
    }


HAPROXY_RUNTIME = ("python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); "
                   "s.connect('/run/haproxy/admin.sock'); s.sendall(b'{command}\\n'); "
                   "print(b''.join(iter(lambda: s.recv(65536), b'')).decode())\"")


def haproxy_runtime(host, command: str) -> str:
    return host.check_output(HAPROXY_RUNTIME.format(command=command))


def haproxy_servers(host, backend: str = "vllm") -> dict:
    """{server name: its `show stat` row} of the backend."""
    lines = [line for line in haproxy_runtime(host, f"show stat {backend} 4 -1").splitlines() if line.strip()]
    header = lines[0].lstrip("# ").split(",")
    return {row["svname"]: row for row in (dict(zip(header, line.split(","))) for line in lines[1:])}


def serve_url(name: str, port: int) -> str:
    """A replica's base URL on lab host `name`: replicas listen on the node's serving address, which in the lab is
    its own address (module_utils/revive_serve_address.py), not on loopback."""
    return f"http://{lab_host(name)['address']}:{port}"


KNOCK = ("import json, socket, sys\nout = {}\nfor port in sys.argv[2:]:\n"
         "    try:\n        socket.create_connection((sys.argv[1], int(port)), timeout=5).close(); out[port] = 'open'\n"
         "    except ConnectionRefusedError:\n        out[port] = 'refused'\n"
         "    except OSError as error:\n        out[port] = str(error)\nprint(json.dumps(out))\n")


def knock(host, address: str, ports) -> dict:
    """{port as str: 'open' | 'refused' | the error} for a TCP connect from lab host `host` to `address` (a guard's
    reject answers at once with a reset: 'refused'; a drop would time out)."""
    script = base64.b64encode(KNOCK.encode()).decode()
    argv = " ".join(str(port) for port in ports)
    return json.loads(host.check_output(f"python3 -c 'import base64; exec(base64.b64decode(\"{script}\"))' "
                                        f"{address} {argv}"))
