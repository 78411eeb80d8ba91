"""The rank program of the NCCL check, as text: written to a file and run by the release venv's python."""
from __future__ import annotations

# Runs in the release venv's python (3.8+ in the Volta venvs): one rank. argv: spec.json rank. It writes its
# result to spec["result_paths"][rank] (JSON, replaced atomically) and prints "REVIVE_NCCL rank=R phase=P"
# to stderr at each phase, so a killed rank's phase is known from its log.
WORKER_SOURCE = r'''
import datetime, json, os, sys, time, traceback


def main():
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    rank, n = int(sys.argv[2]), spec["world_size"]
    result = {"rank": rank, "pid": os.getpid(), "ok": False, "phase": "start", "sizes": [],
              "affinity": sorted(os.sched_getaffinity(0)),
              "seen_env": dict((k, v) for k, v in os.environ.items() if k.startswith(tuple(spec["seen_prefixes"])))}

    def phase(name):
        result["phase"] = name
        sys.stderr.write("REVIVE_NCCL rank=%d phase=%s\n" % (rank, name))
        sys.stderr.flush()

    try:
        phase("import")
        import torch
        import torch.distributed as dist
        result["versions"] = {"torch": torch.__version__, "python": "%d.%d.%d" % sys.version_info[:3]}
        if spec["backend"] == "nccl":
            phase("device")
            local = spec["devices"][rank]
            torch.cuda.set_device(local)
            device = torch.device("cuda", local)
            props = torch.cuda.get_device_properties(local)
            bus = getattr(props, "pci_bus_id", None)
            result["device"] = {"index": local, "name": props.name, "pci_bus_id": None if bus is None else
                                "%08X:%02X:%02X.0" % (getattr(props, "pci_domain_id", 0), bus,
                                                      getattr(props, "pci_device_id", 0))}
            result["versions"]["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
            result["versions"]["cuda"] = torch.version.cuda
            sync = torch.cuda.synchronize
        else:
            device = torch.device("cpu")
            sync = lambda: None  # noqa: E731 - gloo's all_reduce returns when done
        phase("init")
        dist.init_process_group(spec["backend"], init_method=spec["init_method"], rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=spec["timeout_s"]))
        phase("verify")
        probe = torch.full((256,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(probe)
        sync()
        expected, got = n * (n + 1) / 2.0, probe.cpu().tolist()
        if any(value != expected for value in got):
            raise RuntimeError("all-reduce summed to %r, expected %r on every element" % (got[0], expected))
        line_up = torch.zeros(1, dtype=torch.float32, device=device)
        for size in spec["sizes"]:
            phase("size=%d" % size)
            buf = torch.zeros(size // 4, dtype=torch.float32, device=device)
            for _ in range(spec["warmup"]):
                dist.all_reduce(buf)
            dist.all_reduce(line_up)
            sync()
            start = time.perf_counter()
            for _ in range(spec["iterations"]):
                dist.all_reduce(buf)
            sync()
            result["sizes"].append({"bytes": size, "time_s": (time.perf_counter() - start) / spec["iterations"]})
            del buf
        # Every rank finishes its last all-reduce before any tears down: a rank that destroys its group while a
        # peer still waits for its last sends hangs that peer (seen with gloo, 1 run in 4 without this).
        phase("barrier")
        dist.all_reduce(line_up)
        sync()
        result["ok"] = True
        write(spec, rank, result)   # the measurement is complete; teardown is not part of it
        phase("destroy")
        dist.destroy_process_group()
        phase("done")
    except BaseException as error:  # noqa: B902 - everything goes into the result
        key = "teardown_error" if result["ok"] else "error"
        result[key] = ("%s: %s" % (type(error).__name__, str(error).strip()))[:2000]
        result["traceback"] = traceback.format_exc().splitlines()[-12:]
    write(spec, rank, result)
    return 0 if result["ok"] else 1


def write(spec, rank, result):
    path = spec["result_paths"][rank]
    with open(path + ".tmp", "w") as handle:
        json.dump(result, handle)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
'''
