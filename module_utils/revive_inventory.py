"""The site-wide settings of an inventory, checked before anything runs.

What an inventory may set is declared once, in roles/revive_defaults/meta/argument_specs.yml (its `main` options:
each revive_* variable with its type, choices and default; no default = the inventory must set it). The role
validate_inventory passes that spec, what every host of the run sets of the revive_* namespace, the inventory's
groups and the stages of the run to library/revive_inventory_check.py, which calls check_inventory() here.

Each rule below finds one kind of mistake and says what is wrong, where (the hosts it concerns, named as the
group whose vars would set it when they are exactly one group's hosts) and how to fix it. Mistakes are never
raised one at a time: the operator gets all of them in one run.
"""
from __future__ import annotations

import datetime
import difflib
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ansible.module_utils.common.validation import (
    check_type_bool,
    check_type_dict,
    check_type_float,
    check_type_int,
    check_type_list,
)

DECLARED_IN = "roles/revive_defaults/defaults/main.yml"
SET_IN = "inventory/<yours>/group_vars/all/"
# What the role validate_inventory passes for a value that does not resolve (its template names an undefined
# variable, e.g. a vault variable that is not loaded).
UNDEFINED = "__revive_undefined__"

STAGES = ("preflight", "provision", "handover", "rolling", "benchmark")

_MODEL = ("revive_model_name", "revive_model_revision", "revive_model_source_type", "revive_model_source_path")
_PACKAGES = ("revive_pip_source", "revive_lock_dir")
_SLO = ("revive_slo_p95_e2e_s", "revive_slo_output_tokens")
# The variables without a default that each stage reads, per group of the hosts it reads them on. A variable with a
# default is never missing; one without is needed only where a stage reads it (preflight.yml alone needs no API key).
STAGE_NEEDS: Dict[str, Dict[str, Tuple[str, ...]]] = {
    "preflight": {"gpu_nodes": _MODEL + ("revive_max_model_len", "revive_concurrency", "revive_slo_p95_e2e_s",
                                        "revive_slo_output_tokens", "revive_plan_overrides",
                                        "revive_expected_gpu_count", "revive_expected_gpu_name") + _PACKAGES
                  + ("revive_max_unfit_percent",)},
    "provision": {"gpu_nodes": _MODEL + _PACKAGES + ("revive_api_key",)},
    # The hand-over's SLO gate (revive_slo_gate) judges against the plan's SLO: read whether or not the gate is on.
    "handover": {"gpu_nodes": ("revive_api_key",) + _SLO, "bench": ("revive_model_name", "revive_api_key")},
    "rolling": {"gpu_nodes": ("revive_api_key",) + _SLO},
    "benchmark": {"bench": ("revive_model_name", "revive_api_key", "revive_slo_p95_e2e_s", "revive_slo_output_tokens")},
}
# The groups that must hold a host for a stage to do its work.
STAGE_GROUPS: Dict[str, Tuple[str, ...]] = {
    "preflight": ("gpu_nodes",),
    "provision": ("gpu_nodes",),
    "handover": ("gpu_nodes",),
    "rolling": ("gpu_nodes", "lb"),
    "benchmark": ("gpu_nodes", "bench"),
}
GROUP_ROLES = {"gpu_nodes": "the GPU nodes", "lb": "the front door (HAProxy) the roll drains nodes through",
               "bench": "the bench host"}
# Values that were renamed: variable -> {old value: new value}.
RENAMED_VALUES: Dict[str, Dict[str, str]] = {"revive_model_source_type": {"mounted": "node_path"}}

_TYPE_WORDS = {"str": "a string", "path": "a path (a string)", "int": "a whole number", "float": "a number",
               "bool": "true or false", "dict": "a mapping", "list": "a list", "raw": "a value"}
_SCALARS = (str, int, float, datetime.date)
MISSING = "is not set"


@dataclass(frozen=True)
class Mistake:
    variable: str
    what: str
    fix: str
    hosts: Tuple[str, ...]

    def message(self, checked: Sequence[str], groups: Mapping[str, Sequence[str]]) -> str:
        if not self.hosts:
            return f"{self.variable} {self.what}. Fix: {self.fix}"
        place = where(self.hosts, checked, groups, needed=self.what == MISSING)
        return f"{self.variable} {self.what} - {place}. Fix: {self.fix}"


# --- where: the hosts a mistake concerns, named as a group when they are exactly one group's hosts

