"""The lock generator: uv's argv and input files from a release's lock block, supplied distributions (hashed
from a supply directory, or missing), assembling the file, and uv for real against a tiny offline wheelhouse."""
from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict

import pytest
from ansible.module_utils import revive_lockgen as lockgen
from ansible.module_utils.revive_lockfile import LockEntry, parse_lock
from ansible.module_utils.revive_lockgen import (
    LockGenError,
    ResolveError,
    find_uv,
    input_files,
    lock_wheelhouse,
    release_job,
    render_lock,
    uv_argv,
    wheelhouse_job,
)
from ansible.module_utils.revive_releases import load_release_file
from revive_cli import lock as cli

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))

import build_wheelhouse  # noqa: E402

H1 = "sha256:" + "1" * 64
H2 = "sha256:" + "2" * 64


@dataclass
class FakeRelease:
    """What the generator reads of a Release: version, pins and the raw entry's lock block."""

    version: str
    pins: Dict[str, str]
    lock: Dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.lock if key == "lock" and self.lock else default


def release(supplied=True) -> FakeRelease:
    return FakeRelease("0.5.4", {"vllm": "0.5.4", "torch": "2.4.0", "xformers": "0.0.27.post2", "cuda": "12.1",
                                 "python": ">=3.8,<3.13"}, {
        "exclude_newer": "2024-09-05", "platform": "x86_64-manylinux_2_35", "pythons": ["3.10", "3.11"],
        "constraints": [{"requirement": "transformers<4.45", "reason": "r", "source": "vllm-project/vllm PR #29686"},
                        {"requirement": "numpy<2", "reason": "r", "source": "numpy 2.0 notes"}],
        "supplied": [{"requirement": "pyairports==2.1.1", "reason": "r", "source": "vllm-project/vllm#23983"}]
        if supplied else [],
    })


def write_wheel(directory: Path, name: str, version: str, requires=()) -> Path:
    data = build_wheelhouse.wheel_bytes(name, version, {f"{name}/__init__.py": f"# {name} {version}\n".encode()},
                                        [f"Requires-Dist: {r}" for r in requires], f"test wheel {name}")
    path = directory / f"{name}-{version}-py3-none-any.whl"
    path.write_bytes(data)
    return path


def sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_uv_argv_and_input_files_of_a_release():
    job = release_job(release(), "3.10")
    assert uv_argv(job, "/venv/bin/uv") == [
        "/venv/bin/uv", "--no-config", "pip", "compile", "requirements.in", "-c", "constraints.txt",
        "--excludes", "excludes.txt", "--python-version", "3.10", "--python-platform", "x86_64-manylinux_2_35",
        "--only-binary", ":all:", "--generate-hashes", "--exclude-newer", "2024-09-05T00:00:00Z",
        "--index-url", "https://pypi.org/simple", "--no-header", "--quiet", "-o", "lock.txt"]
    assert input_files(job) == {
        "requirements.in": "vllm==0.5.4\ntorch==2.4.0\nxformers==0.0.27.post2\n",
        "constraints.txt": "transformers<4.45\nnumpy<2\n",
        "excludes.txt": "pyairports\n",
    }
    assert job.command == "bin/revive lock 0.5.4 --python 3.10"
    assert [s.requirement for s in job.missing] == ["pyairports==2.1.1"]


def test_without_constraints_or_supplied_there_are_no_such_flags_and_files():
    plain = release(supplied=False)
    plain.lock["constraints"] = []
    job = release_job(plain, "3.11", index_url="https://mirror.example/simple")
    argv = uv_argv(job)
    assert "-c" not in argv and "--excludes" not in argv
    assert argv[argv.index("--index-url") + 1] == "https://mirror.example/simple"
    assert set(input_files(job)) == {"requirements.in"}
    assert job.command == "bin/revive lock 0.5.4 --python 3.11 --index-url https://mirror.example/simple"


def test_a_timestamp_exclude_newer_is_passed_through_and_junk_refused():
    stamped = release()
    stamped.lock["exclude_newer"] = "2024-09-05T12:30:00+02:00"
    argv = uv_argv(release_job(stamped, "3.10"))
    assert argv[argv.index("--exclude-newer") + 1] == "2024-09-05T12:30:00+02:00"
    stamped.lock["exclude_newer"] = "last week"
    with pytest.raises(LockGenError, match=r"exclude_newer 'last week': expected a date YYYY-MM-DD"):
        uv_argv(release_job(stamped, "3.10"))


