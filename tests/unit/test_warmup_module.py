"""vllm_warmup and haproxy_server through Ansible (`ansible localhost -m ...`): documentation renders, results and
`changed` as a playbook sees them, check mode, the report file, and a failure's message."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from fake_openai import Answer, FakeServer
from test_haproxy import SERVERS, Backend, HAProxy, free_port, render

BIN = os.path.dirname(sys.executable)


def ansible_env(repo) -> dict:
    return dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
                ANSIBLE_CONFIG=str(repo / "ansible.cfg"), ANSIBLE_PYTHON_INTERPRETER=sys.executable)


def adhoc(repo, module: str, args: dict, *flags: str) -> dict:
    proc = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-c", "local", "-i", "localhost,",
                           "-m", module, "-a", json.dumps(args), *flags],
                          cwd=repo, env=ansible_env(repo), capture_output=True, text=True)
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def doc(repo, module: str) -> str:
    proc = subprocess.run([os.path.join(BIN, "ansible-doc"), "-M", "library", module], cwd=repo,
                          env=dict(ansible_env(repo), ANSIBLE_NOCOLOR="1"), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return " ".join(proc.stdout.split())


def test_ansible_doc_renders_both_modules(repo):
    warmup = doc(repo, "vllm_warmup")
    assert "Settle rule" in warmup and "journalctl -u UNIT" in warmup and "handover.json" in warmup
    haproxy = doc(repo, "haproxy_server")
    assert "scur" in haproxy and "qcur" in haproxy and "check mode" in haproxy.lower()


def test_vllm_warmup_passes_writes_the_report_and_check_mode_sends_nothing(repo, tmp_path):
    report = tmp_path / "handover.json"
    answer = Answer(tokens=4, token_delay=0.002)
    with FakeServer(version={"version": "0.5.4"}, answer_for=lambda n, body: answer) as fake:
        args = {"port": fake.port, "served_model_name": "tiny", "replica": "vllm-0", "requests": 10,
                "max_requests": 20, "concurrency": 2, "max_tokens": 8, "api_key": "s3cret",
                "settle": {"tolerance": 1.0}, "release": {"id": "abc123"}, "gpu_simulated": False,
                "report_path": str(report)}
        checked = adhoc(repo, "vllm_warmup", args, "--check")
        assert fake.health_polls == 0 and fake.completions == 0
        assert checked["changed"] is True and checked["msg"].startswith(f"check mode: nothing sent to "
                                                                         f"http://127.0.0.1:{fake.port}")
        assert not report.exists()
        done = adhoc(repo, "vllm_warmup", args)
        assert fake.completions == 10
        assert {r["headers"].get("authorization") for r in fake.requests if r["path"].startswith("/v1/chat")} == \
            {"Bearer s3cret"}
    assert done.get("failed") is not True, done.get("msg")
    assert done["changed"] is True and done["passed"] is True and done["simulated"] is False
    written = json.loads(report.read_text())
    assert written["replicas"]["vllm-0"]["release"] == {"id": "abc123"}
    assert written["replicas"]["vllm-0"]["warmup"]["requests_sent"] == 10
    assert "s3cret" not in report.read_text()


def test_vllm_warmup_failure_is_reported_in_the_file_and_the_message(repo, tmp_path):
    report = tmp_path / "handover.json"
    error = {"object": "error", "message": "simulated engine error", "type": "InternalServerError", "code": 500}
    with FakeServer(answer_for=lambda n, body: Answer(status=500, error_body=error)) as fake:
        failed = adhoc(repo, "vllm_warmup", {"port": fake.port, "served_model_name": "tiny", "replica": "vllm-1",
                                              "concurrency": 1, "report_path": str(report)})
    assert failed["failed"] is True and failed["passed"] is False
    assert failed["msg"].endswith("vllm-1: warm-up failed: warm-up request 1 failed: HTTP 500 from "
                                  f"http://127.0.0.1:{fake.port}/v1/chat/completions: simulated engine error")
    assert json.loads(report.read_text())["replicas"]["vllm-1"]["passed"] is False


def test_haproxy_server_changes_once_and_check_mode_shows_a_diff(repo, tmp_path):
    backends = [Backend(), Backend()]
    proxy = HAProxy(tmp_path, render(tmp_path, backends, free_port())).start()
    try:
        args = {"servers": SERVERS, "state": "ready", "socket": proxy.socket}
        checked = adhoc(repo, "haproxy_server", args, "--check", "--diff")
        assert checked["changed"] is True
        assert checked["diff"]["before"] == "node1-vllm-0: maint\nnode2-vllm-0: maint\n"
        assert checked["diff"]["after"] == "node1-vllm-0: ready\nnode2-vllm-0: ready\n"
        first = adhoc(repo, "haproxy_server", args)
        assert first["changed"] is True and first["msg"] == "backend vllm: node1-vllm-0, node2-vllm-0 -> ready"
        again = adhoc(repo, "haproxy_server", args)
        assert again["changed"] is False and again["msg"] == "backend vllm: already ready"
        queried = adhoc(repo, "haproxy_server", {"servers": ["node1-vllm-0"], "socket": proxy.socket})
        assert queried["changed"] is False and queried["servers"]["node1-vllm-0"]["mode"] == "ready"
        missing = adhoc(repo, "haproxy_server", {"servers": ["node7-vllm-0"], "socket": proxy.socket})
        assert missing["failed"] is True and "has no server node7-vllm-0" in missing["msg"]
    finally:
        proxy.stop()
        for backend in backends:
            backend.close()
