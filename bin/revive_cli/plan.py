"""revive plan: plan a vLLM release for a model on a GPU set, without Ansible.

    revive plan --model PATH --gpus SPEC [--vllm-version V] [--tensor-parallel-size N]
                [--gpu-memory-utilization F] [--max-model-len N] [--max-num-seqs N]
                [--max-num-batched-tokens N] [--swap-space GIB] [--concurrency N] [--host-ram-gib N] [--json]

--model is a model directory or a config.json (what-if). --gpus is one of
  * a lab profile name (lab/profiles/NAME.json) or a profile file: the real probe (`revive gpus --json`)
    runs in a subprocess against the lab's fake libnvidia-ml.so.1 reading that profile;
  * a facts JSON written by `revive gpus --json` (or an nvml_facts result holding `gpu`);
  * a synthetic spec COUNTxMEMORY_GIB[@CC], e.g. 8x32@7.0 (CC defaults to 7.0). It assumes a PCIe-only
    server: no NVLink, up to 4 GPUs on one socket and more split over two, PHB within a socket, SYS
    across, driver 535.104.05.
Explicit flags override the planner's choices, so the KV estimate can be had for any configuration.
Every numeric option is checked against its range (docs/inputs.md) before anything is planned.
Exit status: 0 planned, 1 refused (the reason on stderr), 2 bad arguments or unusable input.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible.module_utils.revive_kv import GiB
from ansible.module_utils.revive_model import ModelInspectError, inspect_model
from ansible.module_utils.revive_plan import (
    BOUNDS,
    PUBLIC_INDEX,
    Overrides,
    PackageSource,
    PlanError,
    PlanInputError,
    PlanRefusal,
    Serve,
    Workload,
    synthetic_gpu_facts,
)
from ansible.module_utils.revive_plan.inputs import GPU_INDEX, NodeGroup, check_gpu_indices
from ansible.module_utils.revive_plan import plan_release as run_planner
from ansible.module_utils.revive_releases import ReleaseDataError, load_release_file

from revive_cli import REPO, bounded_option

SYNTHETIC = re.compile(r"^(\d+)x(\d+(?:\.\d+)?)(?:@(\d+\.\d+))?$")
SYNTHETIC_MAX_GPUS = GPU_INDEX.high + 1
PROBE_TIMEOUT_S = 120
# The planner's inputs (module_utils/revive_plan/inputs.py BOUNDS) whose option here is not their name dashed.
RENAMED_OPTIONS = {"workload.slo_p95_e2e_s": "--slo-p95-s", "workload.slo_output_tokens": "--output-tokens",
                   "workload.typical_prompt_tokens": "--prompt-tokens", "package_source.type": "--source",
                   "group.link_gbit": "--node-link-gbit"}


def option_for(path: str) -> str:
    """The option that sets planner input `path` ("overrides.max_num_seqs" -> "--max-num-seqs")."""
    return RENAMED_OPTIONS.get(path) or "--" + path.rsplit(".", 1)[-1].replace("_", "-")


class InputError(Exception):
    """An argument or file the planner cannot use; the message says which and why."""


def probe_profile(profile: str) -> Dict[str, Any]:
    """GPU facts from the real probe run against the lab's fake NVML reading `profile`."""
    fake = REPO / "lab" / "fakenvml"
    build = subprocess.run(["make", "-s", "-C", str(fake)], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    if build.returncode != 0:
        raise InputError(f"cannot build the lab fake NVML ({fake}): {build.stderr.strip() or build.stdout.strip()}")
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake), FAKE_NVML_PROFILE=str(profile))
    probe = subprocess.run([sys.executable, str(REPO / "bin" / "revive"), "gpus", "--json"], env=env,
                           capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    if probe.returncode != 0:
        raise InputError(f"the GPU probe failed on profile {profile}: {probe.stderr.strip()}")
    return json.loads(probe.stdout)


def resolve_gpus(spec: str, host_ram_gib: Optional[float]) -> Tuple[Dict[str, Any], Optional[float], str]:
    """(GPU facts, host RAM GiB or None, what SPEC was) for any of the --gpus forms."""
    match = SYNTHETIC.match(spec)
    if match:
        count, memory, cc = int(match.group(1)), float(match.group(2)), match.group(3) or "7.0"
        if not 1 <= count <= SYNTHETIC_MAX_GPUS or not 0 < memory < 2 ** 20:
            raise InputError(f"--gpus {spec}: COUNT must be 1 to {SYNTHETIC_MAX_GPUS} GPUs and MEMORY_GIB more than 0, "
                             "e.g. 8x32@7.0")
        return synthetic_gpu_facts(count, memory, cc, None), host_ram_gib, "synthetic spec"
    path = spec if os.path.isfile(spec) else str(REPO / "lab" / "profiles" / f"{spec}.json")
    if not os.path.isfile(path):
        profiles = sorted(p[:-5] for p in os.listdir(REPO / "lab" / "profiles") if p.endswith(".json")) \
            if (REPO / "lab" / "profiles").is_dir() else []
        raise InputError(f"--gpus {spec}: not a file, not a lab profile (known: {', '.join(profiles) or 'none'}) "
                         "and not a COUNTxMEMORY_GIB[@CC] spec like 8x32@7.0")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"--gpus {path}: cannot read it as JSON ({exc})") from exc
    if isinstance(data.get("gpus"), list) and "common_ancestor" in (data.get("topology") or {}):
        ram = host_ram_gib if host_ram_gib is not None else (data.get("host") or {}).get("ram_gib")
        return probe_profile(path), ram, f"lab profile {path} (probed through the fake NVML)"
    for candidate in (data, data.get("gpu"), (data.get("ansible_facts") or {}).get("gpu")):
        if isinstance(candidate, dict) and isinstance(candidate.get("devices"), list):
            return candidate, host_ram_gib, f"GPU facts {path}"
    raise InputError(f"--gpus {path}: neither a lab profile (gpus + topology.common_ancestor) nor GPU facts "
                     "(devices, as `revive gpus --json` prints)")


