"""The front door's HAProxy side against a real HAProxy (Debian 12's 2.6; .ci/run installs it): the role's
configuration template is valid and runs; module_utils/revive_haproxy.py sets states, reports `changed` only for a
state change, waits for in-flight requests, fails with the numbers; the reload helper keeps runtime states; the lab
sampler counts serving nodes."""
from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fixtures.haproxy import HAPROXY, Backend, HAProxy, free_port, render
from ansible.module_utils.revive_haproxy import (
    HAProxyError,
    admin_mode,
    ensure,
    list_servers,
    parse_servers_state,
    parse_show_stat,
    read_servers,
    set_mode,
    socket_sender,
)

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "frontdoor"


@pytest.fixture
def lab(tmp_path):
    backends = [Backend(), Backend()]
    front = free_port()
    proxy = HAProxy(tmp_path, render(tmp_path, backends, front)).start()
    yield {"proxy": proxy, "send": socket_sender(proxy.socket), "backends": backends, "front": front,
           "tmp": tmp_path}
    proxy.stop()
    for backend in backends:
        backend.close()


SERVERS = ["node1-vllm-0", "node2-vllm-0"]


def test_the_rendered_configuration_is_valid_for_haproxy(tmp_path):
    config = tmp_path / "haproxy.cfg"
    backends = [Backend()]
    try:
        text = render(tmp_path, backends, free_port())
    finally:
        backends[0].close()
    config.write_text(text)
    check = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"    server node1-vllm-0 127.0.0.1:{backends[0].port} maxconn 16 disabled\n" in text
    assert ("    default-server check inter 200ms fall 3 rise 2 slowstart 30s observe layer4 error-limit 3"
            " on-error mark-down\n") in text


def test_servers_start_in_maintenance_and_ready_changes_once(lab):
    send = lab["send"]
    before = read_servers(send, "vllm", SERVERS)
    assert {n: (s.mode, s.admin_state, s.status) for n, s in before.items()} == {
        "node1-vllm-0": ("maint", 5, "MAINT"), "node2-vllm-0": ("maint", 5, "MAINT")}
    first = ensure(send, "vllm", ["node1-vllm-0"], "ready", check_mode=False)
    assert first.changed and first.after["node1-vllm-0"]["mode"] == "ready"
    # `disabled` leaves CMAINT (0x04) set after `state ready`: the server serves all the same
    assert first.after["node1-vllm-0"]["admin_state"] == 4
    again = ensure(send, "vllm", ["node1-vllm-0"], "ready", check_mode=False)
    assert not again.changed
    assert read_servers(send, "vllm", ["node2-vllm-0"])["node2-vllm-0"].mode == "maint"


def test_check_mode_reports_the_change_and_sends_nothing(lab):
    send = lab["send"]
    outcome = ensure(send, "vllm", SERVERS, "drain", check_mode=True, wait_idle=True)
    assert outcome.changed
    assert {n: s["mode"] for n, s in outcome.after.items()} == {"node1-vllm-0": "drain", "node2-vllm-0": "drain"}
    assert {n: s.mode for n, s in read_servers(send, "vllm", SERVERS).items()} == {
        "node1-vllm-0": "maint", "node2-vllm-0": "maint"}


