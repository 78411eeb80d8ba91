"""Every module's numeric options have a range (module_utils/revive_bounds.py, issue 17 §1), checked first.

- Coverage: each int/float option of each library/ module (suboptions too) has a Bound of its kind in the module's
  `BOUNDS`, no Bound names an option that is not there, and `check_options` is the statement right after the
  AnsibleModule is built, so nothing of the module runs before it.
- Sweep: every bounded option of every module, given each kind of bad value (below, above, NaN, the infinities,
  YAML's `yes`, a word), fails the module through Ansible's own argument handling with a message that names the
  option, shows the value and says how to fix it. In-process: the module stops at its check (a value that passes
  it stops the test instead, so nothing of the module runs here).
- Property (hypothesis): generated bad values for every module at once through `ansible-playbook`; every task
  fails with the option's name, no traceback, and the host is unchanged (the test's directory, systemd's units).
"""
from __future__ import annotations

import ast
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
import textwrap
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import ansible.module_utils.basic as basic
import pytest
from ansible.module_utils.revive_bounds import Bound, first_error
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
BIN = os.path.dirname(sys.executable)
MODULES = sorted(path.stem for path in (REPO / "library").glob("*.py"))
NUMERIC = {"int": int, "float": float}


class _Captured(Exception):
    pass


class _PassedBounds(Exception):
    pass


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"revive_module_{name}", REPO / "library" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _argument_spec(module: Any) -> Dict[str, Any]:
    """The spec main() gives AnsibleModule (main stops there), with its other keyword arguments under ""."""
    captured: Dict[str, Any] = {}
    real = module.AnsibleModule

    def capture(*args: Any, **kwargs: Any) -> None:
        captured.update(kwargs)
        raise _Captured

    module.AnsibleModule = capture
    try:
        module.main()
    except _Captured:
        pass
    finally:
        module.AnsibleModule = real
    spec = dict(captured.pop("argument_spec"))
    spec[""] = captured
    return spec


def _numeric_options(spec: Dict[str, Any], prefix: str = "") -> Iterator[Tuple[str, type]]:
    for name, option in _options(spec).items():
        kind = option.get("type", "str")
        if kind in NUMERIC:
            yield prefix + name, NUMERIC[kind]
        if option.get("options") and option.get("type") == "dict":
            yield from _numeric_options(option["options"], f"{prefix}{name}.")


def _options(spec: Dict[str, Any]) -> Dict[str, Any]:
    return {name: option for name, option in spec.items() if name}


def _all_options(spec: Dict[str, Any], prefix: str = "") -> Iterator[str]:
    for name, option in _options(spec).items():
        yield prefix + name
        if option.get("options"):
            yield from _all_options(option["options"], f"{prefix}{name}.")


@pytest.fixture(scope="module")
def modules() -> Dict[str, Tuple[Any, Dict[str, Any]]]:
    loaded = {name: _load(name) for name in MODULES}
    return {name: (module, _argument_spec(module)) for name, module in loaded.items()}


def _bounded(modules) -> List[str]:
    return [name for name, (module, spec) in modules.items() if list(_numeric_options(spec))]


# --- coverage ------------------------------------------------------------------------------------------------

def test_every_numeric_option_of_every_module_has_a_bound_of_its_kind(modules):
    missing, wrong_kind, strangers = [], [], []
    for name, (module, spec) in modules.items():
        numeric = dict(_numeric_options(spec))
        bounds = getattr(module, "BOUNDS", {})
        missing += [f"{name}: {path}" for path in numeric if path not in bounds]
        wrong_kind += [f"{name}: {path} is {kind.__name__}, its Bound {bounds[path].kind.__name__}"
                       for path, kind in numeric.items() if path in bounds and bounds[path].kind is not kind]
        if name != "vllm_plan":   # the planner's table also bounds its own inputs (host_ram_bytes, the CLI's GiB)
            options = set(_all_options(spec))
            strangers += [f"{name}: {path}" for path in bounds if path not in options]
    assert not missing, f"numeric options without a Bound in the module's BOUNDS: {missing}"
    assert not wrong_kind, wrong_kind
    assert not strangers, f"Bounds for options the module does not have: {strangers}"
    assert len(_bounded(modules)) >= 17


def test_the_bounds_are_checked_right_after_the_module_is_built(modules):
    late = []
    for name in _bounded(modules):
        tree = ast.parse((REPO / "library" / f"{name}.py").read_text())
        main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
        body = [statement for statement in main.body if not isinstance(statement, ast.Expr)
                or not isinstance(statement.value, ast.Constant)]
        built = next(i for i, statement in enumerate(body) if isinstance(statement, ast.Assign)
                     and getattr(getattr(statement.value, "func", None), "id", "") == "AnsibleModule")
        after = body[built + 1]
        call = after.value if isinstance(after, ast.Expr) else None
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "check_options"
                and [getattr(arg, "id", None) for arg in call.args[:2]] == ["module", "BOUNDS"]
                and getattr(call.args[2], "value", None) == name):
            late.append(name)
    assert not late, f"modules whose first statement after AnsibleModule(...) is not check_options(module, BOUNDS, " \
                     f"'<name>'): {late}"