def bounded(path: str) -> Callable[[str], Any]:
    """An argparse type for the planner input `path`: its BOUNDS entry, refused at parse time (exit 2)."""
    return bounded_option(BOUNDS[path], path, option_for(path))


def gpu_indices(text: str) -> List[int]:
    """--exclude-gpus: comma-separated GPU indices, each a GPU_INDEX."""
    try:
        indices = [int(part) for part in text.split(",") if part.strip()]
        check_gpu_indices("overrides.exclude_gpus", indices)
    except (ValueError, PlanInputError):
        raise argparse.ArgumentTypeError(PlanInputError("overrides.exclude_gpus", text, "comma-separated GPU "
                                                        f"indices, each from 0 to {GPU_INDEX.high}",
                                                        "give the indices `revive gpus` shows, e.g. 3,5")
                                         .message("--exclude-gpus")) from None
    return indices


def parse_args(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="revive plan", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 2)[2])
    parser.add_argument("--model", required=True, help="model directory or config.json")
    parser.add_argument("--gpus", required=True, help="lab profile name or file, GPU facts JSON, or COUNTxGIB[@CC]")
    parser.add_argument("--vllm-version")
    parser.add_argument("--tensor-parallel-size", type=bounded("overrides.tensor_parallel_size"))
    parser.add_argument("--pipeline-parallel-size", type=bounded("overrides.pipeline_parallel_size"),
                        help="pipeline stages, one per node of --nodes (default: the fewest that hold the model "
                             "and the workload's KV)")
    parser.add_argument("--gpu-memory-utilization", type=bounded("overrides.gpu_memory_utilization"))
    parser.add_argument("--max-model-len", type=bounded("workload.max_model_len"))
    parser.add_argument("--max-num-seqs", type=bounded("overrides.max_num_seqs"))
    parser.add_argument("--max-num-batched-tokens", type=bounded("overrides.max_num_batched_tokens"))
    parser.add_argument("--swap-space", type=bounded("overrides.swap_space"), help="GiB per GPU")
    parser.add_argument("--concurrency", type=bounded("workload.concurrency"), default=32,
                        help="concurrent requests (default: the notes' 32)")
    parser.add_argument("--slo-p95-s", type=bounded("workload.slo_p95_e2e_s"), default=12.0,
                        help="p95 end-to-end target (default 12)")
    parser.add_argument("--output-tokens", type=bounded("workload.slo_output_tokens"), default=200,
                        help="max_tokens of a request (default 200)")
    parser.add_argument("--prompt-tokens", type=bounded("workload.typical_prompt_tokens"), default=256,
                        help="typical prompt tokens (default 256)")
    parser.add_argument("--host-ram-gib", type=bounded("host_ram_gib"),
                        help="host RAM (default: the lab profile's, else unknown; 0: unknown)")
    parser.add_argument("--exclude-gpus", type=gpu_indices, default=[], help="comma-separated GPU indices to leave out")
    parser.add_argument("--nodes", type=bounded("group.nodes"), default=1,
                        help="identical nodes of --gpus serving the model together (default 1; more: TP inside a "
                             "node, PP across nodes, the fewest nodes that hold the model)")
    parser.add_argument("--node-link-gbit", type=bounded("group.link_gbit"), default=25.0,
                        help="Gbit/s between those nodes (default 25)")
    parser.add_argument("--model-path", help="model path as the server sees it (default --model's directory)")
    parser.add_argument("--served-model-name")
    parser.add_argument("--no-bf16-conversion", action="store_true", help="refuse BF16 weights on GPUs without BF16")
    parser.add_argument("--allow-long-max-model-len", action="store_true",
                        help="accept --max-model-len above the model's maximum (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)")
    parser.add_argument("--source", choices=["index", "mirror", "wheelhouse"], default="index",
                        help="where the nodes get packages (default: the index, PyPI unless --index-url)")
    parser.add_argument("--index-url", default=PUBLIC_INDEX, help="the index or mirror's simple API URL")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    return parser.parse_args(argv)


