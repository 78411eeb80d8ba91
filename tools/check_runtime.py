#!/usr/bin/env python3
"""make check-runtime: install each locked vLLM release into fresh venvs and check it really runs here.

  check_runtime.py [--release V]... [--python X.Y]... [--work-dir DIR] [--fresh] [--index-url URL]
                   [--interpreter X.Y=PATH]... [--report FILE]

For each release (default: the Volta default of data/vllm-releases.yml, and 0.5.4) and each Python (default
3.10 and 3.11), with no GPU needed:
  1. the lock data/locks/vllm-<V>-py<X.Y>.txt must exist; an incomplete one (`# missing:` in its header, e.g.
     0.5.4's pyairports) is reported as skipped, not failed;
  2. a venv DIR/vllm-<V>-py<X.Y> is made with `python -m venv` and the lock installed with the runtime role's
     own argv (module_utils/revive_venv.py pip_install_argv: --isolated --require-hashes --only-binary :all:
     --no-deps); a venv whose install succeeded for the same lock bytes is reused unless --fresh;
  3. `pip check`, `import vllm` (its __version__ must be V), `python -m vllm.entrypoints.openai.api_server
     --help` (exit 0; lines and options counted);
  4. every replica argv `bin/revive plan` produces for the 20B fixture model on each lab/profiles/*.json
     (release pinned with --vllm-version) is parsed by the release's own parser, built as the server builds
     it, and judged by the release table too (module_utils/revive_releases.py validate_argv); the two must
     agree. A planner refusal is printed, not failed.
Exit 0 when nothing failed. Downloads about 7.6 GB per Python on the first run (pip's cache keeps them).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import glob
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PYTHONS = ("3.10", "3.11")
EXTRA_RELEASES = ("0.5.4",)               # checked where its lock is complete
DEFAULT_WORK_DIR = "/var/tmp/revive-check"
PUBLIC_INDEX = "https://pypi.org/simple"
MARKER = ".check-runtime.json"            # written after a successful install: {lock_sha256, seconds}
MODEL_FIXTURE = "internlm2-chat-20b"      # the notes' 20B, as tests/unit/test_revive_plan_cli.py plans it
INSTALL_TIMEOUT_S = 3 * 3600
STEP_TIMEOUT_S = 900


# ---------------------------------------------------------------------------------------------------------
# Under the release venv's interpreter (Python >= 3.9, stdlib + vllm): `check_runtime.py _parse-argv IN OUT`
# ---------------------------------------------------------------------------------------------------------

def _parse_in_venv(source: str, out: str) -> int:
    """Parse every argv of `source` (JSON list of {label, argv}) with the server's own parser."""
    from vllm.entrypoints.openai import cli_args

    # built as tools/release_facts.py builds it: the __main__ block's parser, on a CUDA platform stand-in where
    # the release cannot build it without a GPU (0.9.x); this script's directory is sys.path[0]
    from release_facts import build_server_parser

    with open(source, encoding="utf-8") as handle:
        cases = json.load(handle)
    results = []
    for case in cases:
        # a fresh parser per argv, as each server process builds its own (argparse actions keep no state)
        parser, _ = build_server_parser()
        stderr = io.StringIO()
        error = None
        try:
            with contextlib.redirect_stderr(stderr):
                namespace = parser.parse_args(case["argv"])
                validate = getattr(cli_args, "validate_parsed_serve_args", None)  # 0.6 on; 0.5.4 has none
                if validate is not None:
                    validate(namespace)
        except SystemExit as exc:  # argparse's parser.error: usage + message on stderr, exit 2
            lines = [line for line in stderr.getvalue().strip().splitlines() if line.strip()]
            error = f"exit {exc.code}: {lines[-1] if lines else 'no message'}"
        except Exception as exc:  # validate_parsed_serve_args raises TypeError/ValueError
            error = f"{type(exc).__name__}: {exc}"
        results.append({"label": case["label"], "error": error})
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(results, handle)
    return 0


# ---------------------------------------------------------------------------------------------------------
# On the controller (.venv)
# ---------------------------------------------------------------------------------------------------------

class CheckError(Exception):
    """A step could not run at all (no interpreter, no lock file, a tool that is missing)."""