# --- the sweep, in-process -----------------------------------------------------------------------------------

def _dummy(option: Dict[str, Any], tmp: str) -> Any:
    if option.get("choices"):
        return option["choices"][0]
    kind = option.get("type", "str")
    if option.get("no_log") and kind == "str":
        # Ansible masks every occurrence of a no_log value in the result: "x" would mask the x of "Fix"
        return "dummy-secret-value"
    if kind == "dict" and option.get("options"):
        return {key: _dummy(sub, tmp) for key, sub in option["options"].items() if sub.get("required")}
    return {"str": "x", "path": os.path.join(tmp, "absent"), "int": 1, "float": 1.0, "bool": False, "dict": {},
            "list": [], "raw": "x", "jsonarg": "{}"}[kind]


def _base_args(spec: Dict[str, Any], tmp: str) -> Dict[str, Any]:
    """Arguments that pass Ansible's own checks (required, required_one_of/together/by), paths in `tmp`."""
    options, rules = _options(spec), spec.get("", {})
    wanted = {key for key, option in options.items() if option.get("required")}
    wanted |= {group[0] for group in rules.get("required_one_of", [])}
    for _ in range(3):
        for group in rules.get("required_together", []):
            wanted |= set(group)
        for key, needed in rules.get("required_by", {}).items():
            if key in wanted:
                wanted |= {needed} if isinstance(needed, str) else set(needed)
    args = {key: _dummy(options[key], tmp) for key in sorted(wanted)}
    for key, option in options.items():   # every path points into the test's directory
        if option.get("type") == "path" and key not in args:
            args[key] = os.path.join(tmp, key)
    return args


def _set(args: Dict[str, Any], path: str, value: Any) -> Dict[str, Any]:
    result = json.loads(json.dumps(args))
    target = result
    *parents, last = path.split(".")
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value
    return result


def _bad_values(bound: Bound) -> List[Any]:
    values: List[Any] = [True, "many"]
    below = bound.low if bound.low_open else bound.low - (1 if bound.kind is int else 0.5)
    if below != bound.unset:
        values.append(int(below) if bound.kind is int else below)
    values.append(int(bound.high) + 1 if bound.kind is int else bound.high * 2 + 1)
    if bound.kind is float:
        values += ["nan", "inf", "-inf"]
    return values


def _run_in_process(module: Any, args: Dict[str, Any]) -> Dict[str, Any]:
    """The module's main() with `args`; stops at its check_options whatever the outcome."""
    real = module.check_options

    def checked(*call_args: Any, **kwargs: Any) -> None:
        real(*call_args, **kwargs)
        raise _PassedBounds

    basic._ANSIBLE_ARGS = json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode()
    basic._ANSIBLE_PROFILE = "legacy"
    module.check_options = checked
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            module.main()
    except _PassedBounds:
        return {"passed_bounds": True}
    except SystemExit:
        pass
    finally:
        module.check_options = real
        basic._ANSIBLE_ARGS = None
    return json.loads(out.getvalue())


def _cases(modules) -> Iterator[Tuple[str, str, Any]]:
    for name in _bounded(modules):
        module, spec = modules[name]
        for path in dict(_numeric_options(spec)):
            for value in _bad_values(module.BOUNDS[path]):
                yield name, path, value


def test_every_bad_value_of_every_bounded_option_fails_naming_it(modules, tmp_path):
    failures, count = [], 0
    for name, path, value in _cases(modules):
        module, spec = modules[name]
        result = _run_in_process(module, _set(_base_args(spec, str(tmp_path)), path, value))
        count += 1
        message = result.get("msg", "")
        own = message.startswith(f"{name}: {path} is ") and "Fix: " in message and result.get("input") == path
        ansibles = path.split(".")[-1] in message and "cannot be converted" in message   # "many" for an int
        if not result.get("failed") or not (own or ansibles):
            failures.append(f"{name} {path}={value!r}: {result}")
    assert not failures, "\n".join(failures[:20])
    assert count > 300
    assert list(tmp_path.iterdir()) == []


def test_the_defaults_and_in_range_values_pass_the_check(modules, tmp_path):
    failures = []
    for name in _bounded(modules):
        module, spec = modules[name]
        base = _base_args(spec, str(tmp_path))
        if "passed_bounds" not in _run_in_process(module, base):
            failures.append(f"{name}: its defaults")
        for path in dict(_numeric_options(spec)):
            bound = module.BOUNDS[path]
            edge = bound.high if bound.kind is int else min(bound.high, bound.low + 0.5)
            if "passed_bounds" not in _run_in_process(module, _set(base, path, edge)):
                failures.append(f"{name}: {path}={edge!r}")
    assert not failures, failures