def plan(args: argparse.Namespace) -> Tuple[Dict[str, Any], str]:
    """Run the planner for parsed arguments; raises InputError, PlanRefusal or PlanError."""
    try:
        model = inspect_model(args.model)
    except ModelInspectError as exc:
        raise InputError(str(exc)) from exc
    facts, ram_gib, origin = resolve_gpus(args.gpus, args.host_ram_gib)
    try:
        releases = load_release_file(str(REPO / "data" / "vllm-releases.yml"))
    except ReleaseDataError as exc:
        raise InputError(str(exc)) from exc
    model_dir = model["path"] if os.path.isdir(model["path"]) else os.path.dirname(model["path"])
    result = run_planner(
        facts, model, releases,
        Workload(max_model_len=args.max_model_len, concurrency=args.concurrency, slo_p95_e2e_s=args.slo_p95_s,
                 slo_output_tokens=args.output_tokens, typical_prompt_tokens=args.prompt_tokens),
        Overrides(vllm_version=args.vllm_version, tensor_parallel_size=args.tensor_parallel_size,
                  pipeline_parallel_size=args.pipeline_parallel_size,
                  gpu_memory_utilization=args.gpu_memory_utilization, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens, swap_space=args.swap_space,
                  exclude_gpus=args.exclude_gpus, allow_bf16_conversion=not args.no_bf16_conversion,
                  allow_long_max_model_len=args.allow_long_max_model_len),
        Serve(model_path=args.model_path or model_dir, served_model_name=args.served_model_name),
        int(ram_gib * GiB) if ram_gib else None,
        PackageSource(type=args.source, index_url=args.index_url),
        NodeGroup(nodes=args.nodes, link_gbit=args.node_link_gbit),
    )
    return result, origin