@dataclass
class Report:
    out: List[TextIO]
    failures: List[str] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)

    def line(self, text: str = "") -> None:
        for stream in self.out:
            stream.write(text + "\n")
            stream.flush()

    def fail(self, what: str, detail: str = "") -> None:
        self.failures.append(what)
        self.line(f"  FAIL      {what}" + (f"\n{_indent(detail, 12)}" if detail else ""))


def _indent(text: str, width: int) -> str:
    return "\n".join(" " * width + line for line in text.rstrip().splitlines())


def _tail(text: str, lines: int = 15) -> str:
    kept = [line for line in (text or "").strip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:]) if kept else "(no output)"


def _use_module_utils() -> None:
    sys.path.insert(0, str(REPO / "bin"))
    from revive_cli import use_module_utils

    use_module_utils()


def find_interpreter(minor: str, given: Dict[str, str]) -> str:
    """The interpreter for Python `minor`: --interpreter X.Y=PATH, else pyenv's newest X.Y.*."""
    if minor in given:
        path = given[minor]
        if not os.access(path, os.X_OK):
            raise CheckError(f"--interpreter {minor}={path}: not an executable file")
        return path
    root = os.path.expanduser(os.environ.get("PYENV_ROOT", "~/.pyenv"))
    found = sorted(glob.glob(os.path.join(root, "versions", f"{minor}.*", "bin", "python")),
                   key=lambda p: [int(n) for n in re.findall(r"\d+", p.split("/versions/")[1].split("/")[0])])
    found = [p for p in found if re.fullmatch(rf"{re.escape(minor)}\.\d+", p.split("/versions/")[1].split("/")[0])]
    if not found:
        raise CheckError(f"Python {minor} not found under {root}/versions/{minor}.*; install it (`pyenv install "
                         f"{minor}`) or pass --interpreter {minor}=/path/to/python{minor}")
    return found[-1]


def run(argv: Sequence[str], timeout: int = STEP_TIMEOUT_S, **kwargs: Any) -> subprocess.CompletedProcess:
    # no PIP_* / PYTHON* settings of this shell leak into the venv's tools (the role runs them bare too)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=kwargs.pop("cwd", tempfile.gettempdir()), **kwargs)


def lock_path(release: str, minor: str) -> Path:
    return REPO / "data" / "locks" / f"vllm-{release}-py{minor}.txt"


def read_lock(path: Path) -> Any:
    from ansible.module_utils.revive_lockfile import LockError, parse_lock

    if not path.exists():
        raise CheckError(f"{path.relative_to(REPO)} does not exist; generate it with `bin/revive lock "
                         f"{path.name[len('vllm-'):].rsplit('-py', 1)[0]} --python {path.stem.rsplit('-py', 1)[1]}`")
    try:
        return parse_lock(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    except LockError as exc:
        raise CheckError(f"{path.relative_to(REPO)} is not a valid lock: {exc}") from exc


def ensure_venv(report: Report, interpreter: str, venv: Path, lock: Path, index_url: str, fresh: bool) -> bool:
    """Make (or reuse) the venv with the lock installed as the runtime role installs it."""
    from ansible.module_utils.revive_venv import Source, pip_install_argv

    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    marker = venv / MARKER
    if not fresh and marker.exists():
        try:
            recorded = json.loads(marker.read_text(encoding="utf-8"))
        except ValueError:
            recorded = {}
        if recorded.get("lock_sha256") == digest and recorded.get("index_url") == index_url:
            report.line(f"  venv      {venv}: reused (installed {recorded.get('installed_at')} in "
                        f"{recorded.get('seconds')} s from this lock; --fresh to rebuild)")
            return True
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    made = run([interpreter, "-m", "venv", str(venv)])
    if made.returncode != 0:
        report.fail(f"{venv}: `{interpreter} -m venv` failed", _tail(made.stderr or made.stdout))
        return False
    argv = pip_install_argv(str(venv), Source("index", index_url), str(lock))
    log = venv.with_name(venv.name + ".install.log")
    report.line(f"  install   {' '.join(argv[1:])}")
    report.line(f"            (pip's output: {log})")
    started = time.monotonic()
    with open(log, "w", encoding="utf-8") as handle:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
        proc = subprocess.run(argv, stdout=handle, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S, env=env,
                              cwd=tempfile.gettempdir())
    seconds = round(time.monotonic() - started)
    if proc.returncode != 0:
        report.fail(f"pip install of {lock.relative_to(REPO)} into {venv} (exit {proc.returncode}, {seconds} s)",
                    _tail(log.read_text(encoding="utf-8", errors="replace")))
        return False
    installed = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines()
                 if line.startswith("Successfully installed")]
    count = len(installed[-1].split()) - 2 if installed else 0
    report.line(f"  venv      {venv}: created, {count} distributions installed in {seconds} s")
    marker.write_text(json.dumps({"lock_sha256": digest, "index_url": index_url, "seconds": seconds,
                                  "installed_at": datetime.datetime.now().isoformat(timespec="seconds")}) + "\n",
                      encoding="utf-8")
    return True


