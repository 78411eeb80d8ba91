"""`python -m vllm.entrypoints.openai.api_server` for the twin: start-up, serving, shutdown.

Process-level behaviour of 0.5.4 that the lab depends on:
* Argument errors exit 2 (argparse). A model path that does not exist fails in the API process: exit 1.
* Engine start-up errors: with --disable-frontend-multiprocessing the exception ends the process (exit
  1). In the default mode the engine runs in an RPC process; when it fails there, 0.5.4's API process
  prints the child's traceback and then waits for the engine forever (#7213, fixed after 0.5.4 by
  PR #7217): the port never opens and the process stays up until killed. The twin does the same.
* The HTTP port opens only after weights are loaded, the KV cache is sized and graphs are captured.
* SIGTERM/SIGINT (launcher.py:27-46, api_server.py:342-359, reference/lb-and-rolling.md §4.3): the
  listener closes at once. In the default mode the engine process is terminated before uvicorn waits for
  connections, so open streams are cut (no finish_reason, no [DONE]) and waiting requests fail. With
  --disable-frontend-multiprocessing the engine keeps running and in-flight requests finish first;
  but if the TP worker processes get the signal too (systemd's default KillMode=control-group), the
  engine dies with them and the streams are cut. Exit status 0 either way.
* SIGKILL, OOM kill and crashes cut streams the same way (the kernel closes the sockets).
"""
from __future__ import annotations

import asyncio
import os
import signal
import ssl
import sys
import time
import traceback
from typing import Dict, List, Optional

from vllm._twin import settings as settings_mod
from vllm._twin import startup, vlog
from vllm._twin.api import ApiConfig, OpenAIApp
from vllm._twin.engine import Engine
from vllm._twin.http import HttpServer, stdout_log
from vllm._twin.metrics import VllmMetrics
from vllm._twin.runner import Runner
from vllm._twin.utilization import UtilizationReporter
from vllm._twin.workers import WorkerSet
from vllm.version import __version__

ROUTES = [("/openapi.json", "GET, HEAD"), ("/docs", "GET, HEAD"), ("/docs/oauth2-redirect", "GET, HEAD"),
          ("/redoc", "GET, HEAD"), ("/health", "GET"), ("/tokenize", "POST"), ("/detokenize", "POST"),
          ("/v1/models", "GET"), ("/version", "GET"), ("/v1/chat/completions", "POST"),
          ("/v1/completions", "POST"), ("/v1/embeddings", "POST")]


def _print_failure(failure: startup.StartupFailure, child: bool) -> None:
    """The traceback 0.5.4 prints: the twin's frames, then 0.5.4's exception type and message."""
    lines = []
    if child:
        lines.append("Process Process-1:")
    lines.append("Traceback (most recent call last):")
    lines.extend(line.rstrip("\n") for line in traceback.format_tb(failure.__traceback__))
    lines.append(f"{failure.exc_type}: {failure.message}")
    sys.stdout.flush()
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


def _hang_forever() -> int:
    """0.5.4's API process after its engine process died at start-up: waiting for it, forever."""
    vlog.sim("the engine failed to start; like vLLM 0.5.4 in its default frontend-multiprocessing mode, the API "
             "server now waits for it forever (the port never opens). Stop the process to end it.")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        signal.pause()


def main(argv: Optional[List[str]] = None) -> int:
    from vllm.entrypoints.openai.cli_args import build_parser
    args = build_parser().parse_args(argv)
    try:
        settings = settings_mod.load()
    except (settings_mod.SettingsError, OSError) as exc:
        sys.stderr.write(f"vLLM twin: {exc}\n")
        return 2
    environ = dict(os.environ)
    vlog.info("api_server.py:339", f"vLLM API server version {__version__}")
    vlog.sim("This is the revive lab's twin of vLLM 0.5.4, a simulation: no model runs and no GPU is used. "
             "Timings come from a performance model calibrated to the field notes (lab/vllm_twin/README.md).")
    vlog.sim(f"time scale {settings.time_scale} (VLLM_SIM_TIME_SCALE), cold start over "
             f"{settings.effective_cold_start_requests()} requests x{settings.cold_start_factor}, "
             f"env file {settings.env_file or 'none'}")
    faults = settings.faults()
    vlog.sim("fault knobs in effect: " + (", ".join(f"{k}={v}" for k, v in faults.items()) if faults else "none"))
    vlog.info("api_server.py:340", f"args: {args}")

    try:
        facts = startup.inspect_model_dir(args.model)
    except startup.StartupFailure as failure:
        _print_failure(failure, child=False)
        return 1
    vlog.sim(f"model facts (module_utils/revive_model.py): {startup.model_summary(facts)}")

    workers = WorkerSet()
    start_time = time.time()

    def spawn_workers(world: int) -> List[str]:
        if world <= 1:
            return []
        pids = workers.spawn(world - 1)
        return [f"(VllmWorkerProcess pid={pid}) " for pid in pids]

    def wait(seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds * settings.time_scale)

    child = not args.disable_frontend_multiprocessing
    try:
        setup = startup.build_engine(args, facts, environ, settings, wait, spawn_workers)
    except startup.StartupFailure as failure:
        workers.kill_all()
        _print_failure(failure, child=child)
        if child:
            return _hang_forever()
        return 1
    return asyncio.run(_serve(args, setup, settings, workers, start_time))