def _names(hosts: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(hosts[:limit])
    return shown + (f" and {len(hosts) - limit} more" if len(hosts) > limit else "")


def where(hosts: Iterable[str], checked: Sequence[str], groups: Mapping[str, Sequence[str]],
          needed: bool = False) -> str:
    """The hosts a mistake concerns - all of the run's, exactly one group's, or some - and, for a value that is
    wrong, the inventory file that sets it for exactly those hosts (for one that is missing, the fix says where)."""
    hosts = sorted(set(hosts))
    checked_set = set(checked)
    lead = "needed on" if needed else "on"
    if set(hosts) == checked_set and len(hosts) > 1:
        file = "" if needed else "; group_vars/all/ sets it for all of them"
        return f"{lead} every host of the run ({_names(hosts)}{file})"
    matching = [name for name, members in groups.items()
                if name not in ("all", "ungrouped") and set(members) & checked_set == set(hosts)]
    if matching:
        group = sorted(matching, key=lambda name: (-len(groups[name]), name))[0]
        file = "" if needed else f"; group_vars/{group}/ or group_vars/all/"
        return f"{lead} the hosts of group {group} ({_names(hosts)}{file})"
    if needed:
        return f"{lead} {'host' if len(hosts) == 1 else 'hosts'} {_names(hosts)}"
    if len(hosts) == 1:
        return f"on host {hosts[0]} (host_vars/{hosts[0]}/, or the group_vars/ of a group it is in)"
    return f"on hosts {_names(hosts)} (their host_vars/, or the group_vars/ of a group they share)"


# --- types: the spec's type, as the roles' argument specs accept it (numbers from -e arrive as strings)

def _description(option: Mapping[str, Any]) -> str:
    text = option.get("description") or ""
    text = " ".join(text) if isinstance(text, list) else str(text)
    text = re.sub(r"^Required[^.]*\.\s*", "", text)
    text = re.sub(r"[VCIO]\(([^)]*)\)", r"\1", text)
    return re.split(r"(?<!e\.g)\.\s+", text)[0].rstrip(".")


def _shown(value: Any, option: Mapping[str, Any]) -> str:
    return "(hidden)" if option.get("no_log") else repr(value)


def convert(value: Any, kind: str) -> Any:
    """The value as type `kind`, or TypeError. Strings for numbers and booleans are accepted (-e gives strings),
    booleans are never numbers or strings (YAML's `no` is false, not a name)."""
    if kind in ("str", "path"):
        if isinstance(value, _SCALARS) and not isinstance(value, bool):
            return value if isinstance(value, str) else str(value)
        raise TypeError(kind)
    if kind in ("int", "float") and isinstance(value, bool):
        raise TypeError(kind)
    checkers: Dict[str, Callable[[Any], Any]] = {"int": check_type_int, "float": check_type_float,
                                                 "bool": check_type_bool, "dict": check_type_dict,
                                                 "list": check_type_list}
    if kind == "raw":
        return value
    return checkers[kind](value)


def type_problem(name: str, value: Any, option: Mapping[str, Any]) -> Tuple[Optional[Tuple[str, str]], Any]:
    """((what, fix) or None, the converted value)."""
    kind = option.get("type", "raw")
    try:
        value = convert(value, kind)
    except (TypeError, ValueError):
        return ((f"must be {_TYPE_WORDS.get(kind, kind)} (got {_shown(value, option)})",
                 f"set {name} to {_TYPE_WORDS.get(kind, kind)} ({_description(option)})"), value)
    choices = option.get("choices")
    renamed = RENAMED_VALUES.get(name, {})
    if choices and isinstance(value, str) and value in renamed:
        return ((f"{value!r} was renamed to {renamed[value]!r}",
                 f"set {name}: {renamed[value]} ({_description(option)})"), value)
    if choices and value not in choices:
        return ((f"must be one of {', '.join(map(str, choices))} (got {_shown(value, option)})",
                 f"set {name} to one of {', '.join(map(str, choices))} ({_description(option)})"), value)
    return None, value


def suboption_problems(name: str, value: dict, option: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """A mapping with declared keys: unknown keys and each key's type."""
    suboptions = option.get("options") or {}
    problems = []
    for key in value:
        if key not in suboptions:
            close = difflib.get_close_matches(str(key), list(suboptions), n=1, cutoff=0.6)
            problems.append((f"has no key {key!r} (its keys: {', '.join(suboptions)})",
                             f"use {close[0]!r} instead" if close else f"remove {key!r} from {name}"))
    for key, sub in suboptions.items():
        if value.get(key) is not None:
            found, _ = type_problem(f"{name}.{key}", value[key], sub)
            if found:
                problems.append((f"key {key!r} {found[0]}", found[1]))
    return problems


# --- values a later step would refuse, refused here first with what to set instead

def _non_empty(what: str) -> Callable[[Any], Optional[Tuple[str, str]]]:
    def rule(value: Any) -> Optional[Tuple[str, str]]:
        return None if str(value).strip() else ("is empty", f"set {what}")
    return rule


def _at_least(low: float, inclusive: bool = True) -> Callable[[Any], Optional[Tuple[str, str]]]:
    def rule(value: Any) -> Optional[Tuple[str, str]]:
        ok = value >= low if inclusive else value > low
        bound = f"at least {low:g}" if inclusive else f"more than {low:g}"
        return None if ok else (f"is {value:g}, it must be {bound}", f"set a value {bound}")
    return rule


def _percent(value: Any) -> Optional[Tuple[str, str]]:
    if 0 <= value <= 100:
        return None
    return f"is {value:g}, a share in percent from 0 to 100", "set a percentage from 0 to 100"


def _absolute(value: Any) -> Optional[Tuple[str, str]]:
    if posixpath.isabs(value):
        return None
    return (f"is {value!r}, not an absolute path",
            "give the model directory's absolute path at its source, e.g. /srv/models/<name>/<revision>")


def _pip_source(value: dict) -> Optional[Tuple[str, str]]:
    kind = value.get("type") or "index"
    if kind == "mirror" and not value.get("index_url"):
        return "is a mirror without index_url", "add index_url: <the mirror's simple-index URL>"
    if kind == "wheelhouse" and not value.get("wheelhouse"):
        return ("is a wheelhouse without a directory",
                "add wheelhouse: <a directory of wheels on the controller> (the lab's: .lab/wheelhouse)")
    return None


def _serial(value: Any) -> Optional[Tuple[str, str]]:
    fix = "set a number of nodes (at least 1) or a percentage such as \"25%\""
    if isinstance(value, str) and value.strip().endswith("%"):
        number = value.strip()[:-1]
        if number.isdigit() and 1 <= int(number) <= 100:
            return None
        return f"is {value!r}, not a percentage from 1% to 100%", fix
    try:
        count = convert(value, "int")
    except (TypeError, ValueError):
        return f"is {value!r}, neither a number of nodes nor a percentage", fix
    # serial 0 would be every node at once: the roll's whole point is not to do that.
    return None if count >= 1 else (f"is {count}, which would re-provision every node at once", fix)


def _group_name(value: Any) -> Optional[Tuple[str, str]]:
    if value == "" or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", str(value)):
        return None
    return (f"is {value!r}, not a serving group name", "use letters, digits and ._- (e.g. mixtral-a), the same on "
            "every member, or \"\" for a node that serves alone")


def _port(value: Any) -> Optional[Tuple[str, str]]:
    if 1 <= value <= 65535:
        return None
    return f"is {value}, not a TCP port", "set a port from 1 to 65535"


def _ip_or_empty(fix: str) -> Callable[[Any], Optional[Tuple[str, str]]]:
    """An IP address, or "" for the one the node's facts give."""
    def check(value: Any) -> Optional[Tuple[str, str]]:
        import ipaddress
        try:
            if value != "":
                ipaddress.ip_address(str(value))
            return None
        except ValueError:
            return (f"is {value!r}, not an IP address", fix + ", or \"\" to take it from the node's facts")
    return check


def _link(value: Any) -> Optional[Tuple[str, str]]:
    if 0 < value <= 10 ** 4:
        return None
    return f"is {value}", "set the Gbit/s between the serving group's nodes, above 0 and at most 10000"


VALUE_RULES: Dict[str, Callable[[Any], Optional[Tuple[str, str]]]] = {
    "revive_model_name": _non_empty("the model's name"),
    "revive_model_revision": _non_empty("the model's revision"),
    "revive_model_source_path": _absolute,
    "revive_max_model_len": _at_least(0),
    "revive_concurrency": _at_least(1),
    "revive_slo_p95_e2e_s": _at_least(0, inclusive=False),
    "revive_slo_output_tokens": _at_least(1),
    "revive_expected_gpu_count": _at_least(0),
    "revive_pip_source": _pip_source,
    "revive_max_unfit_percent": _percent,
    "revive_api_key": _non_empty("the API key (from a vault)"),
    "revive_slo_gate_duration_s": _at_least(0, inclusive=False),
    "revive_slo_gate_concurrency": _at_least(0),
    "revive_rolling_serial": _serial,
    "revive_rolling_max_fail_percent": _percent,
    "revive_serving_group": _group_name,
    "revive_node_link_gbit": _link,
    "revive_ray_port": _port,
    "revive_cluster_address": _ip_or_empty("set the IP the serving group's nodes reach this node at"),
    "revive_serve_address": _ip_or_empty("set the IP the node's replicas listen on (one of its own), 0.0.0.0 for "
                                         "every interface"),
}


# --- one host's settings

def needed(host: str, groups: Mapping[str, Sequence[str]], stages: Sequence[str]) -> List[str]:
    """The variables without a default that the run's stages read on this host."""
    found: List[str] = []
    for stage in stages:
        for group, names in STAGE_NEEDS.get(stage, {}).items():
            if host in groups.get(group, ()):
                found += [name for name in names if name not in found]
    return found


def value_problems(name: str, value: Any, option: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """What is wrong with one value the inventory sets."""
    if isinstance(value, str) and value == UNDEFINED:
        return [("does not resolve: its value names an undefined variable (a vault variable not loaded?)",
                 "define what it refers to (e.g. pass --ask-vault-pass or --vault-password-file), or set the "
                 "value itself")]
    if value is None:
        return []  # judged as not set
    found, value = type_problem(name, value, option)
    if found:
        return [found]
    problems = suboption_problems(name, value, option) if option.get("options") and isinstance(value, dict) else []
    rule = VALUE_RULES.get(name)
    if not problems and rule:
        found = rule(value)
        if found:
            problems.append(found)
    return problems


def host_mistakes(host: str, settings: Mapping[str, Any], spec: Mapping[str, Mapping[str, Any]],
                  groups: Mapping[str, Sequence[str]], stages: Sequence[str]) -> List[Tuple[str, str, str]]:
    """(variable, what, fix) for every mistake on one host."""
    out = []
    for name in sorted(settings):
        if name not in spec:
            close = difflib.get_close_matches(name, list(spec), n=1, cutoff=0.75)
            out.append((name, "is not a site-wide variable",
                        (f"did you mean {close[0]}? " if close else "") + f"Every revive_* variable is declared in "
                        f"{DECLARED_IN}; rename it or remove it"))
    for name, option in spec.items():
        value = settings.get(name)
        for what, fix in value_problems(name, value, option):
            out.append((name, what, fix))
        if value is None and option.get("default") is None and name in needed(host, groups, stages):
            out.append((name, MISSING, f"set it in {SET_IN} ({_description(option)}; see {DECLARED_IN})"))
        elif value is None and name in settings and option.get("default") is not None:
            out.append((name, "is set to null", f"remove it to get the default {option['default']!r}, or set a value"))
    return out


def group_mistakes(groups: Mapping[str, Sequence[str]], stages: Sequence[str]) -> List[Mistake]:
    out = []
    for stage in stages:
        for group in STAGE_GROUPS.get(stage, ()):
            if not groups.get(group) and not any(m.variable == f"group {group}" for m in out):
                out.append(Mistake(f"group {group}", f"has no host, and the {stage} stage needs "
                                   f"{GROUP_ROLES.get(group, 'it')}", f"add the host(s) to group {group} in the "
                                   "inventory (see inventory/example/hosts.yml)", ()))
    return out


# --- the run

@dataclass(frozen=True)
class Report:
    mistakes: List[Mistake]
    messages: List[str]
    checked: Tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.mistakes

    @property
    def msg(self) -> str:
        if self.ok:
            return f"the site-wide settings of {len(self.checked)} host(s) are complete and valid"
        return (f"the inventory has {len(self.mistakes)} mistake(s) in its site-wide settings; nothing has run:\n- "
                + "\n- ".join(self.messages))

    def as_dict(self) -> dict:
        return {"ok": self.ok, "msg": self.msg, "checked": list(self.checked),
                "mistakes": [{"variable": m.variable, "what": m.what, "fix": m.fix, "hosts": list(m.hosts),
                              "message": text} for m, text in zip(self.mistakes, self.messages)]}


def check_inventory(spec: Mapping[str, Mapping[str, Any]], hosts: Mapping[str, Mapping[str, Any]],
                    groups: Mapping[str, Sequence[str]], stages: Sequence[str]) -> Report:
    """Every mistake of every host, one Mistake per (variable, what, fix) with all the hosts it concerns.

    `spec`: revive_defaults' options; `hosts`: host -> the revive_* variables it sets (facts left out);
    `groups`: the inventory's groups; `stages`: what this run does (preflight, provision, handover, rolling).
    """
    unknown = [stage for stage in stages if stage not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(unknown)}; the stages are {', '.join(STAGES)}")
    found: Dict[Tuple[str, str, str], List[str]] = {}
    for host in sorted(hosts):
        for key in host_mistakes(host, hosts[host], spec, groups, stages):
            found.setdefault(key, []).append(host)
    order = {name: index for index, name in enumerate(spec)}
    mistakes = group_mistakes(groups, stages) + [
        Mistake(variable, what, fix, tuple(found[(variable, what, fix)]))
        for variable, what, fix in sorted(found, key=lambda key: (order.get(key[0], len(order)), key))]
    checked = tuple(sorted(hosts))
    messages = [m.message(checked, groups) for m in mistakes]
    return Report(mistakes, messages, checked)


def secrets(spec: Mapping[str, Mapping[str, Any]], hosts: Mapping[str, Mapping[str, Any]]) -> List[str]:
    """The values of the no_log variables, for the module to mask in everything it returns."""
    return sorted({str(settings[name]) for settings in hosts.values() for name, option in spec.items()
                   if option.get("no_log") and settings.get(name) not in (None, "", UNDEFINED)})