IMPORT_PROBE = (
    "import importlib.metadata as m, vllm\n"
    "print('REVIVE-CHECK ' + ' '.join(f'{d}={m.version(d)}' for d in ('torch', 'xformers', 'transformers')))\n"
    "print('REVIVE-CHECK-VLLM ' + vllm.__version__)\n"
)


NO_DEVICE_ERROR = "Failed to infer device type"  # tools/release_facts.py NO_DEVICE_ERROR
HELP_ON_STAND_IN = (
    f"import runpy, sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); import release_facts; "
    "release_facts.stand_in_cuda_platform(); sys.argv = ['api_server', '--help']; "
    "runpy.run_module('vllm.entrypoints.openai.api_server', run_name='__main__')"
)


def check_venv(report: Report, release: str, venv: Path) -> bool:
    """pip check, import vllm, the server's --help. True when all three pass."""
    python = str(venv / "bin" / "python")
    ok = True
    pip = run([python, "-m", "pip", "check", "--disable-pip-version-check"])
    if pip.returncode == 0:
        report.line(f"  pip check ok: {_tail(pip.stdout, 1)}")
    else:
        ok = False
        report.fail(f"pip check in {venv}", _tail(pip.stdout + pip.stderr))
    probe = run([python, "-c", IMPORT_PROBE])
    found = re.search(r"^REVIVE-CHECK-VLLM (\S+)$", probe.stdout, re.MULTILINE)
    others = re.search(r"^REVIVE-CHECK (.+)$", probe.stdout, re.MULTILINE)
    if probe.returncode != 0 or not found:
        ok = False
        report.fail(f"import vllm in {venv} (exit {probe.returncode})", _tail(probe.stdout + probe.stderr))
    elif found.group(1) != release:
        ok = False
        report.fail(f"import vllm in {venv}: __version__ {found.group(1)}, the lock is for {release}")
    else:
        warnings = [line for line in (probe.stdout + probe.stderr).splitlines() if "WARNING" in line]
        report.line(f"  import    vllm.__version__ {found.group(1)} ({others.group(1) if others else ''}); "
                    f"{len(warnings)} warning line(s) without a GPU"
                    + (f", first: {warnings[0].split(']', 1)[-1].strip()[:100]}" if warnings else ""))
    helped = run([python, "-m", "vllm.entrypoints.openai.api_server", "--help"])
    how = ""
    if helped.returncode != 0 and NO_DEVICE_ERROR in helped.stdout + helped.stderr:
        # 0.9.x cannot build its parser without a GPU (DeviceConfig needs a device type): again on the stand-in
        helped = run([python, "-c", HELP_ON_STAND_IN])
        how = f" on the CUDA platform stand-in (plain --help without a GPU: RuntimeError '{NO_DEVICE_ERROR}')"
    if helped.returncode == 0:
        options = len(re.findall(r"^\s{2}(-{1,2}[A-Za-z])", helped.stdout, re.MULTILINE))
        report.line(f"  --help    exit 0, {len(helped.stdout.splitlines())} lines on stdout, {options} option "
                    f"lines{how}")
    else:
        ok = False
        report.fail(f"api_server --help in {venv} (exit {helped.returncode})", _tail(helped.stdout + helped.stderr))
    return ok


