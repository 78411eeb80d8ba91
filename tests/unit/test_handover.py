"""module_utils/revive_handover.py: the hand-over's and the roll's decisions, each against a table of cases.

Each table is YAML (one case per entry: id, the function's arguments, what it must return), in the manner of
community.general's tests/unit/plugins/modules/test_xfconf.yaml; the roles reach these functions through
filter_plugins/revive.py (tests/unit/test_filter_plugins.py).
"""
from __future__ import annotations

import pytest
import yaml

from ansible.module_utils.revive_handover import (
    failure_message,
    handover_result,
    handover_state,
    restored_release,
    roll_node_result,
    roll_unreachable_result,
    roll_order,
    roll_policy,
    roll_batch_check,
    roll_summary,
    serial_batch_size,
    served_model_name,
)


def cases(text: str):
    return [pytest.param(case, id=case["id"]) for case in yaml.safe_load(text)]


# --- the failure text of a rescue ------------------------------------------------------------------------

FAILURE_MESSAGE = """
- id: a task's msg
  result: {failed: true, msg: "Unable to restart service vllm-0.service"}
  task: {name: Restart vllm-0.service}
  fallback: the switch
  expected: "Restart vllm-0.service: Unable to restart service vllm-0.service"
- id: a loop's failed items only, joined
  result:
    failed: true
    msg: One or more items failed
    results:
      - {failed: false, msg: "vllm-0.service is active"}
      - {failed: true, msg: "vllm-1.service is failed/failed"}
      - {msg: "never ran"}
      - {failed: true, msg: "vllm-2.service is inactive/dead"}
  task: {name: Check that the restored replicas are active}
  fallback: the restore
  expected: "Check that the restored replicas are active: vllm-1.service is failed/failed; vllm-2.service is inactive/dead"
- id: a failed item without a msg adds an empty one
  result: {results: [{failed: true}, {failed: true, msg: "HTTP 500"}]}
  task: {name: Warm up every replica on the node}
  fallback: the hand-over
  expected: "Warm up every replica on the node: ; HTTP 500"
- id: no task name - the fallback
  result: {msg: "boom"}
  task: {}
  fallback: the hand-over
  expected: "the hand-over: boom"
- id: no task at all, no msg
  result: {}
  task: null
  fallback: the switch
  expected: "the switch: "
- id: the task given by name
  result: {msg: "no route to host"}
  task: Drain the node's servers
  fallback: the switch
  expected: "Drain the node's servers: no route to host"
"""


@pytest.mark.parametrize("case", cases(FAILURE_MESSAGE))
def test_failure_message(case):
    assert failure_message(case["result"], case["task"], case["fallback"]) == case["expected"]


# --- is the node handed over ---------------------------------------------------------------------------

RELEASE_A = {"id": "aaaaaaaaaaaa", "replicas": [{"name": "vllm-0"}, {"name": "vllm-1"}]}
PASSED_A = {"passed": True, "release": {"id": "aaaaaaaaaaaa"}}

