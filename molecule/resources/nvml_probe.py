"""Run on a lab GPU node beside pynvml.py: print, as JSON, what NVML reports (compared with the profile)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pynvml as nvml  # noqa: E402


def as_str(value):
    return value.decode() if isinstance(value, bytes) else value


def main():
    nvml.nvmlInit()
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        gpus = []
        for h in handles:
            pci = nvml.nvmlDeviceGetPciInfo(h)
            gpus.append({
                "name": as_str(nvml.nvmlDeviceGetName(h)),
                "uuid": as_str(nvml.nvmlDeviceGetUUID(h)),
                "serial": as_str(nvml.nvmlDeviceGetSerial(h)),
                "pci_bus_id": as_str(pci.busId),
                "pci_device_id": pci.pciDeviceId,
                "minor_number": nvml.nvmlDeviceGetMinorNumber(h),
                "memory_total_bytes": nvml.nvmlDeviceGetMemoryInfo(h).total,
                "compute_capability": list(nvml.nvmlDeviceGetCudaComputeCapability(h)),
                "power_limit_mw": nvml.nvmlDeviceGetPowerManagementLimit(h),
                "pcie": {
                    "max_gen": nvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
                    "max_width": nvml.nvmlDeviceGetMaxPcieLinkWidth(h),
                    "cur_gen": nvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                    "cur_width": nvml.nvmlDeviceGetCurrPcieLinkWidth(h),
                },
            })
        topology = [[0 if a is b else nvml.nvmlDeviceGetTopologyCommonAncestor(a, b) for b in handles]
                    for a in handles]
        view = {
            "driver_version": as_str(nvml.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": nvml.nvmlSystemGetCudaDriverVersion(),
            "nvml_version": as_str(nvml.nvmlSystemGetNVMLVersion()),
            "gpus": gpus,
            "topology": topology,
        }
    finally:
        nvml.nvmlShutdown()
    print(json.dumps(view))


if __name__ == "__main__":
    main()
