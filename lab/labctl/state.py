"""The record of what `up` made (written before each thing is made), so `down` removes exactly that."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .shape import LabShape

STATE_VERSION = 1


@dataclass
class HostRecord:
    name: str
    group: str
    address: str
    gpu_profile: str | None
    netns: str
    veth: str
    root: str            # what nspawn boots: the overlay mount (or a full copy when overlayfs is unusable)
    upper: str           # per-host writable layer (overlay) or the copy itself
    work: str | None     # overlayfs work dir; None for a copy
    cgroups: list[str] = field(default_factory=list)
    pid: int | None = None
    start_time: int | None = None
    log: str = ""


@dataclass
class LabState:
    slot: int
    bridge: str
    rootfs: str
    shape: LabShape
    inventory: str
    hosts: list[HostRecord] = field(default_factory=list)

    def host(self, name: str) -> HostRecord | None:
        return next((h for h in self.hosts if h.name == name), None)


def state_file(state_dir: Path) -> Path:
    return state_dir / "state.json"


def load(state_dir: Path) -> LabState | None:
    path = state_file(state_dir)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return LabState(
        slot=data["slot"], bridge=data["bridge"], rootfs=data["rootfs"],
        shape=LabShape.from_json(data["shape"]), inventory=data["inventory"],
        hosts=[HostRecord(**h) for h in data["hosts"]],
    )


def save(state_dir: Path, state: LabState) -> None:
    data = {"version": STATE_VERSION, "slot": state.slot, "bridge": state.bridge, "rootfs": state.rootfs,
            "shape": state.shape.to_json(), "inventory": state.inventory,
            "hosts": [asdict(h) for h in state.hosts]}
    tmp = state_file(state_dir).with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, state_file(state_dir))


def forget(state_dir: Path) -> None:
    state_file(state_dir).unlink(missing_ok=True)