HANDOVER_STATE = """
- id: every replica passed for the release and every server READY
  info: {current: A, report: {replicas: {vllm-0: PASSED_A, vllm-1: PASSED_A}}, servers: [n1-vllm-0, n1-vllm-1]}
  front_door: {front_door: lb1, servers: {n1-vllm-0: {mode: ready}, n1-vllm-1: {mode: ready}}}
  expected: {handed_over: true, warm_up: false, front_door: true}
- id: one server in maintenance (drained by node_out)
  info: {current: A, report: {replicas: {vllm-0: PASSED_A, vllm-1: PASSED_A}}}
  front_door: {front_door: lb1, servers: {n1-vllm-0: {mode: ready}, n1-vllm-1: {mode: maint}}}
  expected: {handed_over: false, warm_up: true}
- id: the servers could not be read (HAProxy not running yet)
  info: {current: A, report: {replicas: {vllm-0: PASSED_A, vllm-1: PASSED_A}}}
  front_door: {front_door: lb1, servers: null}
  expected: {handed_over: false, warm_up: true}
- id: no front door - the reports alone decide
  info: {current: A, report: {replicas: {vllm-0: PASSED_A, vllm-1: PASSED_A}}}
  front_door: {front_door: "", servers: null}
  expected: {handed_over: true, warm_up: false, front_door: false}
- id: a replica passed for another release
  info: {current: A, report: {replicas: {vllm-0: PASSED_A, vllm-1: {passed: true, release: {id: bbbbbbbbbbbb}}}}}
  front_door: {front_door: "", servers: null}
  expected: {handed_over: false, warm_up: true}
- id: a replica failed its last warm-up
  info: {current: A, report: {replicas: {vllm-0: PASSED_A, vllm-1: {passed: false, release: {id: aaaaaaaaaaaa}}}}}
  front_door: {front_door: "", servers: null}
  expected: {handed_over: false, warm_up: true}
- id: a replica has no report entry; a report of a replica the release dropped does not count
  info: {current: A, report: {replicas: {vllm-0: PASSED_A, vllm-2: PASSED_A}}}
  front_door: {front_door: "", servers: null}
  expected: {handed_over: false, warm_up: true}
- id: a report entry that is not an object, one without a release
  info: {current: A, report: {replicas: {vllm-0: "passed", vllm-1: {passed: true}}}}
  front_door: {front_door: "", servers: null}
  expected: {handed_over: false, warm_up: true}
- id: no hand-over report at all
  info: {current: A, report: null}
  front_door: {front_door: lb1, servers: {n1-vllm-0: {mode: ready}, n1-vllm-1: {mode: ready}}}
  expected: {handed_over: false, warm_up: true}
- id: no release recorded - warmed up (and refused there) outside check mode
  info: {current: null, report: null}
  front_door: {front_door: lb1, servers: null}
  expected: {handed_over: false, warm_up: true, release: null}
- id: no release recorded in check mode - nothing to warm up
  info: {current: null, report: null}
  front_door: {front_door: lb1, servers: null}
  check_mode: true
  expected: {handed_over: false, warm_up: false, check_mode: true}
- id: a release in check mode is still warmed up (vllm_warmup's dry run)
  info: {current: A, report: null}
  front_door: {front_door: lb1, servers: null}
  check_mode: true
  expected: {handed_over: false, warm_up: true}
- id: a release without replicas is never handed over
  info: {current: {id: cccccccccccc, replicas: []}, report: {replicas: {}}}
  front_door: {front_door: "", servers: null}
  expected: {handed_over: false, warm_up: true, behind_head: null}
- id: a serving group's worker serves through its head and is never warmed up itself
  info: {current: {id: cccccccccccc, replicas: [], group: {name: g, role: worker, head: node1}}, report: null}
  front_door: {front_door: lb1, servers: {}}
  expected: {handed_over: true, warm_up: false, behind_head: {group: g, role: worker, head: node1}}
- id: a group's head is handed over like any node
  info: {current: {id: aaaaaaaaaaaa, replicas: [{name: vllm-0}], group: {name: g, role: head, head: node1}},
         report: {replicas: {vllm-0: PASSED_A}}}
  front_door: {front_door: lb1, servers: {n1-vllm-0: {mode: maint}}}
  expected: {handed_over: false, warm_up: true, behind_head: null, found_out: [n1-vllm-0 maint]}
- id: warmed up for its release, then left in maintenance and drain (an interrupted run) - found out of traffic
  info: {current: A, report: {replicas: {vllm-0: PASSED_A, vllm-1: PASSED_A}}}
  front_door: {front_door: lb1, servers: {n1-vllm-1: {mode: drain}, n1-vllm-0: {mode: maint}}}
  expected: {handed_over: false, warm_up: true, found_out: [n1-vllm-0 maint, n1-vllm-1 drain],
             out_before: [n1-vllm-0 maint, n1-vllm-1 drain]}
- id: one server READY, one in maintenance - only that one is found
  info: {current: A, report: {replicas: {vllm-0: PASSED_A, vllm-1: PASSED_A}}}
  front_door: {front_door: lb1, servers: {n1-vllm-0: {mode: ready}, n1-vllm-1: {mode: maint}}}
  expected: {handed_over: false, warm_up: true, found_out: [n1-vllm-1 maint], out_before: [n1-vllm-1 maint]}
- id: a new release not warmed up yet starts in maintenance - out, but not a finding
  info: {current: A, report: null}
  front_door: {front_door: lb1, servers: {n1-vllm-0: {mode: maint}, n1-vllm-1: {mode: maint}}}
  expected: {handed_over: false, warm_up: true, found_out: [], out_before: [n1-vllm-0 maint, n1-vllm-1 maint]}
- id: servers not read (no HAProxy yet in check mode) - nothing found
  info: {current: A, report: {replicas: {vllm-0: PASSED_A, vllm-1: PASSED_A}}}
  front_door: {front_door: lb1, servers: null}
  expected: {handed_over: false, warm_up: true, found_out: [], out_before: []}
- id: handed over - nothing found
  info: {current: A, report: {replicas: {vllm-0: PASSED_A, vllm-1: PASSED_A}}}
  front_door: {front_door: lb1, servers: {n1-vllm-0: {mode: ready}, n1-vllm-1: {mode: ready}}}
  expected: {handed_over: true, warm_up: false, found_out: [], out_before: []}
"""


