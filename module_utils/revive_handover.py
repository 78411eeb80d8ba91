"""Hand-over and rolling decisions: is a node handed over, what became of it, does the roll go on.

Pure functions over what the handover role and playbooks/rolling.yml gather - the node's release record and
hand-over report (vllm_release_info), its servers' modes in the front door (haproxy_server through the frontdoor
role's entry point `servers`), and the outcome of each step. filter_plugins/revive.py makes them Jinja filters;
tests/unit/test_handover.py checks each against a table of cases.

The hand-over of a node (roles/handover): warm up every replica of the release its record names as current while
its servers are in maintenance; all pass -> READY. A failure rolls the node back to its previous release (vllm_service's
entry point `rollback`), which is warmed up and handed over only if it passes; otherwise the node stays out (MAINT).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

NO_FRONT_DOOR_NOTE = " (no front door: the inventory has no lb host; clients call the replicas directly)"
STAYS_OUT = "the node stays out of the front door (MAINT)"


def failure_message(result: Mapping[str, Any], task: Any = None, fallback: str = "the task") -> str:
    """'<failed task>: <msg>' from a rescue's ansible_failed_result and ansible_failed_task.

    A loop's result holds one result per item: the messages of the failed items, joined by '; '.
    """
    name = (task.get("name") if isinstance(task, Mapping) else task) or fallback
    result = result or {}
    if "results" in result:
        text = "; ".join(str(item.get("msg", "")) for item in result["results"] or []
                         if isinstance(item, Mapping) and item.get("failed"))
    else:
        text = str(result.get("msg", ""))
    return f"{name}: {text}"


def out_of_traffic(servers: Any) -> List[str]:
    """'<server> <mode>' for each server not READY in a haproxy_server result ({name: {mode, ...}}), sorted.

    What a run finds at its start that an earlier run (interrupted in the middle: docs/faults.md) or an operator
    left out of traffic; nothing read (None) is nothing found."""
    if not isinstance(servers, Mapping):
        return []
    return sorted(f"{name} {(state or {}).get('mode', '?')}" for name, state in servers.items()
                  if not isinstance(state, Mapping) or state.get("mode") != "ready")


# A server's modes from the least in traffic to the most: what several front doors say of one server merges to the
# first of these that any of them says (a server one front door still has in maintenance is not handed over).
_MODE_ORDER = ("maint", "drain", "ready")


def front_doors_view(results: Any, lb_hosts: Sequence[str], key: str = "servers") -> Dict[str, Any]:
    """The frontdoor role's frontdoor_node_servers_now from haproxy_server's result on every front door.

    `results` is the registered loop over `lb_hosts` (each with `item` and `servers`, or skipped). Every front door
    must hold the same state (issue 17 §5): a server is READY only when it is READY on all of them, else it takes the
    mode least in traffic that any says, with `front_doors` naming each one's mode; sessions in flight (`scur`) add
    up. Nothing read from one of them (skipped, failed in check mode) is nothing read: servers None.
    {front_door: 'lb1, lb2' ('' = no front door), front_doors: [names], servers, disagree: ['<server> lb1 ready,
    lb2 maint']}. `key` = 'before' merges the states the results found before their change instead.
    """
    names = [str(name) for name in lb_hosts or []]
    view: Dict[str, Any] = {"front_door": ", ".join(names), "front_doors": names, "servers": None, "disagree": []}
    read = {}
    for result in (results or {}).get("results", []) if isinstance(results, Mapping) else []:
        if isinstance(result, Mapping) and isinstance(result.get(key), Mapping):
            read[str(result.get("item"))] = result[key]
    if not names or any(name not in read for name in names):
        return view
    merged: Dict[str, Any] = {}
    for server in sorted({server for servers in read.values() for server in servers}):
        states = {name: read[name].get(server) for name in names}
        modes = {name: (state or {}).get("mode", "?") if isinstance(state, Mapping) else "absent"
                 for name, state in states.items()}
        worst = min(names, key=lambda name: _MODE_ORDER.index(modes[name]) if modes[name] in _MODE_ORDER else -1)
        state = dict(states[worst]) if isinstance(states[worst], Mapping) else {"mode": modes[worst]}
        sessions = [s.get("scur") for s in states.values() if isinstance(s, Mapping)]
        if all(isinstance(n, int) and not isinstance(n, bool) for n in sessions):
            state["scur"] = sum(sessions)
        if len(set(modes.values())) > 1:
            state["front_doors"] = modes
            view["disagree"].append(f"{server} " + ", ".join(f"{name} {modes[name]}" for name in names))
        merged[server] = state
    view["servers"] = merged
    return view


def found_out_note(found: Sequence[str], what: str) -> str:
    """The sentence a node's outcome carries when it was found out of traffic ('' when it was not)."""
    if not found:
        return ""
    return (f" - found out of traffic ({', '.join(found)}) {what}: an earlier run stopped in the middle (interrupted "
            "or killed) or an operator took it out; reported here, never left so silently")


def _id(release: Optional[Mapping[str, Any]], missing: str = "?") -> str:
    return str(release.get("id", missing)) if isinstance(release, Mapping) else missing


def handover_state(info: Mapping[str, Any], front_door: Mapping[str, Any], check_mode: bool = False) -> Dict[str, Any]:
    """Whether the node is handed over for the release it runs, and whether to warm it up.

    `info` is vllm_release_info's result (current, report, servers), `front_door` the frontdoor role's
    frontdoor_node_servers_now ({front_door: the LB host or '', servers: their states or None when unread}).
    Handed over: every replica of the current release passed its last warm-up for exactly this release, and -
    where there is a front door - every one of its servers is READY. Check mode cannot warm up a node that has
    no release yet. `out_before`: its servers not READY as read (out_of_traffic); `found_out`: the same, only for a
    node whose release had passed its warm-up - handed over once and taken out since - which the outcome's
    message reports (a new node's servers start in maintenance: not a finding).
    """
    release = info.get("current") or None
    replicas = [replica.get("name") for replica in (release or {}).get("replicas") or []]
    report = info.get("report") if isinstance(info.get("report"), Mapping) else {}
    reports = report.get("replicas") if isinstance(report.get("replicas"), Mapping) else {}
    passed = [name for name, entry in reports.items()
              if name in replicas and isinstance(entry, Mapping) and entry.get("passed")
              and (entry.get("release") or {}).get("id", "") == _id(release, "")]
    has_front_door = bool(front_door.get("front_door"))
    servers = front_door.get("servers")
    servers_ready = not has_front_door or (isinstance(servers, Mapping)
                                           and all(s.get("mode") == "ready" for s in servers.values()))
    warmed = release is not None and len(replicas) > 0 and len(passed) == len(replicas)
    handed_over = warmed and servers_ready
    # A serving group's worker or spare has no server of its own: its stage is warmed up and handed over with the
    # group's one replica, on the head.
    group = (release or {}).get("group") or {}
    behind_head = not replicas and group.get("role") in ("worker", "spare")
    # Warmed up for this release, yet out of traffic: it was handed over once and something took it out since.
    found_out = out_of_traffic(servers) if warmed and has_front_door and not servers_ready else []
    return {"release": release, "servers": list(info.get("servers") or []), "front_door": has_front_door,
            "check_mode": bool(check_mode), "handed_over": handed_over or behind_head, "found_out": found_out,
            "out_before": out_of_traffic(servers),
            "behind_head": {"group": group.get("name"), "role": group.get("role"), "head": group.get("head")}
            if behind_head else None,
            "warm_up": not (handed_over or behind_head) and not (release is None and check_mode)}


def restored_release(info: Mapping[str, Any], failed_release: Optional[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """After a rollback, the release to warm up and hand over: the record's current one, if the rollback says it
    serves again and it is not the release that failed; else None."""
    current = info.get("current") or None
    serving = bool((info.get("last_failure") or {}).get("restored_serving"))
    if current and serving and current.get("id") != _id(failed_release, ""):
        return dict(current)
    return None


def handover_result(state: Mapping[str, Any], node: str, record_path: str = "", warmed: Optional[Mapping] = None,
                    failure: Optional[str] = None, failed_release: Optional[Mapping] = None,
                    rollback_message: str = "", restored: Optional[Mapping] = None,
                    restored_failure: Optional[str] = None) -> Dict[str, Any]:
    """What became of the node: {node, status: serving | rolled_back | out, release, message, out_before,
    found_out}.

    `state` is handover_state's; `warmed` the release that warmed up and went READY; `failure` why its warm-up
    failed, `failed_release` which release that was; `rollback_message` the rollback's account ('' when none
    ran); `restored` the release the rollback restored and that serves again; `restored_failure` why that one
    failed its warm-up too. `out_before` and `found_out` are the state's: its servers that were not READY before
    the hand-over, and those of them its message reports as found out of traffic.
    """
    outcome = _outcome(state, node, record_path, warmed, failure, failed_release, rollback_message, restored,
                       restored_failure)
    return dict(outcome, out_before=list(state.get("out_before") or []), found_out=list(state.get("found_out") or []))


def _outcome(state: Mapping[str, Any], node: str, record_path: str, warmed: Optional[Mapping],
             failure: Optional[str], failed_release: Optional[Mapping], rollback_message: str,
             restored: Optional[Mapping], restored_failure: Optional[str]) -> Dict[str, Any]:
    note = "" if state.get("front_door") else NO_FRONT_DOOR_NOTE
    release = state.get("release")
    member = state.get("behind_head")
    if member:
        return {"node": node, "status": "serving", "release": _id(release, None),
                "message": f"{node}: the {member['role']} of serving group {member['group']} (release "
                           f"{_id(release)}) serves through its head {member['head']}, which is warmed up and handed "
                           "over for the group"}
    if state.get("handed_over"):
        return {"node": node, "status": "serving", "release": _id(release, None),
                "message": f"{node}: already handed over with release {_id(release)}{note}"}
    if not state.get("warm_up"):
        return {"node": node, "status": "out", "release": None,
                "message": f"check mode: {node} has no release recorded in {record_path} yet (run without --check to "
                           "provision it); would warm up its replicas and set them READY"}
    found = found_out_note(state.get("found_out") or [], f"with release {_id(release)} already warmed up")
    if failure is None:
        return {"node": node, "status": "serving", "release": _id(warmed, None),
                "message": f"{node}: warmed up and handed over with release {_id(warmed)}{note}{found}"}
    failed = f"{node}{found}: release {_id(failed_release)} failed ({failure.strip()})"
    if restored and restored_failure is None:
        return {"node": node, "status": "rolled_back", "release": _id(restored),
                "message": f"{failed}; rolled back to release {_id(restored)}, which warmed up and serves"}
    if restored:
        return {"node": node, "status": "out", "release": _id(restored),
                "message": f"{failed}; the restored release {_id(restored)} failed its warm-up too "
                           f"({restored_failure.strip()}); {STAYS_OUT}"}
    rollback = (f"rollback: {rollback_message.strip()}" if rollback_message
                else "not rolled back (check mode, or handover_rollback is false)")
    return {"node": node, "status": "out", "release": None, "message": f"{failed}; {rollback}; {STAYS_OUT}"}


def served_model_name(argv: Sequence[str]) -> str:
    """The model name the replica serves (what warm-up requests ask for): --served-model-name, else --model."""
    words = list(argv)
    flag = "--served-model-name" if "--served-model-name" in words else "--model"
    return str(words[words.index(flag) + 1])


# --- rolling ----------------------------------------------------------------------------------------------

def roll_node_result(handover: Mapping[str, Any], target_id: str, switch_failure: Optional[str] = None,
                     found_out: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """One node's outcome in a roll: did it take the target release, does it serve, and why.

    `handover` is the handover role's handover_result; `switch_failure` why the drain or the switch failed (the
    node then runs its old, restored release, handed back without a further rollback); `found_out` its servers
    that were out of traffic when its roll began (the drain's `before`, or the hand-over's `out_before`).
    """
    message = str(handover.get("message", ""))
    if found_out and not handover.get("found_out"):  # the hand-over's message may say so already
        message = f"{message}{found_out_note(found_out, 'when its roll began')}"
    if switch_failure is not None:
        message = f"{handover.get('node')}: release {target_id} failed ({switch_failure.strip()}); {message}"
    return {"node": handover.get("node"), "target": target_id,
            "took_release": switch_failure is None and handover.get("status") == "serving",
            "serving": handover.get("status") != "out", "message": message}


# HAProxy's show stat status words of a server that takes no new request (revive_haproxy.ServerState.serving).
NO_TRAFFIC_STATUS = ("DOWN", "MAINT", "DRAIN", "NOLB")


def _front_door_view(front_door: Optional[Mapping[str, Any]]) -> Tuple[Optional[bool], str]:
    """(takes traffic?, words) of a node's servers as the frontdoor role's `servers` entry point read them
    ({front_door, servers: {name: {mode, status, scur}}}); None when nothing was read."""
    front_door = front_door or {}
    lb, servers = front_door.get("front_door"), front_door.get("servers")
    if not lb:
        return None, "no front door (the inventory has no lb host)"
    if not isinstance(servers, Mapping) or not servers:
        return None, f"the front door {lb} could not say (its servers were not read)"
    taking = [name for name, state in servers.items() if isinstance(state, Mapping)
              and state.get("mode") == "ready" and not str(state.get("status", "")).startswith(NO_TRAFFIC_STATUS)]
    words = ", ".join(f"{name} {(state or {}).get('status', '?')} ({(state or {}).get('mode', '?')}, "
                      f"{(state or {}).get('scur', '?')} in flight)" for name, state in sorted(servers.items()))
    if taking:
        return True, (f"the front door {lb} still sends it traffic ({words}): it serves, only the controller lost "
                      "it - check the controller's path to it (SSH, its address)")
    return False, (f"the front door {lb} sends it no traffic ({words}): its health checks took it out, and put it "
                   "back by themselves once it answers again")


def roll_unreachable_result(reach: Mapping[str, Any], node: str, target_id: str,
                            front_door: Optional[Mapping[str, Any]] = None,
                            lost_members: Sequence[str] = ()) -> Dict[str, Any]:
    """The outcome of a node that is not rolled because the controller cannot reach it, or cannot reach a member of
    its serving group (`lost_members`, which rolls as one): nothing on it was touched; `reach` is the reachability
    check's result, `front_door` what the front door says of its servers, `target` names the planned release. It
    did not take the release, so the roll's policy counts it (docs/faults.md)."""
    reach = reach or {}
    if lost_members and node not in lost_members:
        message = (f"{node}: not rolled: its serving group rolls as one, and the controller cannot reach "
                   f"{', '.join(lost_members)}; left as it was, nothing on it changed")
        return {"node": node, "target": target_id, "took_release": False, "serving": True, "unreachable": False,
                "message": message}
    why = " ".join(str(reach.get("msg") or "no answer").split())
    if len(why) > 300:
        why = why[:297] + "..."
    serving, view = _front_door_view(front_door)
    message = (f"{node}: unreachable from the controller ({why}): not rolled to {target_id}, nothing on it "
               f"changed; {view}")
    return {"node": node, "target": target_id, "took_release": False, "serving": serving, "unreachable": True,
            "message": message}


def roll_policy(results: Sequence[Mapping[str, Any]], hosts: Sequence[str], max_fail_percent: Any) -> Dict[str, Any]:
    """Does the roll go on? It stops as soon as more than `max_fail_percent` of the play's nodes (`hosts`) did
    not take the release; `results` are the roll_node_result of the nodes rolled so far."""
    results, hosts = list(results), list(hosts)  # Jinja's map() hands over a generator
    failed = [result for result in results if not result.get("took_release")]
    rolled = {result.get("node") for result in results}
    untouched = [host for host in hosts if host not in rolled]
    failed_percent = round(len(failed) * 100.0 / len(hosts), 1) if hosts else 0.0
    stop = failed_percent > float(max_fail_percent)
    message = (f"Roll stopped by policy: {len(failed)} of {len(hosts)} node(s) ({failed_percent} %) did not take "
               f"the release, more than revive_rolling_max_fail_percent {max_fail_percent} %. "
               f"{'. '.join(str(result.get('message', '')).strip() for result in failed)}. Not rolled (still on "
               f"their release, in the front door): {', '.join(untouched) or 'none'}.")
    return {"stop": stop, "failed_percent": failed_percent, "message": message if stop else ""}


def roll_summary(results: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """The end of a roll: it fails when nodes were left on their old release, even within the policy's budget."""
    results = list(results)  # Jinja's map() hands over a generator
    left: List[Mapping[str, Any]] = [result for result in results if not result.get("took_release")]
    return {"failed": bool(left), "messages": [str(result.get("message", "")) for result in results],
            "message": (f"The roll finished, but {', '.join(str(r.get('node')) for r in left)} did not take the "
                        f"release: {' '.join(str(r.get('message', '')) for r in left)}") if left else ""}


def serial_batch_size(serial: Any, host_count: int) -> int:
    """The size of a play's first batch for `serial: <serial>` over `host_count` hosts, as Ansible computes it
    (ansible/executor/playbook_executor.py _get_serialized_batches with ansible/utils/helpers.py pct_to_int):
    "N%" is int(N / 100 * hosts) with a minimum of 1, a number is itself, 0 or less means every host."""
    text = str(serial).strip()
    size = (int(int(text[:-1]) / 100.0 * host_count) or 1) if text.endswith("%") else int(text)
    return host_count if size <= 0 else min(size, host_count)


def roll_batch_check(serial: Any, batch: Sequence[str], hosts: Sequence[str]) -> str:
    """Did the roll's first batch come out of `serial`? Ansible templates a play's `serial` before any host exists,
    from extra vars, play vars and role defaults only: a revive_rolling_serial in the inventory never reaches it.
    Returns the refusal ("" when the batch is as asked, or when `batch` is not the play's first)."""
    batch, hosts = list(batch), list(hosts)
    if not batch or not hosts or batch[0] != hosts[0]:
        return ""
    expected = serial_batch_size(serial, len(hosts))
    if len(batch) == expected:
        return ""
    return (f"revive_rolling_serial is {serial!r} for this host, which asks for a first batch of {expected} of "
            f"{len(hosts)} node(s), but Ansible made it {len(batch)} ({', '.join(batch)}): Ansible reads a play's "
            f"`serial` only from extra vars, never from the inventory. Nothing was changed. Pass it on the command "
            f"line (ansible-playbook ... playbooks/rolling.yml -e revive_rolling_serial={serial}) and remove it from "
            f"the inventory.")


def roll_order(hostvars: Mapping[str, Mapping[str, Any]], hosts: Sequence[str]) -> Dict[str, Any]:
    """How rolling.yml rolls `hosts` (the fit GPU nodes): a serving group whose plan spans nodes rolls as one - its
    stages cannot serve on two releases, so the whole group leaves the front door at once - one group after the
    other, its head first; every other node rolls alone, revive_rolling_serial at a time. From each node's planned
    release (host fact revive_release, its `group` section).

    {group_hosts: the groups' members in roll order, group_batches: one batch size per group (a play's `serial`
    list), groups: [{name, members}], single_hosts: the rest, in the order given, hosts: all of them, the roll's
    fleet (its failure policy counts them all)}."""
    groups: Dict[str, List[Tuple[int, str]]] = {}
    singles: List[str] = []
    for host in list(hosts):
        facts = (hostvars.get(host) or {}).get("ansible_facts") or {}
        group = (facts.get("revive_release") or {}).get("group") or {}
        if not group.get("name"):
            singles.append(host)
            continue
        rank = {"head": 0, "worker": 1}.get(str(group.get("role")), 2)
        groups.setdefault(str(group["name"]), []).append((rank * 1000 + int(group.get("stage") or 0), host))
    ordered = [{"name": name, "members": [host for _, host in sorted(members)]}
               for name, members in sorted(groups.items())]
    group_hosts = [host for group in ordered for host in group["members"]]
    return {"group_hosts": group_hosts, "group_batches": [len(group["members"]) for group in ordered],
            "groups": ordered, "single_hosts": singles, "hosts": group_hosts + singles}
