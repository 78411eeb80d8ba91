"""`python -m vllm.entrypoints.openai.api_server` for the twin: start-up, serving, shutdown.

Process-level behaviour the lab depends on, per simulated release (vllm/_twin/release.py):
* Argument errors exit 2 (argparse). A model path that does not exist fails in the API process: exit 1.
* Engine start-up errors. With --disable-frontend-multiprocessing the exception ends the process (exit 1)
  in both releases. In the default mode the engine runs in its own process:
  - 0.5.4: the API process prints the child's traceback and then waits for the engine forever (#7213,
    fixed after 0.5.4 by PR #7217): the port never opens and the process stays up until killed.
  - 0.8.5.post1: the configuration is built in the API process first, so configuration errors (and the
    V1-on-Volta NotImplementedError with VLLM_USE_V1=1) end it at once (exit 1). An error in the engine
    process prints `Process SpawnProcess-1:` with its traceback; the API process notices at its next RPC
    poll (every VLLM_RPC_TIMEOUT ms, default 10000) and exits 1 with `RuntimeError: Engine process failed
    to start. See stack trace for the root cause.` (v0.8.5.post1:vllm/entrypoints/openai/api_server.py:262-271).
* The HTTP port opens only after weights are loaded, the KV cache is sized and graphs are captured
  (0.8.5.post1 binds the socket before the engine starts and listens after, api_server.py:1062-1066).
* SIGTERM/SIGINT, default mode:
  - 0.5.4 (launcher.py:27-46, api_server.py:342-359): the listener closes at once, the engine process is
    terminated before uvicorn waits for connections, so open streams are cut (no finish_reason, no [DONE])
    and waiting requests fail. Exit 0.
  - 0.8.5.post1: the listener closes at once (launcher.py:60-79: the serve task is cancelled), the engine
    process is terminated and the engine client closed (api_server.py:278-292), which cancels the loop
    that delivers outputs; open requests get nothing more and are not ended: uvicorn waits for their
    connections to close (no timeout) and the process exits 0 once the clients have gone. Under systemd
    the stop ends with SIGKILL after TimeoutStopSec if a client keeps its stream open. Further signals do
    nothing (vLLM's handler only cancels the serve task again).
  With --disable-frontend-multiprocessing (both releases) the engine keeps running in the API process and
  in-flight requests finish first; but if the TP worker processes get the signal too (systemd's default
  KillMode=control-group), the engine dies with them: 0.5.4 cuts the streams, 0.8.5.post1 ends them with
  an error event and [DONE].
* A dead engine while serving (a worker died): 0.5.4 stays up, /health answers 500. On 0.5.4's Ray executor
  a worker (or its node) that dies is noticed at the engine's next step, at once while requests run
  (vllm/_twin/ray_executor.py); the engine is then dead the same way. 0.8.5.post1 ends open
  streams with an error event and [DONE], answers 500, and its watchdog (every 5 s, launcher.py:85-108)
  or the first 500 stops the server: exit 0 (unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH is set).
* SIGKILL, OOM kill and crashes cut streams the same way (the kernel closes the sockets).
"""
from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import ssl
import sys
import time
import traceback
from typing import Dict, List, Optional

from vllm._twin import settings as settings_mod
from vllm._twin import perf, startup, vlog
from vllm._twin.api import ApiConfig, OpenAIApp
from vllm._twin.engine import Engine
from vllm._twin.http import HttpServer, stdout_log
from vllm._twin.metrics import VllmMetrics
from vllm._twin.release import current, pick
from vllm._twin.runner import Runner
from vllm._twin.utilization import UtilizationReporter
from vllm._twin.workers import WorkerSet
from vllm.version import __version__

ROUTES = [("/openapi.json", "GET, HEAD"), ("/docs", "GET, HEAD"), ("/docs/oauth2-redirect", "GET, HEAD"),
          ("/redoc", "GET, HEAD"), ("/health", "GET"), ("/tokenize", "POST"), ("/detokenize", "POST"),
          ("/v1/models", "GET"), ("/version", "GET"), ("/v1/chat/completions", "POST"),
          ("/v1/completions", "POST"), ("/v1/embeddings", "POST")]
