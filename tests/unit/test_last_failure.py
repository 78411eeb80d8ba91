"""bin/last-failure repeats the last failure of a Molecule log at the end of `make test`'s output."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "bin" / "last-failure"

ESC = "\x1b"
LOG = f"""\
{ESC}[36mINFO    {ESC}[0m {ESC}[32mfleet{ESC}[0m ➜ converge: Executing
  │ TASK [Refuse a BF16 model] ***
  │ fatal: [node1]: FAILED! =>
  │     changed: false
  │     msg: 'expected refusal'
  │ ...ignoring
  │ TASK [Assert that the roll lost nothing] ***
  │ {ESC}[31mfatal: [localhost]: FAILED! => {ESC}[0m
  │     assertion: load.failed == 0
  │     changed: false
  │     evaluated_to: false
  │     msg: 'roll to B: sent 300, failed 2'
  │ PLAY RECAP ***
  │ localhost : ok=3 failed=1
{ESC}[31mfleet ➜ side_effect: Executed: Failed{ESC}[0m
"""

# The last lines of a run that failed outside any play: the block ends before Molecule's summary.
TAIL = """\
  │ fatal: [localhost]: FAILED! =>
  │     msg: boom

DETAILS
fleet ➜ side_effect: Executed: Failed
SCENARIO RECAP
fleet : failed=1
"""


def run(tmp_path, text, *extra):
    log = tmp_path / "molecule.log"
    log.write_text(text, encoding="utf-8")
    done = subprocess.run([sys.executable, str(TOOL), str(log), *extra], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_last_failed_task_is_printed_without_colours(tmp_path):
    out = run(tmp_path, LOG)
    assert out[0].startswith("== the last failure in ")
    assert out[1:] == ["fatal: [localhost]: FAILED! => ", "    assertion: load.failed == 0", "    changed: false",
                       "    evaluated_to: false", "    msg: 'roll to B: sent 300, failed 2'"]


def test_the_block_ends_before_molecules_summary(tmp_path):
    assert run(tmp_path, TAIL)[1:] == ["fatal: [localhost]: FAILED! =>", "    msg: boom"]


def test_a_long_block_keeps_its_header_and_message(tmp_path):
    traceback = "".join(f"  │         File \"x.py\", line {n}\n" for n in range(50))
    text = f"  │ fatal: [node1]: FAILED! =>\n  │     module_stderr: |-\n{traceback}  │     msg: 'it broke'\n  │     rc: 1\n"
    out = run(tmp_path, text, "--lines", "6")
    assert out[1:] == ["fatal: [node1]: FAILED! =>", "    msg: 'it broke'", "    rc: 1"]


def test_pytest_failures_from_a_testinfra_verify(tmp_path):
    text = ("  │ __________ test_replicas_run[node1] __________\n  │     def test_replicas_run(host):\n"
            "  │ E   AssertionError: vllm-0 is not running\n  │ ===== 1 failed in 3.1s =====\n")
    out = run(tmp_path, text)
    assert out[1:] == ["__________ test_replicas_run[node1] __________", "    def test_replicas_run(host):",
                       "E   AssertionError: vllm-0 is not running"]


def test_a_log_without_failures_prints_nothing(tmp_path):
    assert run(tmp_path, "  │ TASK [x] ***\n  │ ok: [node1]\n") == []