def human(result: Dict[str, Any], origin: str) -> str:
    model, gpu, kv, settings = result["model"], result["gpu"], result["kv_cache"], result["settings"]
    pins = result["pins"]
    lines = [
        f"vLLM plan for {model['path']}",
        f"  model    {model['architecture']}, {model['parameter_count'] / 1e9:.2f} B parameters, "
        f"{model['weight_bytes'] / 1e9:.1f} GB {model['weights_dtype']}"
        + (f", {model['quantization']['method']}" if model.get("quantization") else ""),
        f"  GPUs     {gpu['count']}x {gpu['name']} (CC {gpu['compute_capability']}, "
        f"{gpu['total_bytes'] / GiB:.2f} GiB, driver {gpu['driver_version']})"
        + (" [SIMULATED]" if gpu["simulated"] else "") + f" from {origin}",
        "",
        f"Release  vLLM {result['vllm_version']} (" + ", ".join(f"{k} {v}" for k, v in pins.items() if k != "vllm")
        + f"); engine {result['engine']}, attention {result['attention_backend']}",
        f"Layout   {len(result['replicas'])} replica(s) x TP {result['tensor_parallel_size']}"
        + (f" x PP {result['pipeline_parallel_size']} across {result['nodes']} nodes (each node: the GPUs below)"
           if result["pipeline_parallel_size"] > 1 else ""),
    ]
    for replica in result["replicas"]:
        where = f"socket {replica['socket']}, CPUs {replica['cpu_list']}" if replica["cpu_list"] else "no CPU pinning"
        lines.append(f"  {replica['name']}  port {replica['port']}  GPUs {replica['cuda_visible_devices']}  {where}")
    lines += ["", f"Command of {result['replicas'][0]['name']}:"]
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in result["env"].items())
    lines.append(f"  {env} \\")
    lines.append(f"  python {' '.join(result['entrypoint'])} \\")
    args = result["args"]
    chunks: List[str] = []
    for token in args:
        if token.startswith("--") or not chunks:
            chunks.append(token)
        else:
            chunks[-1] += " " + shlex.quote(token)
    lines += [f"    {chunk}" + (" \\" if n < len(chunks) - 1 else "") for n, chunk in enumerate(chunks)]
    lines += [
        "",
        f"KV cache {kv['log_line']} (per GPU worker, {kv['sizing']})",
        f"  {kv['tokens']} tokens per replica: {kv['max_concurrency_at_max_model_len']:g} sequences of "
        f"{settings['max_model_len']}, {kv['max_concurrency_at_typical_len']:g} of {kv['typical_sequence_tokens']}; "
        f"{kv['bytes_per_block']} bytes per block",
        f"  per GPU: budget {kv['budget_bytes'] / GiB:.2f} GiB = weights {kv['weights_per_gpu_bytes'] / GiB:.2f} + "
        f"profile peak {kv['peak_activation_bytes'] / GiB:.2f} + non-torch {kv['non_torch_bytes'] / GiB:.2f} + KV "
        f"{kv['kv_bytes'] / GiB:.2f}",
        "",
        f"Layouts compared at concurrency {result['workload']['concurrency']} "
        f"(p95 e2e target {result['workload']['slo_p95_e2e_s']:g} s):",
    ]
    for candidate in result["layout"]["candidates"]:
        head = f"  {candidate['replicas']}x TP{candidate['tensor_parallel_size']}" + (
            f" x PP{candidate['pipeline_parallel_size']} (layers {candidate['stage_layers']})"
            if "pipeline_parallel_size" in candidate else "")
        if candidate["feasible"]:
            p = candidate["predicted"]
            lines.append(f"{head}: {candidate['total_throughput_tok_s']:.0f} tok/s, {p['per_stream_tok_s']:g} "
                         f"tok/s/stream, TTFT p50 {p['ttft_p50_s']:g} s, p95 e2e {p['e2e_p95_s']:g} s"
                         + ("" if candidate["meets_slo"] else "  (misses the SLO)"))
        else:
            lines.append(f"{head}: not possible: {candidate['why_not']}")
    lines += ["", "Reasons:"]
    for reason in result["reasons"]:
        value = reason["value"] if not isinstance(reason["value"], (dict, list)) else json.dumps(reason["value"])
        lines.append(f"  - {reason['decision']} = {value}: {reason['reason']} [{reason['source']}]")
    if result["warnings"]:
        lines += ["", "Warnings:"] + [f"  - {warning}" for warning in result["warnings"]]
    return "\n".join(lines) + "\n"


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    try:
        result, origin = plan(args)
    except InputError as exc:
        print(f"revive plan: {exc}", file=sys.stderr)
        return 2
    except PlanInputError as exc:
        print(f"revive plan: {exc.message(option_for(exc.field))}", file=sys.stderr)
        return 2
    except PlanRefusal as exc:
        if args.json:
            sys.stdout.write(json.dumps({"refused": True, "reason": exc.reason, "source": exc.source}, indent=2) + "\n")
        print(f"revive plan: REFUSED: {exc.reason} [{exc.source}]", file=sys.stderr)
        return 1
    except PlanError as exc:
        print(f"revive plan: planner error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - no traceback for any input; the tests fail on this text
        print(f"revive plan: internal error (a bug in revive, not your input: report it with the command line): "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        sys.stdout.write(human(result, origin))
    return 0