def test_the_real_0_5_4_block_gives_its_pins_constraints_and_supplied():
    real = load_release_file(str(REPO / "data" / "vllm-releases.yml")).release("0.5.4")
    job = release_job(real, "3.10")
    files = input_files(job)
    for name in ("vllm", "torch", "xformers"):
        assert f"{name}=={real.pins[name]}\n" in files["requirements.in"]
    assert "cuda" not in files["requirements.in"] and "python" not in files["requirements.in"]
    assert "transformers<4.45\n" in files["constraints.txt"]
    assert files["excludes.txt"] == "pyairports\n"


@pytest.mark.parametrize("python, message", [
    ("3.12", r"vLLM 0.5.4 is locked for Python 3.10, 3.11, not 3.12; add it to .*releases.0.5.4.lock.pythons"),
    ("3", r"python '3': expected a minor version like 3.10"),
])
def test_pythons_outside_the_block_are_refused(python, message):
    with pytest.raises(LockGenError, match=message):
        release_job(release(), python)


def test_a_release_without_a_lock_block_is_refused():
    with pytest.raises(LockGenError, match=r"vLLM 0.5.4 has no lock block in data/vllm-releases.yml"):
        release_job(FakeRelease("0.5.4", {"vllm": "0.5.4"}), "3.10")


def test_a_supplied_wheel_is_hashed_and_its_dependencies_resolved(tmp_path):
    wheel = write_wheel(tmp_path, "pyairports", "2.1.1", ["requests>=2", "pytest; extra == 'test'"])
    (tmp_path / "pyairports-2.0.0-py3-none-any.whl").write_bytes(b"other version")
    (tmp_path / "pyairports-2.1.1.tar.gz").write_bytes(b"an sdist is not installable binary-only")
    job = release_job(release(), "3.10", supply_dir=str(tmp_path))
    (item,) = job.supplied
    assert item.entry == LockEntry("pyairports", "2.1.1", (sha256(wheel),))
    assert item.files == ("pyairports-2.1.1-py3-none-any.whl",) and job.missing == ()
    assert input_files(job)["requirements.in"].splitlines()[-1] == "requests>=2"  # the extra's pytest is not
    assert job.command == f"bin/revive lock 0.5.4 --python 3.10 --supply {tmp_path}"
    body = (f"requests==2.32.3 \\\n    --hash={H1}\n    # via -r requirements.in\n"
            f"torch==2.4.0 --hash={H2}\nvllm==0.5.4 --hash={H1}\nxformers==0.0.27.post2 --hash={H1}\n"
            f"aaa-after-sort-order==1 --hash={H2}\n")
    text = render_lock(job, body, "uv 0.13.8")
    lock = parse_lock(text, "x")
    assert lock.header["supplied"] == ["pyairports==2.1.1 -- vllm-project/vllm#23983"]
    assert "missing" not in lock.header and lock.complete
    assert [e.name for e in lock.entries] == ["pyairports", "requests", "torch", "vllm", "xformers",
                                              "aaa-after-sort-order"]
    assert lock.get("pyairports").hashes == (sha256(wheel),)
    assert "    # supplied (not on the index: vllm-project/vllm#23983): pyairports-2.1.1-py3-none-any.whl\n" in text


def test_without_a_supply_directory_the_distribution_is_missing():
    job = release_job(release(), "3.10")
    text = render_lock(job, f"torch==2.4.0 --hash={H1}\nvllm==0.5.4 --hash={H1}\nxformers==0.0.27.post2 "
                            f"--hash={H1}\n", "uv 0.13.8")
    lock = parse_lock(text, "x")
    assert lock.missing == ("pyairports==2.1.1",) and lock.get("pyairports") is None
    assert lock.header == {
        "release": ["0.5.4"], "python": ["3.10"], "platform": ["x86_64-manylinux_2_35"],
        "index": ["https://pypi.org/simple"], "exclude-newer": ["2024-09-05"],
        "constraint": ["transformers<4.45 -- vllm-project/vllm PR #29686", "numpy<2 -- numpy 2.0 notes"],
        "missing": ["pyairports==2.1.1 -- vllm-project/vllm#23983"], "resolver": ["uv 0.13.8"],
        "command": ["bin/revive lock 0.5.4 --python 3.10"]}


