"""The planner and the twin pick NCCL's transport with one function (revive_perf.nccl_transport), each from its
own view of the GPUs: the planner from the probe's facts (revive_plan.layout.describe_group), the twin from pynvml
at its start (vllm._twin.gpus.topology, P2P status and common ancestors). For every lab profile, every TP size the
profile can form and every NCCL_P2P_DISABLE / NCCL_SHM_DISABLE setting, the two must name the same transport: a
twin that disagreed would simulate a different machine than the one the plan was made for (DGX-1's hybrid cube
mesh did: NVLink connects a TP 8 group although not every pair has a link)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from ansible.module_utils.revive_plan.gpus import gpu_set_from_facts
from ansible.module_utils.revive_plan.inputs import Decisions
from ansible.module_utils.revive_plan.layout import describe_group, form_groups, transport_for
from fixtures.gpus import REPO, lab_facts

PROFILES = sorted(p.stem for p in (REPO / "lab" / "profiles").glob("*.json"))
SETTINGS = [(False, False), (True, False), (True, True)]  # (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE)

TWIN_SIDE = """
import json, sys, types
import pynvml
from vllm._twin import perf
from vllm._twin.gpus import topology
pynvml.nvmlInit()
out = []
for members in json.loads(sys.argv[1]):
    topo = topology(pynvml, [types.SimpleNamespace(nvml_index=i) for i in members])
    out.append([perf.choose_transport(len(members), topo.nvlink_connected, topo.all_p2p, topo.slowest_path,
                                      p2p, shm).name for p2p, shm in json.loads(sys.argv[2])])
print(json.dumps(out))
"""


def twin_transports(profile: str, groups):
    env = dict(os.environ, LD_LIBRARY_PATH=str(REPO / "lab" / "fakenvml"),
               FAKE_NVML_PROFILE=str(REPO / "lab" / "profiles" / f"{profile}.json"),
               PYTHONPATH=str(REPO / "lab" / "vllm_twin" / "src"))
    proc = subprocess.run([sys.executable, "-c", TWIN_SIDE, json.dumps(groups), json.dumps(SETTINGS)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("profile", PROFILES)
def test_the_twin_picks_the_planners_transport_on_every_profile(profile):
    gpus = gpu_set_from_facts(lab_facts(profile), [], Decisions())
    groups = [members for tp in (1, 2, 4, 8) if tp <= len(gpus.indices) for members in form_groups(gpus, tp)]
    planned = [[transport_for(describe_group(gpus, members), p2p, shm) for p2p, shm in SETTINGS]
               for members in groups]
    assert twin_transports(profile, groups) == planned, groups


def test_the_profiles_cover_every_transport():
    # The agreement above means something only if the profiles make the planner choose each transport.
    seen = set()
    for profile in PROFILES:
        gpus = gpu_set_from_facts(lab_facts(profile), [], Decisions())
        for tp in (2, 4, 8):
            if tp <= len(gpus.indices):
                for members in form_groups(gpus, tp):
                    seen.update(transport_for(describe_group(gpus, members), p2p, shm) for p2p, shm in SETTINGS)
    assert seen == {"nvlink", "p2p", "shm", "net"}