@dataclass
class Planned:
    profile: str
    refusal: Optional[str] = None           # the planner refused: its message
    replicas: List[Tuple[str, List[str]]] = field(default_factory=list)  # (replica name, argv)


def plan_profiles(release: str, model_dir: str) -> List[Planned]:
    """What `bin/revive plan --json` gives on each lab profile, with the release pinned."""
    results = []
    for path in sorted((REPO / "lab" / "profiles").glob("*.json")):
        proc = run([sys.executable, str(REPO / "bin" / "revive"), "plan", "--model",
                    os.path.join(model_dir, "config.json"), "--gpus", path.stem, "--vllm-version", release, "--json"],
                   cwd=str(REPO))
        planned = Planned(path.stem)
        if proc.returncode == 1:
            planned.refusal = _tail(proc.stderr, 3)
        elif proc.returncode != 0:
            raise CheckError(f"bin/revive plan on {path.stem} failed (exit {proc.returncode}): {_tail(proc.stderr, 5)}")
        else:
            plan = json.loads(proc.stdout)
            if plan.get("vllm_version") != release:
                raise CheckError(f"bin/revive plan on {path.stem} planned {plan.get('vllm_version')}, not {release}")
            planned.replicas = [(r["name"], list(r["args"])) for r in plan["replicas"]]
        results.append(planned)
    return results


def check_argvs(report: Report, release: str, venv: Path, plans: List[Planned]) -> None:
    from ansible.module_utils.revive_releases import load_release_file

    table = load_release_file(str(REPO / "data" / "vllm-releases.yml")).release(release)
    cases = [{"label": f"{p.profile} {name}", "argv": argv} for p in plans for name, argv in p.replicas]
    with tempfile.TemporaryDirectory(prefix="check-runtime-") as tmp:
        source, out = os.path.join(tmp, "argv.json"), os.path.join(tmp, "result.json")
        with open(source, "w", encoding="utf-8") as handle:
            json.dump(cases, handle)
        proc = run([str(venv / "bin" / "python"), str(Path(__file__).resolve()), "_parse-argv", source, out])
        if proc.returncode != 0 or not os.path.exists(out):
            report.fail(f"the argv parse script in {venv} (exit {proc.returncode})", _tail(proc.stdout + proc.stderr))
            return
        with open(out, encoding="utf-8") as handle:
            verdicts = {r["label"]: r["error"] for r in json.load(handle)}
    for planned in plans:
        if planned.refusal is not None:
            report.line(f"  argv      {planned.profile}: refused by the planner (not a parser failure): "
                        f"{' '.join(planned.refusal.split())[:300]}")
            continue
        for name, argv in planned.replicas:
            label = f"{planned.profile} {name}"
            real = verdicts.get(label, "no verdict")
            errors = table.validate_argv(argv)
            said = "table: ok" if not errors else f"table: {'; '.join(errors)}"
            if real is None and not errors:
                report.line(f"  argv      {label}: parsed by vLLM {release}'s parser ({len(argv)} words; {said})")
            elif real is None:
                report.fail(f"argv {label}: the real parser accepts it, the release table refuses it ({said})",
                            " ".join(argv))
            else:
                report.fail(f"argv {label}: vLLM {release}'s parser refuses it: {real} ({said})", " ".join(argv))


def default_releases() -> List[str]:
    from ansible.module_utils.revive_releases import load_release_file

    data = load_release_file(str(REPO / "data" / "vllm-releases.yml"))
    volta, _ = data.default_release((7, 0))
    return [volta] + [r for r in EXTRA_RELEASES if r != volta and r in data.releases]