def test_a_supply_directory_without_the_wheel_is_an_error(tmp_path):
    (tmp_path / "pyairports-2.0.0-py3-none-any.whl").write_bytes(b"x")
    with pytest.raises(LockGenError, match=r"--supply .*: no wheel of pyairports==2.1.1 in it \(wheels of pyairports "
                                           r"there: pyairports-2.0.0-py3-none-any.whl\); put pyairports-2.1.1-"):
        release_job(release(), "3.10", supply_dir=str(tmp_path))
    with pytest.raises(LockGenError, match=r"--supply .*/nowhere: not a directory"):
        release_job(release(), "3.10", supply_dir=str(tmp_path / "nowhere"))
    (tmp_path / "pyairports-2.1.1-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(LockGenError, match=r"pyairports-2.1.1-py3-none-any.whl: not a wheel .*supply the .whl file"):
        release_job(release(), "3.10", supply_dir=str(tmp_path))


def test_a_supplied_requirement_must_be_an_exact_pin():
    loose = release()
    loose.lock["supplied"] = [{"requirement": "pyairports>=2", "reason": "r", "source": "s"}]
    with pytest.raises(LockGenError, match=r"releases.0.5.4.lock.supplied\[0\]: 'pyairports>=2' must be an exact pin"):
        release_job(loose, "3.10")


# --- the lock block's extra requirements (0.5.4: ray[default]==2.34.0 for multi-node serving) -----------------

RAY = {"requirement": "ray[default]==2.34.0", "reason": "r", "source": "vllm-project/vllm#13935"}
PINNED_BODY = f"torch==2.4.0 --hash={H1}\nvllm==0.5.4 --hash={H1}\nxformers==0.0.27.post2 --hash={H1}\n"


def with_requirements(items) -> FakeRelease:
    made = release()
    made.lock["requirements"] = items
    return made


def test_extra_requirements_go_into_requirements_in_and_the_header():
    job = release_job(with_requirements([RAY]), "3.11")
    assert input_files(job)["requirements.in"] == (
        "vllm==0.5.4\ntorch==2.4.0\nxformers==0.0.27.post2\nray[default]==2.34.0\n")
    assert "ray" not in input_files(job)["constraints.txt"]
    assert job.command == "bin/revive lock 0.5.4 --python 3.11"  # the inputs are the release data, not flags
    text = render_lock(job, f"ray==2.34.0 --hash={H2}\n" + PINNED_BODY, "uv 0.13.8")
    lock = parse_lock(text, "x")
    assert lock.header["requirement"] == ["ray[default]==2.34.0 -- vllm-project/vllm#13935"]
    assert lock.requirements == ("ray[default]==2.34.0",) and lock.get("ray").version == "2.34.0"
    assert text.index("# requirement: ") < text.index("# constraint: ")  # the order data/locks/README.md documents


def test_a_body_that_does_not_pin_the_extra_requirement_is_refused():
    job = release_job(with_requirements([RAY]), "3.11")
    with pytest.raises(LockGenError, match=r"pins ray==2.35.0 for ray\[default\]==2.34.0"):
        render_lock(job, f"ray==2.35.0 --hash={H2}\n" + PINNED_BODY, "uv 0.13.8")
    with pytest.raises(LockGenError, match=r"does not parse: .*header lists ray\[default\]==2.34.0 as requirement but "
                                           r"the lock has no entry for it"):
        render_lock(job, PINNED_BODY, "uv 0.13.8")


def test_a_release_without_extra_requirements_has_no_such_line():
    job = release_job(release(), "3.10")
    assert job.added == () and lockgen.lock_requirements(release()) == ()
    assert "requirement" not in parse_lock(render_lock(job, PINNED_BODY, "uv 0.13.8"), "x").header


WHERE = r"data/vllm-releases.yml releases.0.5.4.lock.requirements"


@pytest.mark.parametrize("items, message", [
    ([dict(RAY, requirement="ray[default]>=2.34")],
     WHERE + r"\[0\].requirement: 'ray\[default\]>=2.34' must be an exact pin name\[extras\]==version without a "
     r"marker .*e.g. ray\[default\]==2.34.0"),
    ([dict(RAY, requirement="ray==2.34.*")], WHERE + r"\[0\].requirement: 'ray==2.34.\*' must be an exact pin"),
    ([dict(RAY, requirement="ray==2.34.0,<3")], WHERE + r"\[0\].requirement: 'ray==2.34.0,<3' must be an exact pin"),
    ([dict(RAY, requirement="ray[default]==2.34.0; python_version < '3.12'")],
     WHERE + r"\[0\].requirement: .* must be an exact pin name\[extras\]==version without a marker"),
    ([dict(RAY, requirement="ray[default==2.34.0")],
     WHERE + r"\[0\].requirement: 'ray\[default==2.34.0' is not a requirement .*write name\[extras\]==version"),
    ([{"requirement": "ray==2.34.0", "reason": "r"}],
     WHERE + r"\[0\]: expected a mapping with requirement, reason and source"),
    ([RAY, dict(RAY, source="")], WHERE + r"\[1\]: expected a mapping with requirement, reason and source"),
    (["ray==2.34.0"], WHERE + r"\[0\]: expected a mapping with requirement, reason and source"),
    ([dict(RAY, requirement="torch==2.4.0")],
     WHERE + r"\[0\].requirement: torch is already one of the release's pins; drop it here or change the pin"),
    ([RAY, dict(RAY, requirement="Ray==2.34.0")], WHERE + r": ray is listed more than once; keep one entry"),
    ({"ray": "2.34.0"}, WHERE + r": expected a list of mappings with requirement, reason and source"),
])
def test_a_bad_extra_requirement_is_refused_naming_where_and_how_to_fix(items, message):
    with pytest.raises(LockGenError, match=message):
        release_job(with_requirements(items), "3.10")


def test_the_real_0_5_4_block_adds_ray_default_and_no_other_release_adds_anything():
    data = load_release_file(str(REPO / "data" / "vllm-releases.yml"))
    job = release_job(data.release("0.5.4"), "3.11")
    assert input_files(job)["requirements.in"].splitlines()[-1] == "ray[default]==2.34.0"
    (added,) = job.added
    assert added.requirement == "ray[default]==2.34.0" and "vllm-project/vllm#13935" in added.source
    for version in data.versions():
        if version != "0.5.4" and data.release(version).get("lock"):
            assert lockgen.lock_requirements(data.release(version)) == (), version


@pytest.mark.parametrize("body, message", [
    (f"pyairports==2.1.1 --hash={H1}\ntorch==2.4.0 --hash={H1}\nvllm==0.5.4 --hash={H1}\n"
     f"xformers==0.0.27.post2 --hash={H1}\n", r"uv resolved pyairports, which .* excludes as supplied"),
    (f"torch==2.5.0 --hash={H1}\nvllm==0.5.4 --hash={H1}\nxformers==0.0.27.post2 --hash={H1}\n",
     r"pins torch==2.5.0 for torch==2.4.0"),
    (f"vllm==0.5.4 --hash={H1}\nxformers==0.0.27.post2 --hash={H1}\n", r"pins nothing for torch==2.4.0"),
    (f"torch==2.4.0\nvllm==0.5.4 --hash={H1}\n", r"the generated lock does not parse: .*torch==2.4.0 has no --hash"),
    ("Resolved 3 packages\n", r"does not parse: .*'Resolved' is not an exact pin"),
])
def test_a_body_that_does_not_fit_the_job_is_refused(body, message):
    with pytest.raises(LockGenError, match=message):
        render_lock(release_job(release(), "3.10"), body, "uv 0.13.8")


def test_uv_settings_from_the_environment_are_dropped(monkeypatch):
    monkeypatch.setenv("UV_EXCLUDE_NEWER", "2020-01-01")
    monkeypatch.setenv("UV_INDEX_URL", "https://elsewhere.example/simple")
    monkeypatch.setenv("UV_CACHE_DIR", "/tmp/uv-cache")
    env = lockgen.uv_env()
    assert "UV_EXCLUDE_NEWER" not in env and "UV_INDEX_URL" not in env and env["UV_CACHE_DIR"] == "/tmp/uv-cache"


def test_find_uv_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LockGenError, match=r"uv is neither next to .*python nor on PATH; .*uv==0.13.8"):
        find_uv()
    uv = tmp_path / "uv"
    uv.write_text("#!/bin/sh\n")
    uv.chmod(0o755)
    assert find_uv() == str(uv)


