#!/usr/bin/python
"""Ansible module nvml_facts: thin wiring over module_utils/revive_nvml.py."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvml_facts
short_description: Probe NVIDIA GPUs, topology and health through NVML (pynvml)
description:
  - Reads the node's GPUs through unmodified C(pynvml) (nvidia-ml-py) and returns them as the fact C(gpu). It holds the
    driver and CUDA driver versions, per-GPU identity, memory, compute capability, architecture, BF16
    support, PCIe link, NUMA node, CPU affinity and socket, power limit, persistence, temperature, ECC mode
    and error totals, retired pages, remapped rows, MIG mode, running compute processes and NVLink peers.
  - Also returns the topology matrix exactly as C(nvidia-smi topo -m) prints it (X, NV#, PIX, PXB, PHB,
    NODE, SYS), the C(topo -p2p) matrices and a summary (NVLink none/partial/full, GPUs per socket, any
    P2P path, slowest path class).
  - A value the GPU or driver does not support is V(null) with an entry in the GPU's C(notes); it never fails
    the module.
  - When the loaded C(libnvidia-ml.so.1) is the lab's fake, C(gpu.simulated) is V(true) and names the profile.
  - The interpreter running the module needs C(nvidia-ml-py) (pinned in the project's requirements.txt).
version_added: "0.1.0"
author:
  - revive project
options:
  facts_path:
    description:
      - Also save the facts as JSON at this path on the node (for audits), e.g. C(/var/lib/revive/gpu-facts.json).
      - The file is rewritten, and the task reports C(changed), only when the hardware facts differ from the
        saved ones; readings that move on an unchanged machine (temperature, utilisation, memory in use, the
        current PCIe generation, process memory) do not count.
      - Parent directories are created (mode 0755); the file is written atomically with mode 0644.
    type: path
    required: false
attributes:
  check_mode:
    support: full
    details: Probing is read-only; with O(facts_path) the module reports whether it would write, and writes nothing.
  diff_mode:
    support: full
    details: With O(facts_path), the diff is the saved file before and after.
requirements:
  - nvidia-ml-py (pynvml) on the node's Python
  - an NVIDIA driver providing libnvidia-ml.so.1 (or the lab's fake)
notes:
  - Fails with "NVIDIA driver not installed or libnvidia-ml.so.1 not on the loader path on <host>" when the
    library cannot be loaded, and names the CUDA toolkit stub when that is what the loader found.
seealso:
  - name: nvidia-smi topo -m legend and derivation
    description: docs/facts/nvml.md section 2 in this repository; the NVML API reference is the link.
    link: https://docs.nvidia.com/deploy/nvml-api/
"""

EXAMPLES = r"""
- name: Probe the GPUs
  nvml_facts:

- name: Probe and keep a copy for audits
  nvml_facts:
    facts_path: /var/lib/revive/gpu-facts.json

- name: Show the topology as nvidia-smi prints it
  ansible.builtin.debug:
    msg: "{{ ansible_facts['gpu']['topology']['matrix'] }}"

- name: Stop on a box without NVLink when the plan needs it
  ansible.builtin.assert:
    that: ansible_facts['gpu']['summary']['nvlink'] != 'none'
    fail_msg: "{{ inventory_hostname }} has no NVLink between its GPUs"
"""

