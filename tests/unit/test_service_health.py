"""roles/vllm_service/files/vllm-wait-healthy: the ExecStartPost= that makes "started" mean "serving"."""
from __future__ import annotations

import http.server
import importlib.machinery
import importlib.util
import subprocess
import sys
import threading
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "roles/vllm_service/files/vllm-wait-healthy"


def load_waiter():
    loader = importlib.machinery.SourceFileLoader("vllm_wait_healthy", str(SCRIPT))
    spec = importlib.util.spec_from_loader("vllm_wait_healthy", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


waiter = load_waiter()


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def run(answers, deadline=10.0, alive=lambda: True):
    clock = FakeClock()
    said = []
    answers = iter(answers)
    ok, message = waiter.wait_healthy(lambda: next(answers), alive, deadline, 1.0, clock, clock.sleep, said.append)
    return ok, message, clock.now, said


def test_healthy_once_health_answers_200():
    ok, message, elapsed, _ = run([(None, "ConnectionRefusedError: refused")] * 3 + [(200, "HTTP 200")])
    assert (ok, message, elapsed) == (True, "/health answered 200 after 3 s", 3.0)


def test_a_500_or_a_closed_port_until_the_deadline_fails_the_start():
    ok, message, elapsed, _ = run([(500, "HTTP 500")] * 100, deadline=5)
    assert not ok and elapsed == 5.0
    assert message == ("/health did not answer 200 within the 5 s start deadline (last: HTTP 500); the replica is "
                       "not serving")


def test_a_dead_main_process_ends_the_wait_at_once():
    lives = iter([True, True, False])
    ok, message, elapsed, _ = run([(None, "refused")] * 10, deadline=600, alive=lambda: next(lives))
    assert (ok, message, elapsed) == (False, "the main process exited after 2 s, before /health answered 200", 2.0)


def test_progress_goes_to_the_journal_every_30_seconds():
    _, _, _, said = run([(None, "ConnectionRefusedError: refused")] * 100, deadline=65)
    assert said == ["vllm-wait-healthy: waiting for /health, 30 of 65 s (last: ConnectionRefusedError: refused)",
                    "vllm-wait-healthy: waiting for /health, 60 of 65 s (last: ConnectionRefusedError: refused)"]


@pytest.fixture
def health_server():
    status = {"code": 503}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            code = status["code"] if self.path == "/health" else 404
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], status
    server.shutdown()
    server.server_close()


def test_the_script_exits_0_against_a_serving_port(health_server):
    port, status = health_server
    status["code"] = 200
    proc = subprocess.run([sys.executable, "-I", str(SCRIPT), "--port", str(port), "--deadline", "5"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"vllm-wait-healthy: port {port}: /health answered 200 after")


def test_the_script_exits_1_when_health_stays_503(health_server):
    port, _ = health_server
    proc = subprocess.run([sys.executable, "-I", str(SCRIPT), "--port", str(port), "--deadline", "1.5",
                           "--interval", "0.5"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "did not answer 200 within the 2 s start deadline (last: HTTP 503)" in proc.stderr


def test_the_script_exits_1_when_the_main_pid_is_gone(health_server):
    port, _ = health_server
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    proc = subprocess.run([sys.executable, "-I", str(SCRIPT), "--port", str(port), "--deadline", "60",
                           "--pid", str(gone.pid)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "the main process exited after 0 s" in proc.stderr