# What each release's app registers without the dev-mode, profiler and LoRA-update switches, in registration
# order (serve_http logs them, v0.8.5.post1:vllm/entrypoints/launcher.py:28-36): FastAPI's documentation
# routes, the router's routes, and the instrumentator's /metrics from 0.8 on.
_DOCS = [("/openapi.json", "GET, HEAD"), ("/docs", "GET, HEAD"), ("/docs/oauth2-redirect", "GET, HEAD"),
         ("/redoc", "GET, HEAD")]
_CORE = [("/tokenize", "POST"), ("/detokenize", "POST"), ("/v1/models", "GET"), ("/version", "GET"),
         ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"), ("/v1/embeddings", "POST"),
         ("/pooling", "POST")]
_RERANK = [("/rerank", "POST"), ("/v1/rerank", "POST"), ("/v2/rerank", "POST")]
# v0.8.5.post1:vllm/entrypoints/openai/api_server.py:328-331 (instrumentator), 391-738
ROUTES_085 = (_DOCS + [("/health", "GET"), ("/load", "GET"), ("/ping", "POST, GET")] + _CORE
              + [("/score", "POST"), ("/v1/score", "POST"), ("/v1/audio/transcriptions", "POST")] + _RERANK
              + [("/invocations", "POST"), ("/metrics", "GET")])
ROUTES_BY_RELEASE = {
    # v0.6.6.post1:vllm/entrypoints/openai/api_server.py:311-481 (no instrumentator)
    "0.6.6.post1": _DOCS + [("/health", "GET")] + _CORE + [("/score", "POST"), ("/v1/score", "POST")],
    # v0.7.3:vllm/entrypoints/openai/api_server.py:343-647 (no instrumentator)
    "0.7.3": (_DOCS + [("/health", "GET"), ("/ping", "POST, GET")] + _CORE
              + [("/score", "POST"), ("/v1/score", "POST"), ("/v1/audio/transcriptions", "POST")] + _RERANK
              + [("/invocations", "POST")]),
    "0.8.5.post1": ROUTES_085,
    # v0.9.2:vllm/entrypoints/openai/api_server.py:342-346 (instrumentator), 415-963: /ping is two routes
    "0.9.2": (_DOCS + [("/health", "GET"), ("/load", "GET"), ("/ping", "GET"), ("/ping", "POST")] + _CORE
              + [("/classify", "POST"), ("/score", "POST"), ("/v1/score", "POST"), ("/v1/audio/transcriptions", "POST"),
                 ("/v1/audio/translations", "POST")] + _RERANK + [("/invocations", "POST"), ("/metrics", "GET")]),
}
RPC_TIMEOUT_MS = 10000        # VLLM_RPC_TIMEOUT's default (v0.8.5.post1:vllm/envs.py:488-489)
WATCHDOG_SECONDS = 5.0        # VLLM_WATCHDOG_TIME_S (v0.8.5.post1:vllm/entrypoints/launcher.py:85-94)
# the worker prefix's colours (v0.8.5.post1:vllm/executor/multiproc_worker_utils.py:28-29)
CYAN, RESET = "\033[1;36m", "\033[0;0m"


def _print_failure(failure: startup.StartupFailure, child: bool) -> None:
    """The traceback vLLM prints: the twin's frames, then the release's exception type and message.

    The engine process is `Process-1` in 0.5.4 (fork) and `SpawnProcess-1` in 0.8.5.post1 (spawn,
    api_server.py:229)."""
    lines = []
    if child:
        lines.append(pick("Process Process-1:", "Process SpawnProcess-1:"))
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


def _engine_exception_log(failure: startup.StartupFailure) -> None:
    """run_mp_engine's logger.exception(e) in the engine process (v0.8.5.post1:vllm/engine/multiprocessing/
    engine.py:447-450): the message, then the traceback on continuation lines."""
    frames = "".join(traceback.format_tb(failure.__traceback__)).rstrip("\n")
    vlog.error(current().source("engine_exception", "engine.py:448"),
               f"{failure.message}\nTraceback (most recent call last):\n{frames}\n"
               f"{failure.exc_type}: {failure.message}")