async def _serve(args, setup: startup.EngineSetup, settings: settings_mod.Settings, workers: WorkerSet,
                 start_time: float) -> int:
    loop = asyncio.get_running_loop()
    frontend_multiprocessing = not args.disable_frontend_multiprocessing
    engine = Engine(setup.engine_config)
    vllm_metrics = None
    if not args.disable_log_stats:
        vllm_metrics = VllmMetrics(setup.served_model_names[0], setup.max_model_len)
        vllm_metrics.set_cache_config(setup.cache_config_info)
    utilization = UtilizationReporter(settings.utilization_file, [g.nvml_index for g in setup.group],
                                      settings.busy_gpu_rank, settings.busy_gpu_extra_percent, vlog.sim)
    utilization.maybe_flush(force=True)
    runner = Runner(engine, setup.perf_model, settings, setup.block_bytes, vllm_metrics, not args.disable_log_stats,
                    utilization)
    api_key = os.environ.get("VLLM_API_KEY") or args.api_key
    config = ApiConfig(
        served_model_names=setup.served_model_names, max_model_len=setup.max_model_len,
        response_role=args.response_role or "assistant", api_key=api_key, root_path=args.root_path or "",
        log_requests=not args.disable_log_requests, max_log_len=args.max_log_len,
        vllm_metrics=not frontend_multiprocessing and vllm_metrics is not None, max_logprobs=args.max_logprobs,
        allowed_origins=args.allowed_origins, allow_credentials=args.allow_credentials,
        allowed_methods=args.allowed_methods, allowed_headers=args.allowed_headers)
    version_info: Dict[str, object] = {"version": __version__, "simulated": True, "simulates": "0.5.4",
                                       "twin": settings.report()}
    app = OpenAIApp(config, runner, settings, version_info, start_time, frontend_multiprocessing)
    access_log = args.uvicorn_log_level in ("debug", "info", "trace")
    server = HttpServer(app, stdout_log, access_log=access_log)

    def crash(reason: str) -> None:
        vlog.error("twin", f"[twin fault] simulated crash ({reason}); exiting with status {settings.crash_exit_code}")
        utilization.clear()
        workers.kill_all()
        sys.stdout.flush()
        os._exit(settings.crash_exit_code)

    app.faults.crash = crash

    def worker_died(pid: int, code: int) -> None:
        vlog.error("multiproc_worker_utils.py:120", f"Worker VllmWorkerProcess pid {pid} died, exit code: {code}")
        vlog.info("multiproc_worker_utils.py:123", "Killing local vLLM worker processes")
        workers.kill_all()
        runner.kill(f"Worker VllmWorkerProcess pid {pid} died, exit code: {code}")

    if workers.pids:
        workers.watch(worker_died)

    vlog.info("launcher.py:14", "Available routes are:")
    for path, methods in ROUTES:
        vlog.info("launcher.py:22", f"Route: {path}, Methods: {methods}")
    ssl_context = None
    if args.ssl_certfile:
        ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ssl_context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
        if args.ssl_ca_certs:
            ssl_context.load_verify_locations(args.ssl_ca_certs)
        ssl_context.verify_mode = ssl.VerifyMode(args.ssl_cert_reqs)
    stdout_log(f"INFO:     Started server process [{os.getpid()}]")
    stdout_log("INFO:     Waiting for application startup.")
    stdout_log("INFO:     Application startup complete.")
    try:
        await server.listen(args.host, args.port, ssl_context)
    except OSError as exc:
        stdout_log(f"ERROR:    {exc}")
        utilization.clear()
        workers.kill_all()
        return 1
    scheme = "https" if ssl_context else "http"
    stdout_log(f"INFO:     Uvicorn running on {scheme}://{args.host or '0.0.0.0'}:{args.port} (Press CTRL+C to quit)")

    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    if settings.crash_after_seconds is not None:
        loop.call_later(settings.crash_after_seconds * settings.time_scale, crash,
                        f"VLLM_SIM_FAULT_CRASH_AFTER_SECONDS={settings.crash_after_seconds}")
    engine_task = loop.create_task(runner.run())
    log_task = loop.create_task(runner.force_log())
    await stop.wait()

    vlog.info("launcher.py:45", "Gracefully stopping http server")
    server.stop_listening()
    if frontend_multiprocessing:
        # The RPC engine process is terminated before uvicorn waits: streams are cut.
        vlog.info("server.py:203", "vLLM ZMQ RPC Server was interrupted.")
        workers.kill_all()
        runner.stop()
        app.cut_all()
        app._engine_died("the engine process was terminated")
    stdout_log("INFO:     Shutting down")
    if any(c.busy for c in server.connections):
        stdout_log("INFO:     Waiting for connections to close. (CTRL+C to force quit)")
    await server.wait_idle()
    stdout_log("INFO:     Waiting for application shutdown.")
    stdout_log("INFO:     Application shutdown complete.")
    runner.stop()
    log_task.cancel()
    engine_task.cancel()
    workers.kill_all()
    utilization.clear()
    return 0
