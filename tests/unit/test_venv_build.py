"""ensure_venv against real pip: a wheelhouse of tiny wheels built here, venvs in tmp_path.

`python -m venv` with pip costs seconds, so most tests clone one venv made per session (a venv's
interpreter finds its prefix from its own location; pip runs as `bin/python -m pip`, so a clone works).
test_first_build_with_real_python_m_venv runs the real creation end to end.
"""
from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from ansible.module_utils.revive_venv import MARKER, Source, VenvError, VenvSpec, ensure_venv

PYTHON = sys.executable


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(wheelhouse: Path, name: str, version: str, code: str, requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel (PEP 427) holding one package `name` with `code` as its __init__.py."""
    dist_info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + \
        "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{name}/__init__.py": code.encode(),
        f"{dist_info}/METADATA": metadata.encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: revive-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},{record_hash(data)},{len(data)}\n" for path, data in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    wheel = wheelhouse / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> Path:
    house = tmp_path_factory.mktemp("wheelhouse")
    make_wheel(house, "tinydep", "2.0", "__version__ = '2.0'\n")
    make_wheel(house, "tinypkg", "1.0+sim", "import tinydep\n__version__ = '1.0+sim'\n", requires=("tinydep==2.0",))
    make_wheel(house, "tinypkg", "1.1", "__version__ = '1.1'\n")
    make_wheel(house, "liar", "3.0", "__version__ = '2.9'\n")
    make_wheel(house, "broken", "1.0", "raise ImportError('needs libcuda.so.1')\n")
    return house


class Runner:
    """subprocess runner that records argv; `python -m venv` clones the session template when given one."""

    def __init__(self, template: Path | None = None):
        self.template = template
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(argv)
        if self.template is not None and argv[1:3] == ["-m", "venv"]:
            shutil.copytree(self.template, argv[3], symlinks=True, dirs_exist_ok=True)
            return 0, "", ""
        proc = subprocess.run(argv, capture_output=True, text=True)
        return proc.returncode, proc.stdout, proc.stderr

    def pip_installs(self) -> list[list[str]]:
        return [argv for argv in self.calls if argv[1:4] == ["-m", "pip", "install"]]


@pytest.fixture(scope="session")
def template(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("template") / "venv"
    subprocess.run([PYTHON, "-m", "venv", str(path)], check=True)
    return path


def wheel_for(wheelhouse: Path, pin: str) -> tuple[Path | None, list[str]]:
    """The wheel of `name==version` in the wheelhouse (PEP 440: a local label is allowed) and its exact deps."""
    name, version = pin.split("==")
    for wheel in sorted(wheelhouse.glob(f"{name}-*.whl")) if wheelhouse.is_dir() else []:
        if wheel.name.split("-")[1].split("+")[0] == version.split("+")[0]:
            with zipfile.ZipFile(wheel) as archive:
                metadata = next(archive.read(n).decode() for n in archive.namelist() if n.endswith("/METADATA"))
            return wheel, [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist")]
    return None, []


def auto_lock(wheelhouse: Path, packages, dest: Path) -> Path:
    """A hash lock for `packages` and their dependencies from the wheelhouse, as `bin/revive lock` writes one; a
    pin with no wheel gets a hash nothing matches (the install must then fail)."""
    lines, todo, seen = [], list(packages), set()
    while todo:
        pin = todo.pop(0)
        if pin in seen:
            continue
        seen.add(pin)
        wheel, requires = wheel_for(wheelhouse, pin)
        if wheel is None:
            lines.append(f"{pin} --hash=sha256:{'0' * 64}")
            continue
        version = wheel.name.split("-")[1]
        lines.append(f"{pin.split('==')[0]}=={version} --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}")
        todo += requires
    dest.write_text("\n".join(lines) + "\n")
    return dest


def spec(path: Path, wheelhouse: Path, packages=("tinypkg==1.0",), lock=None, **kwargs) -> VenvSpec:
    lock = lock or str(auto_lock(wheelhouse, packages, path.parent / f"lock-{'-'.join(packages)}.txt"))
    return VenvSpec(path=str(path), python=PYTHON, packages=list(packages), lock=lock,
                    source=Source("wheelhouse", wheelhouse=str(wheelhouse)), **kwargs)


def test_first_build_with_real_python_m_venv(tmp_path, wheelhouse):
    run = Runner()
    result = ensure_venv(spec(tmp_path / "venv", wheelhouse, verify_import="tinypkg"), run, False, "node1")
    assert (result.changed, result.action) == (True, "create")
    assert result.installed == {"tinypkg": "1.0+sim"}
    assert result.distributions["tinydep"] == "2.0"  # the dependency comes from the lock, not from resolution
    assert (result.import_version, result.local_label) == ("1.0+sim", "sim")
    assert run.calls[1] == [PYTHON, "-m", "venv", str(tmp_path / "venv")]
    assert run.pip_installs() == [[str(tmp_path / "venv/bin/python"), "-m", "pip", "install", "--isolated",
                                   "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
                                   "--no-index", "--find-links", str(wheelhouse), "--require-hashes",
                                   "--only-binary", ":all:", "--no-deps", "-r",
                                   str(tmp_path / "lock-tinypkg==1.0.txt")]]
    marker = json.loads((tmp_path / "venv" / MARKER).read_text())
    assert marker["pins"] == ["tinypkg==1.0"]
    assert marker["installed"] == {"tinypkg": "1.0+sim"}


def test_a_second_run_leaves_the_venv_alone(tmp_path, wheelhouse, template):
    ensure_venv(spec(tmp_path / "venv", wheelhouse), Runner(template), False, "node1")
    marker_before = (tmp_path / "venv" / MARKER).stat().st_mtime_ns
    run = Runner(template)
    again = ensure_venv(spec(tmp_path / "venv", wheelhouse, verify_import="tinypkg"), run, False, "node1")
    assert (again.changed, again.action, again.reason) == (False, "unchanged", "installed versions match the pins")
    assert again.installed == {"tinypkg": "1.0+sim"}
    assert again.import_version == "1.0+sim"
    assert run.pip_installs() == []
    assert (tmp_path / "venv" / MARKER).stat().st_mtime_ns == marker_before


def test_check_mode_reports_a_create_and_touches_nothing(tmp_path, wheelhouse, template):
    run = Runner(template)
    result = ensure_venv(spec(tmp_path / "venv", wheelhouse), run, True, "node1")
    assert (result.changed, result.action) == (True, "create")
    assert result.installed == {"tinypkg": None}
    assert not (tmp_path / "venv").exists()
    assert all(argv[1:3] != ["-m", "venv"] for argv in run.calls)


def test_a_failed_install_leaves_no_marker_then_is_rebuilt_and_never_used(tmp_path, wheelhouse, template):
    path = tmp_path / "venv"
    with pytest.raises(VenvError) as failed:
        ensure_venv(spec(path, wheelhouse, packages=("tinypkg==9.9",)), Runner(template), False, "node1")
    assert (f"pip could not install the lock {tmp_path / 'lock-tinypkg==9.9.txt'} (tinypkg==9.9) into {path} on node1 "
            f"from wheelhouse {wheelhouse}") in str(failed.value)
    assert "No matching distribution found for tinypkg==9.9" in str(failed.value)
    assert (path / "pyvenv.cfg").exists() and not (path / MARKER).exists()

    (path / "leftover-from-the-failed-build").write_text("x")
    checked = ensure_venv(spec(path, wheelhouse), Runner(template), True, "node1")
    assert checked.action == "rebuild" and checked.reason.startswith("half-built venv: no completion marker")
    assert (path / "leftover-from-the-failed-build").exists()  # check mode removed nothing

    rebuilt = ensure_venv(spec(path, wheelhouse), Runner(template), False, "node1")
    assert (rebuilt.changed, rebuilt.action) == (True, "rebuild")
    assert not (path / "leftover-from-the-failed-build").exists()
    assert rebuilt.installed == {"tinypkg": "1.0+sim"}
    assert (path / MARKER).exists()


def test_new_pins_rebuild_the_venv(tmp_path, wheelhouse, template):
    path = tmp_path / "venv"
    ensure_venv(spec(path, wheelhouse), Runner(template), False, "node1")
    result = ensure_venv(spec(path, wheelhouse, packages=("tinypkg==1.1",)), Runner(template), False, "node1")
    assert result.action == "rebuild"
    assert result.reason == "pins changed: built for tinypkg==1.0; asked for tinypkg==1.1"
    assert result.installed == {"tinypkg": "1.1"}
    assert "tinydep" not in result.distributions  # a clean rebuild, not an upgrade in place


def test_a_venv_changed_behind_the_markers_back_is_rebuilt(tmp_path, wheelhouse, template):
    path = tmp_path / "venv"
    ensure_venv(spec(path, wheelhouse), Runner(template), False, "node1")
    subprocess.run([str(path / "bin/python"), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                    str(wheelhouse), "tinypkg==1.1"], check=True, capture_output=True)
    result = ensure_venv(spec(path, wheelhouse), Runner(template), False, "node1")
    assert result.action == "rebuild"
    assert result.reason == "installed versions no longer match the pins: tinypkg is 1.1, not 1.0"
    assert result.installed == {"tinypkg": "1.0+sim"}


def lock_for(wheelhouse: Path, tmp_path: Path, tamper: str = "") -> Path:
    def digest(wheel: str) -> str:
        return hashlib.sha256((wheelhouse / wheel).read_bytes()).hexdigest()
    lock = tmp_path / "lock.txt"
    lock.write_text(f"tinypkg==1.0+sim \\\n    --hash=sha256:{tamper or digest('tinypkg-1.0+sim-py3-none-any.whl')}\n"
                    f"tinydep==2.0 --hash=sha256:{digest('tinydep-2.0-py3-none-any.whl')}\n")
    return lock


def test_a_lock_installs_in_hash_checking_mode(tmp_path, wheelhouse, template):
    lock = lock_for(wheelhouse, tmp_path)
    run = Runner(template)
    result = ensure_venv(spec(tmp_path / "venv", wheelhouse, packages=("tinypkg==1.0+sim",), lock=str(lock)),
                         run, False, "node1")
    assert result.installed == {"tinypkg": "1.0+sim"}
    assert run.pip_installs()[0][-6:] == ["--require-hashes", "--only-binary", ":all:", "--no-deps", "-r", str(lock)]


def test_the_lock_alone_decides_what_is_installed(tmp_path, wheelhouse, template):
    """--no-deps: a dependency the lock leaves out is not resolved behind its back (here: the import then fails)."""
    lock = tmp_path / "lock.txt"
    wheel = wheelhouse / "tinypkg-1.0+sim-py3-none-any.whl"
    lock.write_text(f"tinypkg==1.0+sim --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}\n")
    with pytest.raises(VenvError, match=r"(?s)`import tinypkg` fails .*No module named 'tinydep'"):
        ensure_venv(spec(tmp_path / "venv", wheelhouse, packages=("tinypkg==1.0",), lock=str(lock),
                         verify_import="tinypkg"), Runner(template), False, "node1")


def test_an_incomplete_lock_is_refused_before_anything_is_built(tmp_path, wheelhouse):
    lock = auto_lock(wheelhouse, ("tinypkg==1.1",), tmp_path / "lock.txt")
    lock.write_text("# missing: pyairports==2.1.1 -- vllm-project/vllm#23983\n" + lock.read_text())
    run = Runner()
    with pytest.raises(VenvError, match=r"lock .*lock.txt is incomplete: no file was supplied for pyairports==2.1.1 "
                                        r"\(the index no longer serves it\)"):
        ensure_venv(spec(tmp_path / "venv", wheelhouse, packages=("tinypkg==1.1",), lock=str(lock)), run, False,
                    "node1")
    assert run.calls == [] and not (tmp_path / "venv").exists()


def test_no_lock_is_refused(tmp_path, wheelhouse):
    with pytest.raises(VenvError, match="no lock given: a node installs only from a hash lock"):
        ensure_venv(VenvSpec(path=str(tmp_path / "venv"), python=PYTHON, packages=["tinypkg==1.1"], lock=""),
                    Runner(), False, "node1")


def test_a_lock_that_does_not_pin_a_package_is_refused(tmp_path, wheelhouse):
    lock = auto_lock(wheelhouse, ("tinypkg==1.1",), tmp_path / "lock.txt")
    with pytest.raises(VenvError, match=r"does not match the packages: liar==3.0 is not in it"):
        ensure_venv(spec(tmp_path / "venv", wheelhouse, packages=("tinypkg==1.1", "liar==3.0"), lock=str(lock)),
                    Runner(), False, "node1")


def test_a_wheel_that_does_not_match_the_lock_is_refused_by_pip(tmp_path, wheelhouse, template):
    lock = lock_for(wheelhouse, tmp_path, tamper="0" * 64)
    with pytest.raises(VenvError, match="DO NOT MATCH THE HASHES"):
        ensure_venv(spec(tmp_path / "venv", wheelhouse, packages=("tinypkg==1.0+sim",), lock=str(lock)),
                    Runner(template), False, "node1")
    assert not (tmp_path / "venv" / MARKER).exists()


def test_an_import_whose_version_is_not_the_pin_fails_the_build(tmp_path, wheelhouse, template):
    with pytest.raises(VenvError, match=r"liar.__version__ is 2.9 in .* on node1, expected 3.0"):
        ensure_venv(spec(tmp_path / "venv", wheelhouse, packages=("liar==3.0",), verify_import="liar"),
                    Runner(template), False, "node1")
    assert not (tmp_path / "venv" / MARKER).exists()


def test_an_import_that_fails_names_the_error(tmp_path, wheelhouse, template):
    with pytest.raises(VenvError, match=r"(?s)`import broken` fails in .* on node1: .*ImportError: needs libcuda.so.1"):
        ensure_venv(spec(tmp_path / "venv", wheelhouse, packages=("broken==1.0",), verify_import="broken"),
                    Runner(template), False, "node1")


def test_a_missing_wheelhouse_says_how_to_get_one(tmp_path):
    with pytest.raises(VenvError, match=r"wheelhouse .*/nowhere is not a directory on node1; copy the wheels there"):
        ensure_venv(spec(tmp_path / "venv", tmp_path / "nowhere"), Runner(), False, "node1")


def test_a_missing_interpreter_is_named(tmp_path, wheelhouse):
    bad = spec(tmp_path / "venv", wheelhouse)
    bad = VenvSpec(path=bad.path, python="/usr/bin/python3.99", packages=bad.packages, lock=bad.lock, source=bad.source)
    with pytest.raises(VenvError, match=r"the interpreter '/usr/bin/python3.99' does not run on node1"):
        ensure_venv(bad, Runner(), False, "node1")


def test_check_mode_does_not_need_the_wheelhouse_or_lock_a_previous_task_would_copy(tmp_path):
    checked = ensure_venv(spec(tmp_path / "venv", tmp_path / "not-copied-yet", lock=str(tmp_path / "lock.txt")),
                          Runner(), True, "node1")
    assert (checked.changed, checked.action) == (True, "create")


def test_a_mirror_index_is_used_by_url(tmp_path, wheelhouse, template):
    """An internal mirror is a PEP 503 simple index; a file:// one stands in for http://pypi.internal/simple."""
    project = tmp_path / "simple" / "tinypkg"
    project.mkdir(parents=True)
    wheel = wheelhouse / "tinypkg-1.1-py3-none-any.whl"
    shutil.copy(wheel, project / wheel.name)
    (project / "index.html").write_text(f'<html><body><a href="{wheel.name}">{wheel.name}</a></body></html>\n')
    (tmp_path / "simple" / "index.html").write_text('<html><body><a href="tinypkg/">tinypkg</a></body></html>\n')
    mirror = Source("mirror", index_url=(tmp_path / "simple").as_uri(), trusted_host="pypi.internal")
    run = Runner(template)
    lock = auto_lock(wheelhouse, ("tinypkg==1.1",), tmp_path / "lock.txt")
    result = ensure_venv(VenvSpec(path=str(tmp_path / "venv"), python=PYTHON, packages=["tinypkg==1.1"],
                                  lock=str(lock), source=mirror), run, False, "node1")
    assert result.installed == {"tinypkg": "1.1"}
    assert run.pip_installs()[0][-10:-6] == ["--index-url", (tmp_path / "simple").as_uri(), "--trusted-host",
                                             "pypi.internal"]
