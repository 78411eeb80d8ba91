"""How playbooks/benchmark.yml calls the bench and reads its outcome (the role `benchmark` wires; this decides).

- `bench_argv(params)`: the `revive bench` argv on the bench host from the role's variables, each checked first
  (the message names the variable and says what it must be): a bad value stops the play before a sampler starts.
  The API key is never in it: the bench reads `$REVIVE_API_KEY` (argv is world-readable in /proc).
- `bench_outcome(judge_rc, summary, fail_on_inconclusive)`: whether the run failed and the message the play prints.
- `bench_limit_fact(summary, node, run)`: what `benchmark_apply` writes onto a benchmarked node (the local fact
  `revive_frontdoor`, /etc/ansible/facts.d/revive_frontdoor.fact): the recommended per-replica limit for each of
  its replicas with the argv and vLLM version it was measured on; the front door's servers take it
  (module_utils/revive_frontdoor.py) while the node's planned replica still runs that argv.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping

from .client import URLError, parse_url

EXIT_WORDS = {0: "every level passed", 1: "a level FAILED", 2: "the report or the samples could not be judged",
              3: "a level was INCONCLUSIVE or INVALID"}


class InvocationError(ValueError):
    """A role variable the bench cannot run with."""


def _positive(params: Mapping[str, Any], name: str, integer: bool = False, allow_zero: bool = False) -> float:
    value = params.get(name)
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        raise InvocationError(f"benchmark_{name} is {value!r}: it must be a {'whole ' if integer else ''}number "
                              f"{'>= 0' if allow_zero else '> 0'} (set it in the inventory or with -e)")
    return value


def bench_argv(params: Mapping[str, Any]) -> List[str]:
    """`revive bench ...` for the bench host (without the python and the tool's path)."""
    model = params.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvocationError("benchmark_model is empty: name the served model (revive_model_name)")
    url = params.get("url")
    try:
        targets = [parse_url(part) for part in str(url).split(",")]
    except URLError as exc:
        raise InvocationError(f"benchmark_url {url!r}: {exc}") from None
    levels = params.get("concurrency")
    if not isinstance(levels, list) or not levels or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                                                         for c in levels):
        raise InvocationError(f"benchmark_concurrency is {levels!r}: it must be a list of whole numbers >= 1, "
                              "e.g. [8, 16, 32, 64]")
    if len(set(levels)) != len(levels):
        raise InvocationError(f"benchmark_concurrency {levels!r} names a level twice")
    extra = params.get("extra_args") or []
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        raise InvocationError(f"benchmark_extra_args is {extra!r}: it must be a list of strings")
    if any(a == "--api-key" or a.startswith("--api-key=") for a in extra):
        raise InvocationError("benchmark_extra_args passes --api-key: set benchmark_api_key (it goes to the bench "
                              "in its environment, never on a command line)")
    return ["bench", "--url", ",".join(t.label for t in targets), "--model", model.strip(),
            "--concurrency", ",".join(str(c) for c in levels),
            "--duration", f"{_positive(params, 'duration_s'):g}", "--warmup", f"{_positive(params, 'warmup_s', allow_zero=True):g}",
            "--max-tokens", str(_positive(params, "max_tokens", integer=True)),
            "--slo-e2e-p95", f"{_positive(params, 'slo_e2e_p95_s'):g}",
            "--timeout", f"{_positive(params, 'request_timeout_s'):g}",
            "--out", str(params["out"]),
            *(["--ca-file", str(params["ca_file"])] if params.get("ca_file") else []), *extra]


def bench_outcome(judge_rc: int, summary: Dict[str, Any], fail_on_inconclusive: bool = True) -> Dict[str, Any]:
    """{"failed": bool, "message": str} from bench-judge's exit code and the judged summary."""
    levels = "; ".join(f"{level['concurrency']}: {level['verdict']['verdict']}"
                       + (f" ({level['verdict']['reasons'][0]})" if level["verdict"]["verdict"] != "PASS"
                          and level["verdict"]["reasons"] else "")
                       for level in (summary or {}).get("levels") or [])
    recommended = (summary or {}).get("recommended_concurrency")
    per_replica = (summary or {}).get("recommended_per_replica")
    failed = judge_rc in (1, 2) or (judge_rc == 3 and fail_on_inconclusive) or judge_rc not in EXIT_WORDS
    message = (f"bench: {EXIT_WORDS.get(judge_rc, f'exit status {judge_rc}')}; {levels or 'no levels'}; "
               f"recommended concurrency {recommended or 'none'}"
               + (f" ({per_replica} per replica: frontdoor_server_maxconn: {per_replica} queues the rest at the "
                  "front door)" if per_replica else ""))
    return {"failed": failed, "message": message, "recommended_concurrency": recommended,
            "recommended_per_replica": per_replica}


def bench_limit_fact(summary: Mapping[str, Any], node: str, run: str) -> Dict[str, Any]:
    """{"apply": bool, "fact": {...}, "message": str} for one benchmarked node: apply only with a recommended
    concurrency whose level the node's replicas served and passed (a FAIL at a higher level is what finds the
    limit; without any passing level there is nothing to apply) and a release header from the node's sampler."""
    per_replica = summary.get("recommended_per_replica")
    recommended = summary.get("recommended_concurrency")
    header = ((summary.get("review") or {}).get("node_headers") or {}).get(node)
    if not per_replica or not recommended:
        return {"apply": False, "fact": {}, "message": f"{node}: nothing applied - no level passed, so the bench "
                                                       "recommends no concurrency"}
    if not header or not header.get("replicas"):
        return {"apply": False, "fact": {}, "message": f"{node}: nothing applied - the node was not sampled, so "
                                                       "the bench does not know which release it measured there"}
    level = next(lv for lv in summary["levels"] if lv["concurrency"] == recommended)
    served = {r.get("node") for r in (level.get("replicas") or {}).values()}
    if node not in served:
        return {"apply": False, "fact": {}, "message": f"{node}: nothing applied - none of its replicas served the "
                                                       f"recommended level {recommended}"}
    verdict = ((level.get("nodes") or {}).get(node) or {}).get("verdict")
    if verdict in ("FAIL", "INVALID"):
        # INCONCLUSIVE alone does not block: a replica's share of a passing level may be too few completions for
        # its own bound; the level as a whole had them
        return {"apply": False, "fact": {}, "message": f"{node}: nothing applied - its own verdict at the "
                                                       f"recommended level {recommended} is {verdict}"}
    replicas = {r["name"]: {"maxconn": int(per_replica), "argv": list(r.get("argv") or []),
                            "vllm_version": header.get("vllm_version"), "port": r.get("port")}
                for r in header["replicas"]}
    fact = {"bench": run, "recommended_concurrency": recommended, "release_id": header.get("release_id"),
            "replicas": replicas}
    return {"apply": True, "fact": fact,
            "message": f"{node}: maxconn {per_replica} for {', '.join(sorted(replicas))} (the level {recommended} "
                       f"of {run} shared by the replicas that served it); the front door takes it at its next "
                       "converge (site.yml or playbooks/rolling.yml reload HAProxy, the servers' states kept)"}