# --- uv for real, offline, against a wheelhouse in tmp_path --------------------------------------------

@pytest.fixture
def wheelhouse(tmp_path):
    house = tmp_path / "wheelhouse"
    house.mkdir()
    wheels = {
        "alpha": write_wheel(house, "alpha", "1.0", ["beta>=2"]),
        "beta": write_wheel(house, "beta", "2.0"),
        "beta-old": write_wheel(house, "beta", "1.0"),
    }
    return house, wheels


def test_lock_wheelhouse_resolves_and_hashes_offline_and_reproducibly(tmp_path, wheelhouse):
    house, wheels = wheelhouse
    out = tmp_path / "locks" / "lab.txt"
    result = lock_wheelhouse(["alpha==1.0"], str(house), "3.11", str(out))
    assert result.changed and result.path == str(out)
    lock = parse_lock(out.read_text(), str(out))
    assert [(e.name, e.version, e.hashes) for e in lock.entries] == [
        ("alpha", "1.0", (sha256(wheels["alpha"]),)), ("beta", "2.0", (sha256(wheels["beta"]),))]
    assert lock.header["index"] == [f"none (--no-index --find-links {house})"]
    assert lock.header["exclude-newer"] == ["none"] and lock.header["python"] == ["3.11"]
    assert lock.header["resolver"][0].startswith("uv ")
    assert lock.header["command"] == [f"bin/revive lock --wheelhouse {house} --requirement alpha==1.0 "
                                      f"--python 3.11 --out {out}"]
    assert "release" not in lock.header
    first = out.read_bytes()
    again = lock_wheelhouse(["alpha==1.0"], str(house), "3.11", str(out))
    assert not again.changed and out.read_bytes() == first
    assert [p.name for p in out.parent.iterdir()] == ["lab.txt"]  # no temporary file left behind


