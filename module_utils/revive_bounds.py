"""The type and range of one numeric input, checked the same way wherever an operator can give it: the planner's
inputs (module_utils/revive_plan/inputs.py), `bin/revive`'s options and every module's numeric options.

A bool is not a number (YAML's `yes` is True, which Ansible would take as 1 or 1.0), NaN and the infinities are
never in range, and a value outside its range raises InputError, whose message names the input, shows the value,
says what is allowed and how to fix it. Modules call `check_options` right after building their AnsibleModule:
a bad value fails the task before the module reads or changes anything on the host.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

_MISSING = object()


class InputError(ValueError):
    """An input out of its range or of the wrong type. `field` is its path ("workload.max_model_len",
    "settle.window"), `message(name)` says it under the caller's name for it (a CLI option, an inventory
    variable)."""

    def __init__(self, field: str, value: Any, allowed: str, fix: str):
        self.field, self.value, self.allowed, self.fix = field, value, allowed, fix
        super().__init__(self.message())

    def message(self, name: Optional[str] = None) -> str:
        return f"{name or self.field} is {self.value!r}: it must be {self.allowed}. Fix: {self.fix}"


def shown(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


@dataclass(frozen=True)
class Bound:
    """One input's type and range. `unset` is a value that means "not given" (kept as it is, `unset_means` says
    what follows); `optional` allows None (the input left out, `leave_out` says what follows)."""

    kind: type                      # int or float (a bool is neither)
    low: float
    high: float = 2 ** 31 - 1       # a sanity cap far beyond any real value: keeps later arithmetic finite
    low_open: bool = False          # low itself excluded
    optional: bool = False          # None allowed
    unset: Optional[float] = None
    unset_means: str = "the planner chooses"
    why: str = ""
    leave_out: str = "let the planner choose"

    def allowed(self) -> str:
        number = "a whole number" if self.kind is int else "a finite number"
        low = f"more than {shown(self.low)}" if self.low_open else f"at least {shown(self.low)}"
        text = f"{number} {low} and at most {shown(self.high)}"
        if self.unset is not None:
            text += f" ({shown(self.unset)}: {self.unset_means})"
        return text + (f" ({self.why})" if self.why else "")

    def fix(self) -> str:
        return "give a value in that range" + (f", or leave it out to {self.leave_out}" if self.optional else "")

    def parse(self, path: str, text: str) -> Any:
        """A command-line value: `text` as the bound's kind, checked; InputError when it is neither."""
        try:
            value = self.kind(text)
        except ValueError:
            raise InputError(path, text, self.allowed(), self.fix()) from None
        self.check(path, value)
        return value

    def check(self, path: str, value: Any) -> None:
        if value is None and self.optional:
            return
        good_type = isinstance(value, int if self.kind is int else (int, float)) and not isinstance(value, bool)
        if not good_type:
            raise InputError(path, value, self.allowed(), self.fix())
        if value == self.unset:
            return
        if not math.isfinite(value) or value > self.high or value < self.low or (self.low_open and value == self.low):
            raise InputError(path, value, self.allowed(), self.fix())


def _lookup(params: Any, path: str) -> Tuple[Any, bool]:
    """The value at a dotted option path, and whether it is there (a suboption of an unset dict is not)."""
    value = params
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return _MISSING, False
        value = value[key]
    return value, True


def first_error(params: Mapping[str, Any], raw: Mapping[str, Any], bounds: Mapping[str, Bound]) -> Optional[InputError]:
    """The first option of `bounds` (option path -> Bound) whose value is out of range or not a number. `params`
    are the module's validated parameters, `raw` the arguments as the task gave them: a bool there is refused even
    where Ansible's float conversion made it 1.0."""
    for path, bound in bounds.items():
        value, present = _lookup(params, path)
        if not present:
            continue
        given, was_given = _lookup(raw, path)
        if was_given and isinstance(given, bool):
            value = given
        try:
            bound.check(path, value)
        except InputError as error:
            return error
    return None


def check_options(module: Any, bounds: Mapping[str, Bound], name: str, **result: Any) -> None:
    """Fail `module` (an AnsibleModule, just built) on the first numeric option outside its Bound, naming it:
    "<name>: <option> is <value>: it must be .... Fix: ..." (`input`: the option's path; `result`: more keys of
    the failed result). Call it before the module reads or changes anything."""
    from ansible.module_utils.basic import _load_params

    error = first_error(module.params, _load_params(), bounds)
    if error is not None:
        module.fail_json(msg=f"{name}: {error.message()}", input=error.field, **result)