def test_a_yaml_yes_for_a_float_option_is_refused_though_ansible_makes_it_one():
    bound = {"wait": Bound(float, 0, high=10, low_open=True)}
    assert first_error({"wait": 1.0}, {"wait": 1.0}, bound) is None
    error = first_error({"wait": 1.0}, {"wait": True}, bound)
    assert error is not None and error.message() == (
        "wait is True: it must be a finite number more than 0 and at most 10. Fix: give a value in that range")
    assert first_error({"s": {"w": math.nan}}, {"s": {"w": "nan"}}, {"s.w": Bound(float, 0)}).field == "s.w"
    assert first_error({"s": None}, {}, {"s.w": Bound(float, 0)}) is None


# --- the property, through Ansible -----------------------------------------------------------------------------

def _snapshot(root: Path) -> Dict[str, Tuple[int, int]]:
    seen = {}
    for top in (root, Path("/etc/systemd/system")):
        for path in top.rglob("*") if top.exists() else []:
            stat = path.lstat()
            seen[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return seen


@st.composite
def _bad_value(draw, bound: Bound) -> Any:
    kind = draw(st.sampled_from(["below", "above", "bool", "word"] + (["nan", "inf"] if bound.kind is float else [])))
    if kind == "below":
        floor = bound.low if bound.low_open else bound.low - 1
        value = draw(st.integers(min_value=-10 ** 9, max_value=int(math.floor(floor)))) if bound.kind is int \
            else draw(st.floats(min_value=-1e9, max_value=floor, allow_nan=False))
        return value if value != bound.unset else int(bound.low) - 1
    if kind == "above":
        return draw(st.integers(min_value=int(bound.high) + 1, max_value=int(bound.high) * 4 + 8)) if bound.kind is int \
            else draw(st.floats(min_value=bound.high * 1.001 + 1, max_value=1e300))
    if kind == "nan":
        return "nan"
    if kind == "inf":
        return draw(st.sampled_from(["inf", "-inf"]))
    return True if kind == "bool" else draw(st.sampled_from(["yes", "lots", "32 GiB"]))


class _Specs(dict):
    def __repr__(self) -> str:   # hypothesis prints the test's arguments: names, not whole specs
        return f"<bounds and specs of {', '.join(self)}>"


@pytest.fixture(scope="module")
def bounded_specs(modules):
    return _Specs({name: (modules[name][0].BOUNDS, modules[name][1]) for name in _bounded(modules)})


# Two playbooks of one bad task per module (~15 s each); no shrinking: the report names every wrong task already.
@settings(max_examples=2, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_generated_bad_values_fail_every_module_through_ansible_and_change_nothing(bounded_specs, tmp_path_factory,
                                                                                   data):
    tmp = tmp_path_factory.mktemp("bounds")
    cases = []
    for name, (bounds, spec) in sorted(bounded_specs.items()):
        path = data.draw(st.sampled_from(sorted(p for p, _ in _numeric_options(spec))), label=name)
        value = data.draw(_bad_value(bounds[path]), label=f"{name} {path}")
        cases.append((name, path, _set(_base_args(spec, str(tmp / "host")), path, value)))
    tasks = [{"name": f"{name} {path}", name: args, "register": f"r{n}", "ignore_errors": True}
             for n, (name, path, args) in enumerate(cases)]
    tasks.append({"name": "Results", "ansible.builtin.copy": {
        "content": "{{ [" + ", ".join(f"r{n}" for n in range(len(cases))) + "] | to_json }}",
        "dest": str(tmp / "results.json"), "mode": "0600"}})
    play = [{"name": "Bad values", "hosts": "localhost", "connection": "local", "gather_facts": False,
             "tasks": tasks}]
    (tmp / "play.yml").write_text(json.dumps(play))
    (tmp / "host").mkdir()
    before = _snapshot(tmp / "host")
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    run = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", "localhost,", str(tmp / "play.yml")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((tmp / "results.json").read_text())
    wrong = []
    for (name, path, args), result in zip(cases, results):
        message = result.get("msg", "")
        named = message.startswith(f"{name}: {path} is ") or (path.split(".")[-1] in message
                                                               and "cannot be converted" in message)
        if not result.get("failed") or not named or "Traceback" in json.dumps(result) \
                or "MODULE FAILURE" in message:
            wrong.append(f"{name} {path}: {textwrap.shorten(json.dumps(result), 400)}")
    assert not wrong, "\n".join(wrong)
    assert _snapshot(tmp / "host") == before


def test_the_documented_table_is_the_modules_bounds():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "module_bounds.py"), "--check"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert "| `vllm_warmup` | `settle.window` | a whole number at least 2 and at most 10000" in \
        (REPO / "docs" / "inputs.md").read_text()