def test_lock_wheelhouse_release_header_and_local_labels(tmp_path, wheelhouse):
    house, _ = wheelhouse
    write_wheel(house, "vllm", "0.5.4+sim", ["alpha==1.0"])
    out = tmp_path / "lab.txt"
    result = lock_wheelhouse(["vllm==0.5.4+sim"], str(house), "3.10", str(out), platform="x86_64-manylinux_2_35")
    assert result.lock.release == "0.5.4+sim" and result.lock.get("vllm").version == "0.5.4+sim"
    assert result.lock.header["platform"] == ["x86_64-manylinux_2_35"]
    assert {e.name for e in result.lock.entries} == {"vllm", "alpha", "beta"}


def test_an_unresolvable_set_is_a_resolve_error_with_uvs_reason(tmp_path, wheelhouse):
    house, _ = wheelhouse
    with pytest.raises(ResolveError, match=r"uv could not resolve .*gamma"):
        lock_wheelhouse(["alpha==1.0", "gamma==1"], str(house), "3.11", str(tmp_path / "x.txt"))
    assert not (tmp_path / "x.txt").exists()


def test_the_cli_lab_form(tmp_path, wheelhouse, capsys):
    house, _ = wheelhouse
    out = tmp_path / "cli.txt"
    code = cli.main(["--wheelhouse", str(house), "--requirement", "alpha==1.0", "--python", "3.11", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and f"{out}: 2 packages\n" in printed
    assert parse_lock(out.read_text(), str(out)).get("beta").version == "2.0"
    assert cli.main(["--wheelhouse", str(house), "--requirement", "nope==1", "--python", "3.11",
                     "--out", str(out)]) == 1
    assert "uv could not resolve" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["0.5.4", "--wheelhouse", "W", "--requirement", "a==1", "--python", "3.11", "--out", "o"],
     "--wheelhouse locks a requirement set, not a release"),
    (["--wheelhouse", "W", "--python", "3.11"], "--wheelhouse needs --requirement, --out"),
    (["0.5.4", "--out", "o"], "--requirement, --out and --platform belong to --wheelhouse mode"),
    (["9.9.9"], "vLLM 9.9.9 is not in the release data"),
])
def test_cli_argument_errors_exit_2(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_wheelhouse_job_needs_requirements_and_a_directory(tmp_path):
    with pytest.raises(LockGenError, match="give at least one --requirement"):
        wheelhouse_job([], str(tmp_path), "3.11", "o")
    with pytest.raises(LockGenError, match=r"--wheelhouse .*/none: not a directory"):
        wheelhouse_job(["a==1"], str(tmp_path / "none"), "3.11", "o")
