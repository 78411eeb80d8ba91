"""A client on the bench host, through the front door: answered by a warmed-up node, which the response names."""
from __future__ import annotations

import json

from lab_testinfra import lab_hosts

testinfra_hosts = lab_hosts("bench")
ASK = ("import http.client, json; c = http.client.HTTPConnection('lb1', 80, timeout=60); "
       "c.request('POST', '/v1/chat/completions', json.dumps({'model': 'tiny-chat', 'max_tokens': 16, "
       "'messages': [{'role': 'user', 'content': 'hello'}]}), {'Content-Type': 'application/json', "
       "'Authorization': 'Bearer revive-lab-key'}); r = c.getresponse(); "
       "print(json.dumps({'status': r.status, 'server': r.getheader('X-Revive-Server'), 'body': json.loads(r.read())}))")


def test_a_request_through_the_front_door_is_answered_by_a_warmed_up_node(host):
    answer = json.loads(host.check_output(f'python3 -c "{ASK}"'))
    assert answer["status"] == 200
    assert answer["server"].rsplit("-vllm-", 1)[0] in lab_hosts("gpu_nodes")
    assert answer["body"]["choices"][0]["message"]["content"]
    assert answer["body"]["usage"]["completion_tokens"] == 16


def test_the_load_client_never_saw_a_failure_during_the_draining_rolls(host):
    for step in ("roll_b", "roll_slow", "restart_drained"):
        summary = json.loads(host.file(f"/var/tmp/fleet-loadgen-{step}.json").content_string)
        assert summary["sent"] > 0 and summary["failed"] == 0, (step, summary["failures"][:3])