def _resolve(value):
    """The tables name the shared fixtures (A, PASSED_A) instead of repeating them."""
    names = {"A": RELEASE_A, "PASSED_A": PASSED_A}
    if isinstance(value, str) and value in names:
        return names[value]
    if isinstance(value, dict):
        return {key: _resolve(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve(item) for item in value]
    return value


@pytest.mark.parametrize("case", cases(HANDOVER_STATE))
def test_handover_state(case):
    case = _resolve(case)
    state = handover_state(case["info"], case["front_door"], case.get("check_mode", False))
    for key, value in case["expected"].items():
        assert state[key] == value, key
    assert state["release"] == case["info"]["current"]
    assert state["servers"] == case["info"].get("servers", [])


RESTORED_RELEASE = """
- id: the rollback restored the previous release, which serves
  info: {current: {id: aaaaaaaaaaaa}, last_failure: {restored_serving: true}}
  failed: {id: bbbbbbbbbbbb}
  expected: {id: aaaaaaaaaaaa}
- id: the restored release does not serve
  info: {current: {id: aaaaaaaaaaaa}, last_failure: {restored_serving: false}}
  failed: {id: bbbbbbbbbbbb}
  expected: null
- id: nothing was restored (no earlier release)
  info: {current: null, last_failure: {restored_serving: false}}
  failed: {id: bbbbbbbbbbbb}
  expected: null
- id: the current release is still the failed one (no rollback ran)
  info: {current: {id: bbbbbbbbbbbb}, last_failure: {restored_serving: true}}
  failed: {id: bbbbbbbbbbbb}
  expected: null
- id: no failure recorded
  info: {current: {id: aaaaaaaaaaaa}, last_failure: null}
  failed: {id: bbbbbbbbbbbb}
  expected: null
- id: the failed release is unknown (its record could not be read)
  info: {current: {id: aaaaaaaaaaaa}, last_failure: {restored_serving: true}}
  failed: null
  expected: {id: aaaaaaaaaaaa}
"""


@pytest.mark.parametrize("case", cases(RESTORED_RELEASE))
def test_restored_release(case):
    assert restored_release(case["info"], case["failed"]) == case["expected"]


# --- what became of the node ---------------------------------------------------------------------------

NO_LB = " (no front door: the inventory has no lb host; clients call the replicas directly)"

HANDOVER_RESULT = """
- id: already handed over
  state: {handed_over: true, warm_up: false, front_door: true, release: {id: aaaaaaaaaaaa}}
  expected: {status: serving, release: aaaaaaaaaaaa, message: "node1: already handed over with release aaaaaaaaaaaa"}
- id: already handed over, no front door
  state: {handed_over: true, warm_up: false, front_door: false, release: {id: aaaaaaaaaaaa}}
  expected: {status: serving, release: aaaaaaaaaaaa,
             message: "node1: already handed over with release aaaaaaaaaaaaNO_LB"}
- id: check mode on a node without a release
  state: {handed_over: false, warm_up: false, front_door: true, release: null, check_mode: true}
  expected: {status: out, release: null,
             message: "check mode: node1 has no release recorded in /var/lib/revive/releases.json yet (run without
               --check to provision it); would warm up its replicas and set them READY"}
- id: warmed up and handed over
  state: {handed_over: false, warm_up: true, front_door: true, release: {id: aaaaaaaaaaaa}}
  warmed: {id: aaaaaaaaaaaa}
  expected: {status: serving, release: aaaaaaaaaaaa,
             message: "node1: warmed up and handed over with release aaaaaaaaaaaa"}
- id: warmed up without a front door
  state: {handed_over: false, warm_up: true, front_door: false, release: {id: aaaaaaaaaaaa}}
  warmed: {id: aaaaaaaaaaaa}
  expected: {status: serving, release: aaaaaaaaaaaa,
             message: "node1: warmed up and handed over with release aaaaaaaaaaaaNO_LB"}
- id: the warm-up failed, the rollback restored the previous release, which warmed up
  state: {handed_over: false, warm_up: true, front_door: true, release: {id: bbbbbbbbbbbb}}
  failure: " Warm up every replica on the node: warm-up request 1 failed: HTTP 500\\n"
  failed_release: {id: bbbbbbbbbbbb}
  rollback_message: "Release bbbbbbbbbbbb ... Rolled back: the previous release aaaaaaaaaaaa ... is serving again"
  restored: {id: aaaaaaaaaaaa}
  expected: {status: rolled_back, release: aaaaaaaaaaaa,
             message: "node1: release bbbbbbbbbbbb failed (Warm up every replica on the node: warm-up request 1
               failed: HTTP 500); rolled back to release aaaaaaaaaaaa, which warmed up and serves"}
- id: the restored release failed its warm-up too
  state: {handed_over: false, warm_up: true, front_door: true, release: {id: bbbbbbbbbbbb}}
  failure: "Warm up every replica on the node: HTTP 500"
  failed_release: {id: bbbbbbbbbbbb}
  rollback_message: "Release bbbbbbbbbbbb ... is serving again"
  restored: {id: aaaaaaaaaaaa}
  restored_failure: "Warm up every replica on the node: HTTP 503 "
  expected: {status: out, release: aaaaaaaaaaaa,
             message: "node1: release bbbbbbbbbbbb failed (Warm up every replica on the node: HTTP 500); the restored
               release aaaaaaaaaaaa failed its warm-up too (Warm up every replica on the node: HTTP 503); the node
               stays out of the front door (MAINT)"}
- id: a serving group's worker
  state: {handed_over: true, warm_up: false, front_door: true, release: {id: cccccccccccc},
          behind_head: {group: g, role: worker, head: node1}}
  expected: {status: serving, release: cccccccccccc,
             message: "node1: the worker of serving group g (release cccccccccccc) serves through its head node1,
               which is warmed up and handed over for the group"}
- id: the rollback found nothing to restore
  state: {handed_over: false, warm_up: true, front_door: true, release: {id: bbbbbbbbbbbb}}
  failure: "Warm up every replica on the node: HTTP 500"
  failed_release: {id: bbbbbbbbbbbb}
  rollback_message: "Release bbbbbbbbbbbb failed on node1: ...\\nNothing was rolled back: there is no earlier release\\n"
  expected: {status: out, release: null,
             message: "node1: release bbbbbbbbbbbb failed (Warm up every replica on the node: HTTP 500); rollback:
               Release bbbbbbbbbbbb failed on node1: ...\\nNothing was rolled back: there is no earlier release; the
               node stays out of the front door (MAINT)"}
- id: not rolled back (after a failed switch, or check mode)
  state: {handed_over: false, warm_up: true, front_door: true, release: {id: aaaaaaaaaaaa}}
  failure: "Warm up every replica on the node: HTTP 500"
  failed_release: {id: aaaaaaaaaaaa}
  expected: {status: out, release: null,
             message: "node1: release aaaaaaaaaaaa failed (Warm up every replica on the node: HTTP 500); not rolled
               back (check mode, or handover_rollback is false); the node stays out of the front door (MAINT)"}
- id: found in maintenance with its release warmed up, warmed up again and handed over - said so
  state: {handed_over: false, warm_up: true, front_door: true, release: {id: aaaaaaaaaaaa},
          found_out: [node1-vllm-0 maint, node1-vllm-1 drain], out_before: [node1-vllm-0 maint, node1-vllm-1 drain]}
  warmed: {id: aaaaaaaaaaaa}
  expected: {status: serving, release: aaaaaaaaaaaa,
             message: "node1: warmed up and handed over with release aaaaaaaaaaaa - found out of traffic (node1-vllm-0
               maint, node1-vllm-1 drain) with release aaaaaaaaaaaa already warmed up: an earlier run stopped in the
               middle (interrupted or killed) or an operator took it out; reported here, never left so silently"}
- id: found out of traffic and then failing its warm-up - the finding comes first
  state: {handed_over: false, warm_up: true, front_door: true, release: {id: aaaaaaaaaaaa},
          found_out: [node1-vllm-0 maint]}
  failure: "Warm up every replica on the node: HTTP 500"
  failed_release: {id: aaaaaaaaaaaa}
  expected: {status: out, release: null,
             message: "node1 - found out of traffic (node1-vllm-0 maint) with release aaaaaaaaaaaa already warmed up:
               an earlier run stopped in the middle (interrupted or killed) or an operator took it out; reported here,
               never left so silently: release aaaaaaaaaaaa failed (Warm up every replica on the node: HTTP 500); not
               rolled back (check mode, or handover_rollback is false); the node stays out of the front door (MAINT)"}
- id: the failed release is unknown (the record could not be read)
  state: {handed_over: false, warm_up: true, front_door: true, release: null}
  failure: "Read the release the node runs: no such file"
  failed_release: null
  expected: {status: out, release: null,
             message: "node1: release ? failed (Read the release the node runs: no such file); not rolled back
               (check mode, or handover_rollback is false); the node stays out of the front door (MAINT)"}
"""


@pytest.mark.parametrize("case", cases(HANDOVER_RESULT))
def test_handover_result(case):
    arguments = {key: case[key] for key in ("warmed", "failure", "failed_release", "rollback_message", "restored",
                                            "restored_failure") if key in case}
    result = handover_result(case["state"], "node1", "/var/lib/revive/releases.json", **arguments)
    expected = dict(case["expected"], node="node1", message=case["expected"]["message"].replace("NO_LB", NO_LB),
                    out_before=case["state"].get("out_before", []), found_out=case["state"].get("found_out", []))
    assert result == expected


SERVED_MODEL_NAME = """
- id: the served name
  argv: [/v/bin/python, -m, vllm.entrypoints.openai.api_server, --model, /data/models/tiny-chat/rev1,
         --served-model-name, tiny-chat, --port, "8000"]
  expected: tiny-chat
- id: no served name - the model path
  argv: [/v/bin/python, -m, vllm.entrypoints.openai.api_server, --model, /data/models/tiny-chat/rev1, --port, "8000"]
  expected: /data/models/tiny-chat/rev1
"""


@pytest.mark.parametrize("case", cases(SERVED_MODEL_NAME))
def test_served_model_name(case):
    assert served_model_name(case["argv"]) == case["expected"]


# --- does the roll go on -------------------------------------------------------------------------------

ROLL_NODE_RESULT = """
- id: took the release
  handover: {node: node1, status: serving, message: "node1: warmed up and handed over with release bbbbbbbbbbbb"}
  expected: {took_release: true, serving: true, message: "node1: warmed up and handed over with release bbbbbbbbbbbb"}
- id: the warm-up failed and the node was rolled back
  handover: {node: node1, status: rolled_back, message: "node1: release bbbbbbbbbbbb failed (x); rolled back"}
  expected: {took_release: false, serving: true, message: "node1: release bbbbbbbbbbbb failed (x); rolled back"}
- id: the switch failed; the restored release was handed back
  handover: {node: node1, status: serving, message: "node1: warmed up and handed over with release aaaaaaaaaaaa"}
  switch_failure: "Restart vllm-0.service: Unable to restart\\n"
  expected: {took_release: false, serving: true,
             message: "node1: release bbbbbbbbbbbb failed (Restart vllm-0.service: Unable to restart); node1: warmed up
               and handed over with release aaaaaaaaaaaa"}
- id: found in maintenance when its roll began (a roll interrupted there), then rolled
  handover: {node: node1, status: serving, message: "node1: warmed up and handed over with release bbbbbbbbbbbb"}
  found_out: [node1-vllm-0 maint, node1-vllm-1 maint]
  expected: {took_release: true, serving: true,
             message: "node1: warmed up and handed over with release bbbbbbbbbbbb - found out of traffic (node1-vllm-0
               maint, node1-vllm-1 maint) when its roll began: an earlier run stopped in the middle (interrupted or
               killed) or an operator took it out; reported here, never left so silently"}
- id: the hand-over reported the finding already - said once
  handover: {node: node1, status: serving, message: "node1: warmed up ... - found out of traffic (node1-vllm-0 maint)",
             found_out: [node1-vllm-0 maint]}
  found_out: [node1-vllm-0 maint]
  expected: {took_release: true, serving: true,
             message: "node1: warmed up ... - found out of traffic (node1-vllm-0 maint)"}
- id: nothing found out of traffic adds nothing
  handover: {node: node1, status: serving, message: "node1: already handed over with release bbbbbbbbbbbb"}
  found_out: []
  expected: {took_release: true, serving: true, message: "node1: already handed over with release bbbbbbbbbbbb"}
- id: the switch failed and the node is out
  handover: {node: node1, status: out, message: "node1: ...; the node stays out of the front door (MAINT)"}
  switch_failure: "Drain: timeout"
  expected: {took_release: false, serving: false,
             message: "node1: release bbbbbbbbbbbb failed (Drain: timeout); node1: ...; the node stays out of the front
               door (MAINT)"}
"""


@pytest.mark.parametrize("case", cases(ROLL_NODE_RESULT))
def test_roll_node_result(case):
    result = roll_node_result(case["handover"], "bbbbbbbbbbbb", case.get("switch_failure"), case.get("found_out"))
    assert result == dict(case["expected"], node="node1", target="bbbbbbbbbbbb")


ROLL_UNREACHABLE = """
- id: lost, and the front door's checks took it out
  reach: {unreachable: true, msg: "Failed to connect to the host via ssh: ssh: connect to host 10.0.0.2 port 22:\\n No
    route to host"}
  front_door: {front_door: lb1, servers: {node2-vllm-1: {mode: ready, status: DOWN, scur: 0},
                                         node2-vllm-0: {mode: ready, status: "DOWN", scur: 2}}}
  expected: {serving: false, unreachable: true,
             message: "node2: unreachable from the controller (Failed to connect to the host via ssh: ssh: connect to
               host 10.0.0.2 port 22: No route to host): not rolled to the planned release (vLLM 0.8.5), nothing on it
               changed; the front door lb1 sends it no traffic (node2-vllm-0 DOWN (ready, 2 in flight), node2-vllm-1
               DOWN (ready, 0 in flight)): its health checks took it out, and put it back by themselves once it
               answers again"}
- id: lost to the controller only - the front door still sends it traffic
  reach: {unreachable: true, msg: "Connection timed out during banner exchange"}
  front_door: {front_door: lb1, servers: {node2-vllm-0: {mode: ready, status: "UP 2/3", scur: 1},
                                         node2-vllm-1: {mode: drain, status: DRAIN, scur: 0}}}
  expected: {serving: true, unreachable: true,
             message: "node2: unreachable from the controller (Connection timed out during banner exchange): not rolled
               to the planned release (vLLM 0.8.5), nothing on it changed; the front door lb1 still sends it traffic
               (node2-vllm-0 UP 2/3 (ready, 1 in flight), node2-vllm-1 DRAIN (drain, 0 in flight)): it serves, only the
               controller lost it - check the controller's path to it (SSH, its address)"}
- id: the front door could not be read
  reach: {unreachable: true}
  front_door: {front_door: lb1, servers: null}
  expected: {serving: null, unreachable: true,
             message: "node2: unreachable from the controller (no answer): not rolled to the planned release (vLLM
               0.8.5), nothing on it changed; the front door lb1 could not say (its servers were not read)"}
- id: no front door
  reach: {unreachable: true, msg: x}
  front_door: {front_door: "", servers: null}
  expected: {serving: null, unreachable: true,
             message: "node2: unreachable from the controller (x): not rolled to the planned release (vLLM 0.8.5),
               nothing on it changed; no front door (the inventory has no lb host)"}
- id: a member of a serving group whose other member is lost
  reach: {ping: pong}
  lost_members: [node3]
  expected: {serving: true, unreachable: false,
             message: "node2: not rolled: its serving group rolls as one, and the controller cannot reach node3; left
               as it was, nothing on it changed"}
"""


@pytest.mark.parametrize("case", cases(ROLL_UNREACHABLE))
def test_roll_unreachable_result(case):
    result = roll_unreachable_result(case["reach"], "node2", "the planned release (vLLM 0.8.5)",
                                     case.get("front_door"), case.get("lost_members", ["node2"]))
    assert result == dict(case["expected"], node="node2", target="the planned release (vLLM 0.8.5)",
                          took_release=False)


def test_a_long_ssh_error_is_cut_to_300_characters():
    message = roll_unreachable_result({"msg": "e" * 1000}, "node2", "r")["message"]
    assert ("(" + "e" * 297 + "...)") in message and "e" * 298 not in message


def test_an_unreachable_node_counts_against_the_roll_policy():
    lost = roll_unreachable_result({"unreachable": True, "msg": "No route to host"}, "node2", "r",
                                   {"front_door": "lb1", "servers": {"node2-vllm-0": {"mode": "ready",
                                                                                       "status": "DOWN", "scur": 0}}})
    policy = roll_policy([{"node": "node1", "took_release": True}, lost], ["node1", "node2", "node3"], 0)
    assert policy["stop"] and "node2: unreachable from the controller (No route to host)" in policy["message"]
    assert policy["message"].endswith("Not rolled (still on their release, in the front door): node3.")


ROLL_POLICY = """
- id: the first failure of three nodes stops a 0 % roll
  results: [{node: node1, took_release: false, message: " node1: release b failed (x); rolled back "}]
  hosts: [node1, node2, node3]
  max_fail_percent: 0
  expected: {stop: true, failed_percent: 33.3,
             message: "Roll stopped by policy: 1 of 3 node(s) (33.3 %) did not take the release, more than
               revive_rolling_max_fail_percent 0 %. node1: release b failed (x); rolled back. Not rolled (still on
               their release, in the front door): node2, node3."}
- id: every node took it
  results: [{node: node1, took_release: true}, {node: node2, took_release: true}]
  hosts: [node1, node2]
  max_fail_percent: 0
  expected: {stop: false, failed_percent: 0.0, message: ""}
- id: within the budget the roll goes on
  results: [{node: node1, took_release: false, message: x}, {node: node2, took_release: true}]
  hosts: [node1, node2, node3, node4]
  max_fail_percent: 25
  expected: {stop: false, failed_percent: 25.0, message: ""}
- id: past the budget, with every failure named and nothing left untouched
  results: [{node: node1, took_release: false, message: a}, {node: node2, took_release: false, message: b}]
  hosts: [node1, node2]
  max_fail_percent: "50"
  expected: {stop: true, failed_percent: 100.0,
             message: "Roll stopped by policy: 2 of 2 node(s) (100.0 %) did not take the release, more than
               revive_rolling_max_fail_percent 50 %. a. b. Not rolled (still on their release, in the front door):
               none."}
"""


@pytest.mark.parametrize("case", cases(ROLL_POLICY))
def test_roll_policy(case):
    assert roll_policy(case["results"], case["hosts"], case["max_fail_percent"]) == case["expected"]


ROLL_SUMMARY = """
- id: every node took the release
  results: [{node: node1, took_release: true, message: m1}, {node: node2, took_release: true, message: m2}]
  expected: {failed: false, messages: [m1, m2], message: ""}
- id: nodes left on their old release within the budget
  results: [{node: node1, took_release: false, message: "m1."}, {node: node2, took_release: true, message: m2},
            {node: node3, took_release: false, message: "m3."}]
  expected: {failed: true, messages: ["m1.", m2, "m3."],
             message: "The roll finished, but node1, node3 did not take the release: m1. m3."}
- id: nothing rolled
  results: []
  expected: {failed: false, messages: [], message: ""}
"""


@pytest.mark.parametrize("case", cases(ROLL_SUMMARY))
def test_roll_summary(case):
    assert roll_summary(case["results"]) == case["expected"]


SERIAL_BATCH_SIZE = """
- {id: one node at a time, serial: 1, hosts: 3, expected: 1}
- {id: a number from the command line is a string, serial: "2", hosts: 3, expected: 2}
- {id: more than there are hosts, serial: 5, hosts: 3, expected: 3}
- {id: zero means every host, serial: 0, hosts: 3, expected: 3}
- {id: a percentage rounds down, serial: "50%", hosts: 3, expected: 1}
- {id: a percentage of many hosts, serial: "25%", hosts: 8, expected: 2}
- {id: a small percentage is at least one host, serial: "10%", hosts: 3, expected: 1}
"""


@pytest.mark.parametrize("case", cases(SERIAL_BATCH_SIZE))
def test_serial_batch_size(case):
    assert serial_batch_size(case["serial"], case["hosts"]) == case["expected"]


ROLL_BATCH_CHECK = """
- id: the default, one node at a time
  serial: 1
  batch: [node1]
  hosts: [node1, node2, node3]
  expected: ""
- id: two from the command line
  serial: "2"
  batch: [node1, node2]
  hosts: [node1, node2, node3]
  expected: ""
- id: a later batch is not checked
  serial: 2
  batch: [node3]
  hosts: [node1, node2, node3]
  expected: ""
- id: two from the inventory, which Ansible's serial never saw
  serial: 2
  batch: [node1]
  hosts: [node1, node2, node3]
  expected: "revive_rolling_serial is 2 for this host, which asks for a first batch of 2 of 3 node(s), but Ansible
    made it 1 (node1): Ansible reads a play's `serial` only from extra vars, never from the inventory. Nothing was
    changed. Pass it on the command line (ansible-playbook ... playbooks/rolling.yml -e revive_rolling_serial=2) and
    remove it from the inventory."
- id: a percentage from the inventory
  serial: "100%"
  batch: [node1]
  hosts: [node1, node2]
  expected: "revive_rolling_serial is '100%' for this host, which asks for a first batch of 2 of 2 node(s), but
    Ansible made it 1 (node1): Ansible reads a play's `serial` only from extra vars, never from the inventory.
    Nothing was changed. Pass it on the command line (ansible-playbook ... playbooks/rolling.yml -e
    revive_rolling_serial=100%) and remove it from the inventory."
"""


@pytest.mark.parametrize("case", cases(ROLL_BATCH_CHECK))
def test_roll_batch_check(case):
    assert roll_batch_check(case["serial"], case["batch"], case["hosts"]) == case["expected"]


def test_the_roll_decisions_read_a_generator_once():
    # Jinja's map() hands the filters a generator; each function must still see every result.
    results = [{"node": "node1", "took_release": False, "message": "m1"}, {"node": "node2", "took_release": True}]
    policy = roll_policy(iter(results), iter(["node1", "node2", "node3"]), 0)
    assert policy["message"].endswith("m1. Not rolled (still on their release, in the front door): node3.")
    assert roll_summary(iter(results))["message"] == "The roll finished, but node1 did not take the release: m1"


def test_the_roll_takes_each_serving_group_as_one_batch_head_first_and_the_other_nodes_alone():
    def node(group=None, role=None, stage=None):
        release = {"group": {"name": group, "role": role, "stage": stage}} if group else {"replicas": [{}]}
        return {"ansible_facts": {"revive_release": release}}
    hostvars = {"a1": node(), "g2": node("mixtral", "worker", 1), "g1": node("mixtral", "head", 0),
                "g3": node("mixtral", "spare"), "h1": node("llama", "worker", 1), "h2": node("llama", "head", 0),
                "z9": node(), "gone": {}}
    order = roll_order(hostvars, ["z9", "g3", "g2", "h1", "a1", "g1", "h2", "gone"])
    assert order["groups"] == [{"name": "llama", "members": ["h2", "h1"]},
                               {"name": "mixtral", "members": ["g1", "g2", "g3"]}]
    assert order["group_hosts"] == ["h2", "h1", "g1", "g2", "g3"] and order["group_batches"] == [2, 3]
    assert order["single_hosts"] == ["z9", "a1", "gone"]
    assert order["hosts"] == order["group_hosts"] + order["single_hosts"]
    assert roll_order(hostvars, ["a1"]) == {"group_hosts": [], "group_batches": [], "groups": [],
                                            "single_hosts": ["a1"], "hosts": ["a1"]}