RETURN = r"""
gpu:
  description:
    - The GPU facts (also set as C(ansible_facts['gpu'])). Keys below; per-GPU values the card does not
      support are null with a note.
  returned: success
  type: dict
  contains:
    simulated:
      description: True when the loaded libnvidia-ml.so.1 is the lab's fake NVML.
      type: bool
      sample: false
    simulated_profile:
      description: The fake's profile path when simulated, else null.
      type: str
    simulated_profile_name:
      description: The C(name) inside that profile (e.g. V(v100-pcie-8x)) when simulated, else null.
      type: str
    host:
      description: Host name the probe ran on.
      type: str
    library_path:
      description: The libnvidia-ml file the loader mapped.
      type: str
      sample: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.104.05
    driver_version:
      description: NVIDIA driver version.
      type: str
      sample: "535.104.05"
    driver_branch:
      description: Major number of the driver version.
      type: int
      sample: 535
    cuda_driver_version:
      description: Highest CUDA version the driver supports, "major.minor".
      type: str
      sample: "12.2"
    cuda_driver_version_int:
      description: The same as NVML encodes it (1000*major + 10*minor).
      type: int
      sample: 12020
    nvml_version:
      description: NVML library version.
      type: str
      sample: "12.535.104.05"
    count:
      description: Number of GPUs.
      type: int
      sample: 8
    devices:
      description:
        - One entry per GPU in NVML index order. Keys - index, name, uuid, serial, pci_bus_id, pci_device_id,
          minor_number, memory (total_bytes, used_bytes, free_bytes, reserved_bytes; used excludes the
          driver-reserved part where the driver has the v2 memory query, as nvidia-smi shows it),
          compute_capability ("7.0"), cc_major, cc_minor, architecture (kepler maxwell pascal volta turing
          ampere ada hopper blackwell unknown), bf16 (CC >= 8.0), pcie (gen_current, gen_max, width_current,
          width_max), numa_node (from the memory affinity, as topo -m's NUMA Affinity), numa_affinity (the
          same as text), gpu_numa_id (NVML NumaNodeId; null on x86), cpu_affinity ("0-19,40-59"), cpus,
          socket, power_limit_w, persistence_mode, temperature_c, utilization_gpu_pct,
          utilization_memory_pct, ecc (current, pending), ecc_errors (corrected and uncorrected are the
          volatile totals since the driver loaded; corrected_aggregate and uncorrected_aggregate are
          lifetime totals), retired_pages (single_bit, double_bit counts, pending), remapped_rows
          (correctable, uncorrectable, pending, failure), mig_mode (current, pending), processes (pid,
          used_memory_bytes, name), nvlink (active_links, links of link, peer_bus_id, peer_index,
          remote_device_type), notes.
      type: list
      elements: dict
    topology:
      description:
        - matrix - the GPU block of C(nvidia-smi topo -m), "X" on the diagonal.
        - p2p - read, write, nvlink, atomics, pci matrices of C(nvidia-smi topo -p2p) symbols (OK CNS GNS TNS DR NS U).
        - common_ancestor - the raw nvmlGpuTopologyLevel_t values (null on the diagonal).
      type: dict
    summary:
      description:
        - nvlink (none, partial, full), sockets (number of sockets with GPUs), gpus_per_socket
          ({"0" [0,1,2,3]}), p2p_any (any GPU pair with P2P read OK), slowest_path (the slowest pair's
          symbol, NV# < PIX < PXB < PHB < NODE < SYS), socket_rule (sysfs or affinity-groups).
      type: dict
    notes:
      description: Machine-wide notes (simulation, how sockets were derived, failed queries).
      type: list
      elements: str
facts_path:
  description: Where the facts were saved (or would be, in check mode).
  returned: when O(facts_path) is set
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.revive_files import write_atomic
from ansible.module_utils.revive_nvml import GpuProbeError, plan_facts_file, probe


def main() -> None:
    module = AnsibleModule(
        argument_spec={"facts_path": {"type": "path", "required": False}},
        supports_check_mode=True,
    )
    try:
        gpu = probe()
    except GpuProbeError as error:
        module.fail_json(msg=str(error))
    result = {"changed": False, "gpu": gpu, "ansible_facts": {"gpu": gpu}}
    path = module.params["facts_path"]
    if path:
        update = plan_facts_file(path, gpu)
        if update.changed and not module.check_mode:
            try:
                write_atomic(path, update.after, make_parents=True)
            except OSError as error:
                module.fail_json(msg=f"cannot write GPU facts to {path} on {gpu['host']}: {error}; "
                                     "check the directory's permissions or choose another facts_path")
        result.update(changed=update.changed, facts_path=path)
        if module._diff:
            result["diff"] = {"before": update.before, "after": update.after,
                              "before_header": path, "after_header": path}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