def _engine_start_failed(failure: startup.StartupFailure, engine_started_at: float,
                         settings: settings_mod.Settings) -> int:
    """0.8.5.post1's API process after its engine process died at start-up: it notices when its current
    RPC poll times out (polls restart every VLLM_RPC_TIMEOUT ms from the engine's start) and raises."""
    raw = os.environ.get("VLLM_RPC_TIMEOUT", str(RPC_TIMEOUT_MS))
    period = int(raw) / 1000.0 * settings.time_scale
    elapsed = time.monotonic() - engine_started_at
    polls = max(1, math.ceil(elapsed / period)) if period > 0 else 1
    time.sleep(max(0.0, polls * period - elapsed))
    vlog.sim(f"the engine failed to start; the API process noticed at its RPC poll after {polls} x "
             f"VLLM_RPC_TIMEOUT={raw} ms (scaled by {settings.time_scale})")
    failed = startup.StartupFailure("RuntimeError", "Engine process failed to start. See stack trace for the "
                                    "root cause.", in_engine=False)
    try:
        raise failed
    except startup.StartupFailure as raised:
        _print_failure(raised, child=False)
    return 1


def _namespace_defaults(args) -> None:
    """Attributes the twin reads that a partial CLI table (cli.complete false) lacks get the release's
    defaults, so the twin runs with the interim table too."""
    from vllm._twin.cli_table import MISSING_DEFAULTS
    for name, value in MISSING_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, value)


def main(argv: Optional[List[str]] = None) -> int:
    from vllm.entrypoints.openai.cli_args import build_parser
    release = current()
    args = build_parser().parse_args(argv)
    if not release.legacy:
        _namespace_defaults(args)
    try:
        settings = settings_mod.load()
    except (settings_mod.SettingsError, OSError) as exc:
        sys.stderr.write(f"vLLM twin: {exc}\n")
        return 2
    environ = dict(os.environ)
    vlog.info(release.source("version", "api_server.py:1043"), f"vLLM API server version {__version__}")
    vlog.sim(f"This is the revive lab's twin of vLLM {release.release}, a simulation: no model runs and no GPU is "
             "used. Timings come from a performance model calibrated to the field notes (lab/vllm_twin/README.md).")
    if release.behaviour.parser == "table" and not release.cli_complete:
        vlog.sim(f"the command line is built from a partial CLI table ({len(release.arguments)} arguments, "
                 "data/vllm-releases.yml cli.complete: false): other flags of the real release exit 2 here")
    if settings.metrics_clock == "modelled":
        vlog.sim(f"latency histograms in modelled seconds: elapsed wall time / {settings.time_scale} "
                 "(VLLM_SIM_METRICS_CLOCK=modelled; vLLM observes wall time)")
    vlog.sim(f"time scale {settings.time_scale} (VLLM_SIM_TIME_SCALE), cold start over "
             f"{settings.effective_cold_start_requests()} requests x{settings.cold_start_factor}, "
             f"env file {settings.env_file or 'none'}, answers log-normal around {settings.answer_median:g} tokens "
             "(VLLM_SIM_ANSWER_MEDIAN)")
    faults = settings.faults()
    vlog.sim("fault knobs in effect: " + (", ".join(f"{k}={v}" for k, v in faults.items()) if faults else "none"))
    if release.behaviour.args_line == "non-default":
        vlog.info(release.source("args", "api_server.py:1044"), f"non-default args: {_non_default_args(args)}")
    else:
        vlog.info(release.source("args", "api_server.py:1044"), f"args: {args}")
    sock = None
    if not release.legacy:
        # bound before the engine is set up (#8204), listening once it is ready (api_server.py:1062-1066)
        try:
            sock = bind_socket(args.host, args.port)
        except OSError as exc:
            failure = startup.StartupFailure("OSError", str(exc), in_engine=False)
            try:
                raise failure
            except startup.StartupFailure as raised:
                _print_failure(raised, child=False)
            return 1

        def terminated(*_) -> None:
            # a signal while the engine starts interrupts the server (api_server.py:1072-1076): the
            # KeyboardInterrupt's traceback, then Python ends the process with SIGINT
            raise KeyboardInterrupt("terminated")

        signal.signal(signal.SIGTERM, terminated)

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
        return [pick(f"(VllmWorkerProcess pid={pid}) ", f"{CYAN}(VllmWorkerProcess pid={pid}){RESET} ")
                for pid in pids]

    def wait(seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds * settings.time_scale)

    frontend_multiprocessing = not args.disable_frontend_multiprocessing
    engine_started_at: List[float] = []

    def engine_started() -> None:
        engine_started_at.append(time.monotonic())
        if frontend_multiprocessing and not release.legacy:
            vlog.info(release.source("engine_pid", "api_server.py:246"),
                      f"Started engine process with PID {os.getpid()}")
            vlog.sim("the simulated engine runs inside the API process; the PID above is the API process's own")

    try:
        setup = startup.build_engine(args, facts, environ, settings, wait, spawn_workers, engine_started)
    except startup.StartupFailure as failure:
        workers.kill_all()
        child = frontend_multiprocessing and failure.in_engine
        if child and not release.legacy:
            _engine_exception_log(failure)
        _print_failure(failure, child=child)
        if child and release.behaviour.engine_start_failure == "hang":
            return _hang_forever()
        if child:
            return _engine_start_failed(failure, engine_started_at[0], settings)
        return 1
    return asyncio.run(_serve(args, setup, settings, workers, start_time, sock))


