"""Time-scaled Prometheus rules for the lab: every range window and `for:` of a rule file multiplied by one factor.

The lab's twin runs its modelled time faster than the wall clock (VLLM_SIM_TIME_SCALE); the production rules' windows
(a 1 h burn-rate window, a 30 min imbalance `for:`) would make a Molecule scenario wait hours for an alert. The
monitoring role passes each rule file through `scale_rules` when `monitoring_rule_time_scale` is below 1, and only
then: at 1 the file is returned byte for byte.

What is scaled, in each rule's `expr` (outside PromQL string literals, whose label regexes may hold `[0-9]+`):
range selectors `x[10m]`, subqueries `x[30m:1m]` (both durations) and `offset 5m`; and the rule's `for:` and
`keep_firing_for:`, and a group's `interval:`. Thresholds, label values and recording-rule names (`...:rate1h`)
are not: a burn-rate alert still compares the same ratio with the same bound, over a shorter window.

Floors keep a scaled rule meaningful: a range never shorter than 4 scrape intervals (rate() and deriv() need two
samples; four leave room for a late scrape), a `for:` or group interval never shorter than one evaluation interval.
The output starts with a comment that says it is time-scaled, from which file, and that it is not for production.
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Optional

import yaml

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000,
             "y": 31_536_000_000}
_DURATION = re.compile(r"(?:[0-9]+(?:ms|s|m|h|d|w|y))+")
_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")
# A PromQL string literal (double, single or back quotes) - copied as it is - or one of the three places a duration
# sits in an expression.
_TOKEN = re.compile(
    r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`'
    r"|\[\s*(?P<range>" + _DURATION.pattern + r")\s*(?::\s*(?P<step>" + _DURATION.pattern + r")?\s*)?\]"
    r"|\boffset\s+(?P<sign>-?)(?P<offset>" + _DURATION.pattern + r")\b")
RANGE_SCRAPES = 4
HEADER = ("# TIME-SCALED for the lab by revive (module_utils/revive_rule_scale.py): every range window, offset and\n"
          "# for: of {source} x {scale:g} (ranges >= {range_floor}, for: >= {for_floor}); thresholds unchanged.\n"
          "# Not for production: these windows are not the SLO's. monitoring_rule_time_scale: 1 installs the file.\n")


class RuleScaleError(ValueError):
    """A scale, an interval or a rule file that cannot be time-scaled; the message says where and how to fix it."""


def duration_ms(text: Any, where: str) -> int:
    """A Prometheus duration (`1h30m`, `500ms`) in milliseconds."""
    if not isinstance(text, str) or not _DURATION.fullmatch(text.strip()):
        raise RuleScaleError(f"{where}: {text!r} is not a Prometheus duration (e.g. 15s, 5m, 1h30m)")
    return sum(int(number) * _UNITS_MS[unit] for number, unit in _PART.findall(text.strip()))


def format_ms(ms: int) -> str:
    """The shortest exact Prometheus duration for `ms` milliseconds (90000 -> 1m30s, 1500 -> 1s500ms)."""
    if ms <= 0:
        return "0s"
    parts = []
    for unit in ("h", "m", "s", "ms"):
        count, ms = divmod(ms, _UNITS_MS[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def check_scale(scale: Any, where: str = "monitoring_rule_time_scale") -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) \
            or not 0 < scale <= 1:
        raise RuleScaleError(f"{where}: {scale!r} must be a number above 0 and at most 1 (1 = the production "
                             "windows; the lab sets e.g. 0.0167 to run an hour's window in a minute)")
    return float(scale)


class _Scaler:
    def __init__(self, scale: float, range_floor_ms: int, for_floor_ms: int):
        self.scale, self.range_floor_ms, self.for_floor_ms = scale, range_floor_ms, for_floor_ms

    def scaled(self, ms: int, floor_ms: int) -> int:
        return max(int(round(ms * self.scale)), floor_ms) if ms > 0 else 0

    def duration(self, text: str, floor_ms: int, where: str) -> str:
        return format_ms(self.scaled(duration_ms(text, where), floor_ms))

    def expr(self, text: str, where: str) -> str:
        def one(match: "re.Match[str]") -> str:
            if match.group("range"):
                window = self.duration(match.group("range"), self.range_floor_ms, where)
                if match.group("step"):
                    return f"[{window}:{self.duration(match.group('step'), self.for_floor_ms, where)}]"
                return f"[{window}:]" if ":" in match.group(0) else f"[{window}]"
            if match.group("offset"):
                return f"offset {match.group('sign')}{self.duration(match.group('offset'), 0, where)}"
            return match.group(0)
        return _TOKEN.sub(one, text)


def _groups(data: Any, source: str) -> List[Dict[str, Any]]:
    groups = data.get("groups") if isinstance(data, dict) else None
    if not isinstance(groups, list) or not all(isinstance(g, dict) and isinstance(g.get("rules"), list)
                                               for g in groups):
        raise RuleScaleError(f"{source}: not a Prometheus rule file (a mapping with `groups`, each with `rules`)")
    return groups


def scale_rules(text: str, scale: Any, scrape_interval: str, evaluation_interval: str,
                source: str = "rules") -> str:
    """`text` (a rule file) with its windows scaled by `scale`, or `text` itself when `scale` is 1."""
    scale = check_scale(scale)
    scrape_ms = duration_ms(scrape_interval, "monitoring_scrape_interval")
    eval_ms = duration_ms(evaluation_interval, "monitoring_evaluation_interval")
    if scale == 1.0:
        return text
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RuleScaleError(f"{source}: not YAML: {exc}") from None
    scaler = _Scaler(scale, RANGE_SCRAPES * scrape_ms, eval_ms)
    for group in _groups(data, source):
        name = group.get("name", "?")
        if "interval" in group:
            group["interval"] = scaler.duration(group["interval"], eval_ms, f"{source}: group {name} interval")
        for index, rule in enumerate(group["rules"]):
            where = f"{source}: group {name}, rule {rule.get('alert') or rule.get('record') or index}"
            if not isinstance(rule.get("expr"), str):
                raise RuleScaleError(f"{where}: no expr")
            rule["expr"] = scaler.expr(rule["expr"], where)
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    rule[key] = scaler.duration(str(rule[key]), eval_ms, f"{where}: {key}")
    header = HEADER.format(source=source, scale=scale, range_floor=format_ms(RANGE_SCRAPES * scrape_ms),
                           for_floor=format_ms(eval_ms))
    return header + yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)


def scale_rule_files(texts: Dict[str, str], scale: Any, scrape_interval: str, evaluation_interval: str) -> Dict[str, str]:
    """Each rule file of {name: text} through `scale_rules` (the role's one call, so one error names the file)."""
    if not isinstance(texts, dict):
        raise RuleScaleError(f"rule files: expected a mapping of file name to text, got {type(texts).__name__}")
    return {name: scale_rules(text, scale, scrape_interval, evaluation_interval, name)
            for name, text in sorted(texts.items())}


class _Dumper(yaml.SafeDumper):
    """Block scalars for multi-line strings (expressions stay readable in the installed file)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style: Optional[str] = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)