def main(argv: Sequence[str]) -> int:
    if len(argv) == 3 and argv[0] == "_parse-argv":  # under the release venv's interpreter
        return _parse_in_venv(argv[1], argv[2])
    parser = argparse.ArgumentParser(prog="tools/check_runtime.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", action="append", help="vLLM release to check (repeatable; default: the Volta "
                                                           "default and 0.5.4)")
    parser.add_argument("--python", action="append", help="Python minor version (repeatable; default 3.10, 3.11)")
    parser.add_argument("--interpreter", action="append", default=[], metavar="X.Y=PATH",
                        help="the interpreter for a Python minor version (default: pyenv's newest X.Y.*)")
    parser.add_argument("--work-dir", default=DEFAULT_WORK_DIR, help=f"where the venvs go (default {DEFAULT_WORK_DIR})")
    parser.add_argument("--fresh", action="store_true", help="rebuild venvs even where an install succeeded")
    parser.add_argument("--index-url", default=PUBLIC_INDEX, help="the index pip installs from (default PyPI)")
    parser.add_argument("--report", help="also write the report to this file")
    args = parser.parse_args(argv)
    given = {}
    for item in args.interpreter:
        minor, sep, path = item.partition("=")
        if not sep or not re.fullmatch(r"3\.\d+", minor):
            parser.error(f"--interpreter {item!r}: expected X.Y=PATH, e.g. 3.10=/usr/bin/python3.10")
        given[minor] = path
    _use_module_utils()
    streams: List[TextIO] = [sys.stdout]
    handle = open(args.report, "w", encoding="utf-8") if args.report else None
    if handle:
        streams.append(handle)
    report = Report(streams)
    try:
        return _check_all(report, args, given)
    finally:
        if handle:
            handle.close()


def _check_all(report: Report, args: argparse.Namespace, given: Dict[str, str]) -> int:
    releases = args.release or default_releases()
    pythons = args.python or list(DEFAULT_PYTHONS)
    work = Path(args.work_dir)
    head = run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], cwd=str(REPO)).stdout.strip()
    report.line(f"check-runtime {datetime.datetime.now().isoformat(timespec='seconds')} on {os.uname().nodename}, "
                f"repository at {head or 'unknown'} (working tree may differ)")
    report.line(f"  releases {', '.join(releases)}; Pythons {', '.join(pythons)}; work dir {work}; index "
                f"{args.index_url}")
    model_dir = str(work / "models" / "chat-20b-fp16")
    made = run([sys.executable, str(REPO / "tests" / "fixtures" / "models.py"), "write", MODEL_FIXTURE, model_dir,
                "--config-only", "--dtype", "F16"], cwd=str(REPO))
    if made.returncode != 0:
        report.fail(f"writing the {MODEL_FIXTURE} fixture to {model_dir}", _tail(made.stderr))
        return 1
    report.line(f"  model    {MODEL_FIXTURE} (FP16, config only) written by tests/fixtures/models.py to {model_dir}")
    for release in releases:
        plans: Optional[List[Planned]] = None
        for minor in pythons:
            report.line()
            report.line(f"== vLLM {release} on Python {minor}")
            lock = lock_path(release, minor)
            try:
                parsed = read_lock(lock)
                if not parsed.complete:
                    why = "; ".join(parsed.header.get("missing", []))
                    report.skipped.append(f"{release} py{minor}")
                    report.line(f"  SKIPPED   {lock.relative_to(REPO)} is incomplete (missing: {why}): PyPI cannot "
                                "supply it, so there is nothing to install from the public index (not a failure; "
                                f"supply the file and `bin/revive lock {release} --supply DIR`)")
                    continue
                interpreter = find_interpreter(minor, given)
                version = run([interpreter, "-c", "import platform; print(platform.python_version())"]).stdout.strip()
                report.line(f"  python    {interpreter} ({version})")
                report.line(f"  lock      {lock.relative_to(REPO)}: {len(parsed.entries)} distributions, complete")
                venv = work / f"vllm-{release}-py{minor}"
                if not ensure_venv(report, interpreter, venv, lock, args.index_url, args.fresh):
                    continue
                if not check_venv(report, release, venv):
                    continue
                if plans is None:
                    plans = plan_profiles(release, model_dir)
                check_argvs(report, release, venv, plans)
            except CheckError as exc:
                report.fail(str(exc))
            except subprocess.TimeoutExpired as exc:
                report.fail(f"{' '.join(map(str, exc.cmd[:6]))} ran past {exc.timeout} s")
    report.line()
    if report.failures:
        report.line(f"RESULT: FAIL ({len(report.failures)} failure(s)"
                    + (f"; skipped: {', '.join(report.skipped)}" if report.skipped else "") + ")")
        for failure in report.failures:
            report.line(f"  - {failure}")
        return 1
    report.line("RESULT: PASS" + (f" (skipped: {', '.join(report.skipped)})" if report.skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