def _non_default_args(args) -> Dict[str, object]:
    """log_non_default_args (v0.9.2:vllm/entrypoints/openai/cli_args.py:319-325): every argument whose value
    differs from the parser's default."""
    from vllm.entrypoints.openai.cli_args import build_parser
    defaults = vars(build_parser().parse_args([]))
    return {name: value for name, value in vars(args).items() if name in defaults and defaults[name] != value}


def bind_socket(host: Optional[str], port: int) -> socket.socket:
    """create_server_socket (v0.8.5.post1:vllm/entrypoints/openai/api_server.py:1029-1039)."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host or "", port))
    return sock


async def _serve(args, setup: startup.EngineSetup, settings: settings_mod.Settings, workers: WorkerSet,
                 start_time: float, sock: Optional[socket.socket] = None) -> int:
    release = current()
    loop = asyncio.get_running_loop()
    frontend_multiprocessing = not args.disable_frontend_multiprocessing
    engines = [Engine(setup.engine_config) for _ in range(setup.virtual_engines)]
    ray_cluster = setup.ray_executor
    vllm_metrics = None
    if not args.disable_log_stats:
        graph_sizes = [] if args.enforce_eager else perf.graph_batch_sizes(setup.engine_config.max_num_seqs)
        vllm_metrics = VllmMetrics(setup.served_model_names[0], setup.max_model_len, release.metrics,
                                   release.behaviour.metrics_era, graph_sizes, settings.metrics_duration_factor())
        vllm_metrics.set_cache_config(setup.cache_config_info)
    utilization = UtilizationReporter(settings.utilization_file, [g.nvml_index for g in setup.group],
                                      settings.busy_gpu_rank, settings.busy_gpu_extra_percent, vlog.sim)
    if ray_cluster is not None:
        utilization.remote = ray_cluster.mirror_utilization
    utilization.maybe_flush(force=True)
    runner = Runner(engines, setup.perf_model, settings, setup.block_bytes, vllm_metrics, not args.disable_log_stats,
                    utilization, setup.cache_blocks)
    api_key = os.environ.get("VLLM_API_KEY") or args.api_key
    if isinstance(api_key, list):  # releases whose --api-key takes several keys
        api_key = api_key[0] if api_key else None
    needs_in_process = release.data.metrics_need_disable_frontend_multiprocessing
    serves_vllm_metrics = not (frontend_multiprocessing and needs_in_process)
    config = ApiConfig(
        served_model_names=setup.served_model_names, max_model_len=setup.max_model_len,
        response_role=args.response_role or "assistant", api_key=api_key, root_path=args.root_path or "",
        log_requests=not args.disable_log_requests, max_log_len=args.max_log_len,
        vllm_metrics=serves_vllm_metrics and vllm_metrics is not None, max_logprobs=args.max_logprobs,
        allowed_origins=args.allowed_origins, allow_credentials=args.allow_credentials,
        allowed_methods=args.allowed_methods, allowed_headers=args.allowed_headers,
        # 0.8.5.post1's default mode reads the engine's metrics through PROMETHEUS_MULTIPROC_DIR
        multiprocess_metrics=frontend_multiprocessing and not release.legacy)
    version_info: Dict[str, object] = {"version": __version__, "simulated": True, "simulates": release.release,
                                       "twin": settings.report()}
    app = OpenAIApp(config, runner, settings, version_info, start_time, frontend_multiprocessing)
    access_log = args.uvicorn_log_level in ("debug", "info", "trace")
    if not release.legacy and getattr(args, "disable_uvicorn_access_log", False):
        access_log = False
    server = HttpServer(app, stdout_log, access_log=access_log)
    stop = asyncio.Event()

    def leave_ray() -> None:
        if ray_cluster is not None and not ray_cluster.closing:
            ray_cluster.shutdown()

    def crash(reason: str) -> None:
        vlog.error("twin", f"[twin fault] simulated crash ({reason}); exiting with status {settings.crash_exit_code}")
        utilization.clear()
        workers.kill_all()
        sys.stdout.flush()
        os._exit(settings.crash_exit_code)

    app.faults.crash = crash

    def worker_died(pid: int, code: int) -> None:
        if release.legacy:
            handle_worker_death(pid, code)
        else:
            # through the engine process's WorkerMonitor and ZMQ to the API process: not instantaneous, so a
            # SIGTERM sent to the whole unit at once reaches the API process first (then nothing is delivered)
            loop.call_later(0.05, handle_worker_death, pid, code)

    def handle_worker_death(pid: int, code: int) -> None:
        if stop.is_set() and not release.legacy:
            return
        vlog.error(pick("multiproc_worker_utils.py:120", "multiproc_worker_utils.py:120"),
                   f"Worker VllmWorkerProcess pid {pid} died, exit code: {code}")
        vlog.info(pick("multiproc_worker_utils.py:123", "multiproc_worker_utils.py:124"),
                  "Killing local vLLM worker processes")
        workers.kill_all()
        runner.kill(f"Worker VllmWorkerProcess pid {pid} died, exit code: {code}")

    if workers.pids:
        workers.watch(worker_died)

    def ray_worker_lost(reason: str) -> None:
        if not runner.worker_lost(reason):
            vlog.sim("the engine is idle: vLLM 0.5.4 learns of the lost worker from its next model execution, so "
                     "/health answers 200 until a request arrives, which then fails and leaves the engine dead")

    watch_task = loop.create_task(ray_cluster.watch(ray_worker_lost)) if ray_cluster is not None else None

    ssl_context = None
    if args.ssl_certfile:
        ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ssl_context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
        if args.ssl_ca_certs:
            ssl_context.load_verify_locations(args.ssl_ca_certs)
        ssl_context.verify_mode = ssl.VerifyMode(args.ssl_cert_reqs)
    scheme = "https" if ssl_context else "http"
    if release.legacy:
        routes = ROUTES
        vlog.info("launcher.py:14", "Available routes are:")
        for path, methods in routes:
            vlog.info("launcher.py:22", f"Route: {path}, Methods: {methods}")
    else:
        host = args.host or "0.0.0.0"
        address = f"{scheme}://{'[' + host + ']' if ':' in host else host}:{args.port}"
        start_line = release.behaviour.server_start_line
        if start_line:
            index = " 0" if start_line == "indexed" else ""
            vlog.info(release.source("server_start", "api_server.py:1090"),
                      f"Starting vLLM API server{index} on {address}")
        vlog.info(release.source("routes", "launcher.py:28"), "Available routes are:")
        for path, methods in ROUTES_BY_RELEASE.get(release.release, ROUTES_085):
            vlog.info(release.source("route", "launcher.py:36"), f"Route: {path}, Methods: {methods}")
    stdout_log(f"INFO:     Started server process [{os.getpid()}]")
    stdout_log("INFO:     Waiting for application startup.")
    stdout_log("INFO:     Application startup complete.")
    try:
        await server.listen(args.host, args.port, ssl_context, sock=sock)
    except OSError as exc:
        stdout_log(f"ERROR:    {exc}")
        utilization.clear()
        workers.kill_all()
        leave_ray()
        return 1
    if release.behaviour.uvicorn_running_line:
        stdout_log(f"INFO:     Uvicorn running on {scheme}://{args.host or '0.0.0.0'}:{args.port} (Press CTRL+C to "
                   "quit)")

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    if settings.crash_after_seconds is not None:
        loop.call_later(settings.crash_after_seconds * settings.time_scale, crash,
                        f"VLLM_SIM_FAULT_CRASH_AFTER_SECONDS={settings.crash_after_seconds}")
    engine_task = loop.create_task(runner.run())
    log_task = loop.create_task(runner.force_log())
    watchdog = None
    if not release.legacy:
        app.on_engine_error = lambda: engine_errored_exit(app, stop)
        if release.behaviour.engine_watchdog:
            watchdog = loop.create_task(watchdog_loop(app, stop))
    await stop.wait()
    if watchdog is not None:
        watchdog.cancel()

    if release.legacy:
        code = await _shutdown_054(server, app, runner, workers, frontend_multiprocessing)
    else:
        code = await _shutdown_085(server, app, runner, workers, frontend_multiprocessing, loop)
    runner.stop()
    log_task.cancel()
    engine_task.cancel()
    workers.kill_all()
    utilization.clear()
    if watch_task is not None:
        watch_task.cancel()
    leave_ray()
    return code


async def _shutdown_054(server: HttpServer, app: OpenAIApp, runner: Runner, workers: WorkerSet,
                        frontend_multiprocessing: bool) -> int:
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
    return 0


async def _shutdown_085(server: HttpServer, app: OpenAIApp, runner: Runner, workers: WorkerSet,
                        frontend_multiprocessing: bool, loop: asyncio.AbstractEventLoop) -> int:
    """0.8.5.post1's two ways out (module docstring): a dead engine ends uvicorn's main loop (its own shutdown,
    then the engine's); a signal cancels the serve task (the engine's exit, then uvicorn's shutdown)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: None)  # vLLM's handler only cancels the serve task again
    if app.engine_error_exit:
        stdout_log("INFO:     Shutting down")
        server.stop_listening()
        await _wait_for_connections(server)
        stdout_log(f"INFO:     Finished server process [{os.getpid()}]")
        workers.kill_all()
        runner.stop()
        return 0
    vlog.info("launcher.py:79", "Shutting down FastAPI HTTP server.")
    server.stop_listening()
    if frontend_multiprocessing:
        # engine_process.terminate() and mq_engine_client.close(): outputs are no longer delivered, open
        # requests stay open without an end
        workers.kill_all()
        runner.stop()
        app.stall_all()
        vlog.sim("SIGTERM in the default mode: the engine process was terminated and its client closed, as in "
                 "vLLM 0.8.5.post1; open requests get nothing more until their clients close the connections")
    stdout_log("INFO:     Shutting down")
    await _wait_for_connections(server)
    return 0


async def _wait_for_connections(server: HttpServer) -> None:
    """uvicorn's shutdown after the listener closed: wait for every open request, then the lifespan."""
    if any(c.busy for c in server.connections):
        stdout_log("INFO:     Waiting for connections to close. (CTRL+C to force quit)")
    await server.wait_idle()
    stdout_log("INFO:     Waiting for application shutdown.")
    stdout_log("INFO:     Application shutdown complete.")


def engine_errored_exit(app: OpenAIApp, stop: asyncio.Event) -> None:
    """terminate_if_errored (v0.8.5.post1:vllm/entrypoints/launcher.py:97-108): a dead engine stops the
    server, unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH is set."""
    if os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0").lower() not in ("0", "false", ""):
        return
    if app.runner.dead and not stop.is_set():
        app.engine_error_exit = True
        stop.set()


async def watchdog_loop(app: OpenAIApp, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.sleep(WATCHDOG_SECONDS)
        engine_errored_exit(app, stop)
