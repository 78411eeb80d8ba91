"""0.5.4's real Ray in the lab wheelhouse: lab/vllm_twin/build_wheelhouse.py asks pip (through
lab/labctl/prepare.py download_locked_wheels) for exactly the closure of the release's lock requirements, with every
hash the real lock data/locks/vllm-0.5.4-py3.11.txt has for it, for the lab nodes' CPython 3.11, only for what the
wheelhouse lacks; a pin the lock does not hold is refused before anything is fetched; and the closure read from
the lock's `# via` annotations is the one the downloaded wheels' own METADATA gives."""
from __future__ import annotations

import email.parser
import sys
import zipfile
from pathlib import Path

import pytest
from ansible.module_utils.revive_lockfile import canonical_name, parse_lock
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lab" / "vllm_twin"))
sys.path.insert(0, str(REPO / "lab"))

import build_wheelhouse  # noqa: E402
from labctl import prepare  # noqa: E402
from labctl.errors import LabError  # noqa: E402

REAL_LOCK = REPO / "data" / "locks" / "vllm-0.5.4-py3.11.txt"
# Debian 12's interpreter on a lab node, as PEP 508 markers see it
NODE_ENVIRONMENT = {"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux",
                    "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                    "implementation_name": "cpython", "platform_python_implementation": "CPython"}


@pytest.fixture
def downloads(monkeypatch):
    """(argv tail, requirements file text) of each pip download the builder asks for; no network."""
    calls = []

    def fake_download(argv_tail):
        calls.append((list(argv_tail), Path(argv_tail[argv_tail.index("-r") + 1]).read_text()))

    monkeypatch.setattr(prepare, "_pip_download", fake_download)
    return calls


def real_lock():
    return parse_lock(REAL_LOCK.read_text(encoding="utf-8"), str(REAL_LOCK))


def test_the_builder_asks_pip_for_the_closure_with_every_hash_of_the_real_lock(tmp_path, downloads):
    pins = build_wheelhouse.download_closure(tmp_path, "0.5.4", "3.11")
    assert pins == build_wheelhouse.closure_pins("0.5.4", "3.11") and "ray==2.34.0" in pins
    (argv, requirements), = downloads
    asked = parse_lock(requirements, "asked")
    real = real_lock()
    assert [str(entry) for entry in asked.entries] == pins
    assert all(entry.hashes == real.get(entry.name).hashes for entry in asked.entries)
    assert "--require-hashes" in argv and argv[argv.index("--dest") + 1] == str(tmp_path)
    for flag, value in (("--python-version", "3.11"), ("--implementation", "cp"), ("--abi", "cp311")):
        assert argv[argv.index(flag) + 1] == value
    # ray 2.34.0 ships cp311 for Linux x86_64 only as ray-2.34.0-cp311-cp311-manylinux2014_x86_64.whl
    assert {"--platform=manylinux2014_x86_64", "--platform=manylinux_2_36_x86_64"} <= set(argv)


def test_wheels_already_there_are_not_fetched_again(tmp_path, downloads):
    pins = build_wheelhouse.closure_pins("0.5.4", "3.11")
    for pin in pins[1:]:
        name, version = pin.split("==")
        (tmp_path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"")
    assert build_wheelhouse.download_closure(tmp_path, "0.5.4", "3.11") == pins[:1]
    (_, requirements), = downloads
    assert [str(entry) for entry in parse_lock(requirements, "asked").entries] == pins[:1]
    downloads.clear()
    name, version = pins[0].split("==")
    (tmp_path / f"{name}-{version}-py3-none-any.whl").write_bytes(b"")
    assert build_wheelhouse.download_closure(tmp_path, "0.5.4", "3.11") == [] and downloads == []


def test_a_release_without_lock_requirements_fetches_nothing(tmp_path, downloads):
    assert build_wheelhouse.download_closure(tmp_path, "0.8.5.post1", "3.11") == [] and downloads == []


def test_a_pin_the_lock_does_not_hold_is_refused_before_any_download(tmp_path, downloads):
    with pytest.raises(LabError, match=r"vllm-0.5.4-py3.11.txt: pins no ray==2.42.0, memray==9; regenerate the lock"):
        prepare.download_locked_wheels(tmp_path, REAL_LOCK, only=["ray==2.42.0", "aiohttp==3.10.5", "memray==9"])
    assert downloads == []


@pytest.mark.parametrize("requirements, message", [
    (["pyspy==0.3.14"], r"data/locks/vllm-0.5.4-py3.11.txt pins no pyspy \(asked for pyspy==0.3.14\); add "
                        r"pyspy==0.3.14 to the release's lock requirements in data/vllm-releases.yml"),
    (["ray[default]==2.35.0"], r"data/locks/vllm-0.5.4-py3.11.txt pins ray==2.34.0, not ray\[default\]==2.35.0; "
                               r"regenerate it with bin/revive lock"),
])
def test_a_requirement_the_real_lock_does_not_pin_stops_the_build(monkeypatch, requirements, message):
    monkeypatch.setattr(build_wheelhouse, "release_lock_requirements", lambda version: requirements)
    with pytest.raises(SystemExit, match=message):
        build_wheelhouse.closure_pins("0.5.4", "3.11")


def metadata_closure(house: Path, root: str, versions: dict) -> set:
    """The distributions `root` needs on a lab node, from the wheels' own METADATA (Requires-Dist with their markers
    and extras evaluated for NODE_ENVIRONMENT), each taken at the version `versions` gives."""
    wheels = {}
    for path in house.glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(path.name)
        wheels[(canonicalize_name(name), str(version))] = path
    requirement = Requirement(root)
    extras = {canonical_name(requirement.name): set(requirement.extras)}
    pending = [canonical_name(requirement.name)]
    while pending:
        name = pending.pop()
        assert name in versions, f"{name} is needed but the real lock does not pin it"
        path = wheels.get((name, versions[name]))
        assert path is not None, f"the lab wheelhouse has no wheel of {name}=={versions[name]}"
        with zipfile.ZipFile(path) as wheel:
            (member,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
            metadata = email.parser.Parser().parsestr(wheel.read(member).decode("utf-8"))
        for text in metadata.get_all("Requires-Dist") or []:
            needed = Requirement(text)
            asked = extras[name] | {""}
            if needed.marker is not None and not any(needed.marker.evaluate(dict(NODE_ENVIRONMENT, extra=extra))
                                                     for extra in asked):
                continue
            child = canonical_name(needed.name)
            known = extras.get(child)
            if known is None or not set(needed.extras) <= known:
                extras[child] = (known or set()) | set(needed.extras)
                pending.append(child)
    return set(extras)


def test_the_via_closure_is_what_the_wheels_metadata_asks_for():
    pins = build_wheelhouse.closure_pins("0.5.4", "3.11")
    absent = [pin for pin in pins if not prepare.wheel_present(prepare.WHEELHOUSE, pin)]
    if absent:
        pytest.fail(f"the lab wheelhouse {prepare.WHEELHOUSE} lacks {', '.join(absent)}: run bin/lab wheelhouse "
                    "(make unit and make test do)")
    versions = {entry.key: entry.version for entry in real_lock().entries}
    from_metadata = metadata_closure(prepare.WHEELHOUSE, "ray[default]==2.34.0", versions)
    assert from_metadata == {pin.split("==")[0] for pin in pins}
    # without the extra, Ray core alone: the extra is what brings the dashboard and agent dependencies
    core = metadata_closure(prepare.WHEELHOUSE, "ray==2.34.0", versions)
    assert core < from_metadata and {"aiohttp-cors", "py-spy", "opencensus", "grpcio"} <= from_metadata - core