def test_drain_waits_for_the_request_in_flight_and_a_timeout_names_it(lab):
    send = lab["send"]
    ensure(send, "vllm", ["node1-vllm-0"], "ready", check_mode=False)
    backend = lab["backends"][0]
    answers = []

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", lab["front"], timeout=30)
        conn.request("POST", "/v1/completions", body=b"{}", headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        answers.append((response.status, response.read(), response.getheader("X-Revive-Server")))

    thread = threading.Thread(target=client)
    thread.start()
    assert backend.arrived.wait(10)
    with pytest.raises(HAProxyError, match=r"backend vllm: still busy after 0.3 s: node1-vllm-0 scur=1 qcur=0 \(DRAIN\)"):
        ensure(send, "vllm", ["node1-vllm-0"], "drain", check_mode=False, wait_idle=True, timeout_s=0.3,
               interval_s=0.05)
    threading.Timer(0.3, backend.release.set).start()
    outcome = ensure(send, "vllm", ["node1-vllm-0"], "drain", check_mode=False, wait_idle=True, timeout_s=10,
                     interval_s=0.05)
    thread.join(10)
    assert not outcome.changed  # already DRAIN: waiting is not a change
    assert outcome.waited_s > 0 and outcome.polls >= 2
    assert outcome.after["node1-vllm-0"]["scur"] == 0
    # DRAIN let the stream in flight finish, and the response names the server
    assert answers == [(200, b'{"ok": true}', "node1-vllm-0")]


def test_unknown_servers_and_a_missing_socket_are_explained(lab, tmp_path):
    with pytest.raises(HAProxyError, match=r"backend vllm has no server node9-vllm-0 \(it has: node1-vllm-0, "
                                           r"node2-vllm-0\)"):
        read_servers(lab["send"], "vllm", ["node9-vllm-0"])
    with pytest.raises(HAProxyError, match=r"stats socket .*/nowhere.sock does not exist: is haproxy running"):
        read_servers(socket_sender(str(tmp_path / "nowhere.sock")), "vllm", SERVERS)
    with pytest.raises(HAProxyError, match="HAProxy refused `set server vllm/nope state ready`: No such server"):
        set_mode(lab["send"], "vllm", "nope", "ready")


def test_a_restart_with_the_saved_state_keeps_runtime_states(lab):
    send, proxy = lab["send"], lab["proxy"]
    ensure(send, "vllm", ["node1-vllm-0"], "ready", check_mode=False)
    ensure(send, "vllm", ["node2-vllm-0"], "drain", check_mode=False)
    helper = ROLE / "files" / "haproxy-save-state"
    done = subprocess.run([sys.executable, str(helper), proxy.socket, str(lab["tmp"] / "server-state")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (lab["tmp"] / "server-state").read_text().startswith("1\n# be_id be_name srv_id srv_name")
    assert [p.name for p in lab["tmp"].iterdir() if p.name.startswith(".server-state-")] == []
    saved = parse_servers_state((lab["tmp"] / "server-state").read_text())
    assert {k: v["srv_admin_state"] for k, v in saved.items()} == {("vllm", "node1-vllm-0"): "4",
                                                                   ("vllm", "node2-vllm-0"): "12"}
    proxy.stop()
    proxy.start()
    after = read_servers(socket_sender(proxy.socket), "vllm", SERVERS)
    assert {n: s.mode for n, s in after.items()} == {"node1-vllm-0": "ready", "node2-vllm-0": "drain"}
    # without the state file the configuration's `disabled` wins again
    (lab["tmp"] / "server-state").unlink()
    proxy.stop()
    proxy.start()
    assert {s.mode for s in read_servers(socket_sender(proxy.socket), "vllm", SERVERS).values()} == {"maint"}


def test_the_save_state_helper_does_nothing_when_haproxy_is_not_running(tmp_path):
    helper = ROLE / "files" / "haproxy-save-state"
    done = subprocess.run([sys.executable, str(helper), str(tmp_path / "absent.sock"), str(tmp_path / "state")],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "absent, nothing to save" in done.stderr
    assert not (tmp_path / "state").exists()


def test_the_lab_sampler_counts_serving_nodes(lab):
    send = lab["send"]
    ensure(send, "vllm", SERVERS, "ready", check_mode=False)
    stop, out = lab["tmp"] / "stop", lab["tmp"] / "watch.json"
    nodes = {"node1": ["node1-vllm-0"], "node2": ["node2-vllm-0"]}
    watch = subprocess.Popen([sys.executable, str(REPO / "lab" / "loadgen" / "lbwatch.py"), "--socket",
                              lab["proxy"].socket, "--nodes", json.dumps(nodes), "--interval", "0.05",
                              "--stop-file", str(stop), "--out", str(out)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(s.status.startswith("UP") for s in list_servers(send, "vllm").values()):
            break
        time.sleep(0.05)
    time.sleep(0.3)
    ensure(send, "vllm", ["node2-vllm-0"], "drain", check_mode=False)
    time.sleep(0.3)
    stop.touch()
    watch.wait(10)
    summary = json.loads(out.read_text())
    assert summary["min_serving_nodes"] == 1 and summary["samples"] >= 5
    assert summary["changes"][-1]["serving_nodes"] == ["node1"]
    assert summary["changes"][-1]["servers"]["node2-vllm-0"] == "drain/DRAIN"


def test_parsers_read_haproxy_2_6_output():
    state = ("1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
             "srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state "
             "srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port "
             "srv_check_addr srv_agent_addr srv_agent_port\n"
             "3 vllm 1 node1-vllm-0 10.0.0.11 2 4 1 1 9 6 3 4 6 0 0 0 - 8000 - 0 0 - - 0\n\n")
    rows = parse_servers_state(state)
    assert rows[("vllm", "node1-vllm-0")]["srv_port"] == "8000"
    stat = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,status\nvllm,node1-vllm-0,0,0,2,3,16,40,UP 1/3\n"
    assert parse_show_stat(stat)[("vllm", "node1-vllm-0")]["status"] == "UP 1/3"
    assert [admin_mode(v) for v in (0, 1, 4, 5, 8, 12, 9, 0x20, 0x10)] == \
        ["ready", "maint", "ready", "maint", "drain", "drain", "maint", "maint", "drain"]


def test_a_replica_whose_port_closed_is_taken_out_by_the_traffic_itself(tmp_path):
    """leastconn favours a dead replica (it has no connections); the passive check marks it down after 3 failed
    connections, long before the active check (slowed to a minute here) would, and no client sees an error."""
    live = Backend()
    live.release.set()

    class Closed:
        port = free_port()  # nothing listens there: a replica whose process died or restarts in traffic

    front = free_port()
    proxy = HAProxy(tmp_path, render(tmp_path, [Closed(), live], front, frontdoor_check_inter="60s")).start()
    try:
        send = socket_sender(proxy.socket)
        ensure(send, "vllm", SERVERS, "ready", check_mode=False)
        statuses = []
        for _ in range(8):
            conn = http.client.HTTPConnection("127.0.0.1", front, timeout=10)
            conn.request("POST", "/v1/completions", body=b"{}", headers={"Content-Type": "application/json"})
            statuses.append(conn.getresponse().status)
            conn.close()
        servers = read_servers(send, "vllm", SERVERS)
    finally:
        proxy.stop()
        live.close()
    assert statuses == [200] * 8
    assert servers["node1-vllm-0"].status.startswith("DOWN"), servers["node1-vllm-0"]
    assert servers["node2-vllm-0"].status.startswith("UP"), servers["node2-vllm-0"]


def test_the_exporter_frontend_serves_the_backend_queue_and_every_server_sessions(tmp_path):
    """frontdoor_prometheus_port > 0 adds HAProxy's Prometheus exporter: /metrics has the series the monitoring
    rules and dashboard read (haproxy_backend_current_queue, haproxy_server_current_sessions per server), other
    paths answer 404; 0 renders no such frontend."""
    backends = [Backend(), Backend()]
    exporter = free_port()
    proxy = HAProxy(tmp_path, render(tmp_path, backends, free_port(), frontdoor_prometheus_port=exporter)).start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", exporter, timeout=5)
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        body = response.read().decode()
        assert response.status == 200
        assert 'haproxy_backend_current_queue{proxy="vllm"} 0' in body
        for server in SERVERS:
            assert f'haproxy_server_current_sessions{{proxy="vllm",server="{server}"}} 0' in body
        connection.request("GET", "/stats")
        response = connection.getresponse()
        assert response.status == 404 and b"only /metrics" in response.read()
        connection.close()
    finally:
        proxy.stop()
        for backend in backends:
            backend.close()
    assert "frontend prometheus" not in render(tmp_path, [], free_port())
