"""bin/molecule-streams: every scenario exactly once, streams really side by side, a failure ends its stream only,
every log printed and joined, the failed scenario's last failed task repeated at the end."""
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bin" / "molecule-streams"

# A stand-in for `molecule test -s NAME`: a and b each wait for the other's mark (only streams that run at the same
# time get past that), bad fails the way an Ansible task does.
FAKE = r"""#!/bin/sh
name="$3"
dir="$(dirname "$0")"
echo "molecule $1 $2 $name"
touch "$dir/started-$name"
case "$name" in
  a) other=b ;;
  b) other=a ;;
  bad) echo 'fatal: [node1]: FAILED! => {"changed": false, "msg": "the reason it broke"}'; exit 2 ;;
  *) exit 0 ;;
esac
i=0
while [ ! -e "$dir/started-$other" ]; do
  i=$((i + 1)); [ "$i" -gt 200 ] && { echo "$other never started beside $name"; exit 3; }; sleep 0.1
done
"""


def project(tmp_path, *names):
    for name in names:
        (tmp_path / "molecule" / name).mkdir(parents=True)
        (tmp_path / "molecule" / name / "molecule.yml").write_text("---\n")
    (tmp_path / "molecule" / "resources").mkdir()  # shared playbooks, no molecule.yml: not a scenario
    fake = tmp_path / "fake-molecule"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    return fake


def run(tmp_path, fake, *streams):
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(tmp_path), "--molecule", str(fake), *streams],
                          capture_output=True, text=True, check=False, timeout=120)


def test_streams_run_side_by_side_and_a_failure_ends_only_its_stream(tmp_path):
    fake = project(tmp_path, "a", "b", "bad", "c")
    done = run(tmp_path, fake, "a,bad,c", "b")
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "stream 1: a passed" in out and "stream 2: b passed" in out  # each waited for the other: side by side
    assert "stream 1: bad FAILED (exit 2)" in out and "stream 1: not run after the failure: c" in out
    assert not (tmp_path / "started-c").exists()
    assert "molecule test -s a" in (tmp_path / ".molecule-a.log").read_text()
    joined = (tmp_path / ".molecule.log").read_text()
    assert [line.split(" (")[0] for line in joined.splitlines() if line.startswith("=====")] == [
        "===== molecule test -s a", "===== molecule test -s bad", "===== molecule test -s b"]
    tail = (tmp_path / ".molecule-tail.txt").read_text()
    assert tail.startswith("molecule streams: a passed (")
    assert "bad FAILED" in tail and "----- last failure of bad (.molecule-bad.log):" in tail
    assert "the reason it broke" in tail
    assert out.endswith(tail)


def test_every_scenario_must_be_named_once(tmp_path):
    fake = project(tmp_path, "a", "b", "c")
    done = run(tmp_path, fake, "a,b", "b,x")
    assert done.returncode == 2
    assert "named more than once: b" in done.stderr
    assert "no such scenario (molecule/<name>/molecule.yml): x" in done.stderr
    assert "not in any stream: c - add each to a stream" in done.stderr
    assert not list(tmp_path.glob("started-*")), "nothing runs after a refusal"


def test_all_passing_exits_0(tmp_path):
    fake = project(tmp_path, "a", "b", "c")
    done = run(tmp_path, fake, "a,c", "b")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "molecule streams: a passed" in done.stdout and "FAILED" not in done.stdout


def test_a_step_runs_in_its_stream_beside_the_scenarios_and_its_failure_is_repeated(tmp_path):
    """Steps (the unit tests, ansible-lint) are named like scenarios and run with bash in the project; a failed
    step's last lines end the output, and a failure ends only the step's stream."""
    fake = project(tmp_path, "a", "b")
    steps = ["--step", "unit=touch started-unit; echo '1 failed, 9 passed'; exit 4",
             "--step", "lint=touch started-lint"]
    done = run(tmp_path, fake, *steps, "a", "b", "unit,lint")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "stream 3: unit FAILED (exit 4)" in done.stdout and "stream 3: not run after the failure: lint" in done.stdout
    assert "stream 1: a passed" in done.stdout and "stream 2: b passed" in done.stdout
    assert (tmp_path / "started-unit").exists() and not (tmp_path / "started-lint").exists()
    assert (tmp_path / ".step-unit.log").read_text() == "1 failed, 9 passed\n"
    joined = (tmp_path / ".molecule.log").read_text()
    assert "===== step unit: touch started-unit;" in joined
    tail = (tmp_path / ".molecule-tail.txt").read_text()
    assert "----- last 40 lines of step unit (.step-unit.log):\n1 failed, 9 passed\n" in tail


def test_steps_are_checked_like_scenarios(tmp_path):
    fake = project(tmp_path, "a", "b")
    done = run(tmp_path, fake, "--step", "a=true", "--step", "lint=true", "--step", "lint=false", "--step", "bad",
               "a,b")
    assert done.returncode == 2
    assert "--step lint: defined twice" in done.stderr and "--step 'bad': give NAME=COMMAND" in done.stderr
    done = run(tmp_path, fake, "--step", "a=true", "--step", "lint=true", "a,b")
    assert done.returncode == 2
    assert "a step named like a scenario: a - rename the step" in done.stderr
    assert "not in any stream: lint - add each to a stream" in done.stderr
    assert not list(tmp_path.glob("started-*")), "nothing runs after a refusal"
