"""The committed locks (data/locks/*.txt): they parse, agree with data/vllm-releases.yml, and every hash in
them is a file PyPI serves today (network: one PEP 691 JSON page per project, metadata only)."""
from __future__ import annotations

import dataclasses
import json
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest
from ansible.module_utils.revive_lockfile import (
    Lock,
    canonical_name,
    dependency_closure,
    lock_file_name,
    name_of,
    parse_lock,
    render_header,
)
from ansible.module_utils.revive_lockgen import NOT_PACKAGES, header_for, release_job
from ansible.module_utils.revive_releases import load_release_file
from packaging.requirements import Requirement
from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

REPO = Path(__file__).resolve().parents[2]
LOCK_DIR = REPO / "data" / "locks"
LOCK_FILES = sorted(LOCK_DIR.glob("*.txt"))
RELEASE_LOCK = re.compile(r"^vllm-(?P<version>.+)-py(?P<python>\d+\.\d+)\.txt$")
RELEASE_LOCKS = [path for path in LOCK_FILES if RELEASE_LOCK.match(path.name)]
SIMPLE_API = "https://pypi.org/simple/{}/"
PEP_691 = "application/vnd.pypi.simple.v1+json"
FETCH_THREADS = 16
FETCH_TIMEOUT_S = 20
FETCH_RETRIES = 2


@pytest.fixture(scope="module")
def releases():
    return load_release_file(str(REPO / "data" / "vllm-releases.yml"))


def read_lock(path: Path) -> Lock:
    return parse_lock(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))


def test_there_are_release_locks():
    assert {p.name for p in RELEASE_LOCKS} >= {f"vllm-{version}-py{python}.txt" for python in ("3.10", "3.11")
                                               for version in ("0.5.4", "0.6.6.post1", "0.7.3", "0.8.5.post1",
                                                               "0.9.2", "0.10.1.1")}


@pytest.mark.parametrize("path", LOCK_FILES, ids=lambda p: p.name)
def test_every_lock_parses(path):
    lock = read_lock(path)
    assert lock.entries and all(entry.hashes for entry in lock.entries)


def test_every_release_with_a_lock_block_has_a_lock_per_python(releases):
    expected = {lock_file_name(version, str(python))
                for version in releases.versions() if releases.release(version).get("lock")
                for python in releases.release(version).get("lock")["pythons"]}
    assert expected <= {p.name for p in RELEASE_LOCKS}, "regenerate with bin/revive lock"


@pytest.mark.parametrize("path", RELEASE_LOCKS, ids=lambda p: p.name)
def test_a_release_lock_agrees_with_the_release_data(path, releases):
    name = RELEASE_LOCK.match(path.name)
    version, python = name.group("version"), name.group("python")
    lock = read_lock(path)
    release = releases.release(version)
    block = release.get("lock")
    assert block, f"{path.name}: vLLM {version} has no lock block in data/vllm-releases.yml"
    assert lock.release == version and lock.value("python") == python
    assert python in [str(p) for p in block["pythons"]]
    assert lock.value("exclude-newer") == str(block["exclude_newer"])
    assert lock.value("platform") == str(block["platform"])
    supply = r" --supply \S+" if lock.supplied else ""  # a lock hashing supplied files names their directory
    assert re.fullmatch(rf"bin/revive lock {re.escape(version)} --python {python}{supply}", lock.value("command"))
    assert lock.get("vllm") is not None and lock.get("vllm").version == version
    for pin, pinned in release.pins.items():
        if pin in NOT_PACKAGES:
            continue
        entry = lock.get(pin)
        assert entry is not None and Version(entry.version) == Version(pinned), f"{pin}=={pinned}: lock has {entry}"
    environment = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
                   "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}
    constraints = {name_of(value): value for value in lock.header.get("constraint", [])}
    for item in block["constraints"]:
        requirement = Requirement(item["requirement"])
        assert constraints.get(requirement.name) == f"{item['requirement']} -- {item['source'].strip()}"
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        entry = lock.get(requirement.name)
        assert entry is not None, f"constraint {requirement} names a distribution the lock does not hold"
        assert requirement.specifier.contains(entry.version, prereleases=True), f"{entry} breaks {requirement}"
    assert len(constraints) == len(block["constraints"])
    added = block.get("requirements") or []
    assert lock.header.get("requirement", []) == [f"{item['requirement']} -- {item['source'].strip()}"
                                                  for item in added], "regenerate with bin/revive lock"
    for item in added:
        requirement = Requirement(item["requirement"])
        entry = lock.get(requirement.name)
        assert entry is not None and requirement.specifier.contains(entry.version), f"{entry} for {requirement}"
    expected_supplied = {canonical_name(name_of(item["requirement"])): item["requirement"]
                         for item in block["supplied"]}
    listed = {canonical_name(name_of(r)): r for r in lock.supplied + lock.missing}
    assert listed == expected_supplied, "every supplied distribution is hashed (supplied) or missing, no other"
    for requirement in lock.supplied:
        entry = lock.get(name_of(requirement))
        assert entry is not None and f"{entry.name}=={entry.version}" == requirement


@pytest.mark.parametrize("path", RELEASE_LOCKS, ids=lambda p: p.name)
def test_a_release_lock_header_is_what_the_generator_makes_of_the_release_data(path, releases):
    # a lock's recorded inputs are its header and the index (make check-locks resolves them again against PyPI);
    # offline, the header must be exactly what bin/revive lock writes for the release's lock block today
    name = RELEASE_LOCK.match(path.name)
    version, python = name.group("version"), name.group("python")
    text = path.read_text(encoding="utf-8")
    lock = read_lock(path)
    job = release_job(releases.release(version), python)
    if lock.supplied:  # hashed from files given with --supply DIR: take their entries from the lock itself
        entries = {canonical_name(name_of(r)): lock.get(name_of(r)) for r in lock.supplied}
        job = dataclasses.replace(job, supplied=tuple(
            dataclasses.replace(item, entry=entries.get(canonical_name(name_of(item.requirement))))
            for item in job.supplied), command=lock.value("command"))
    resolver = lock.value("resolver")
    assert re.fullmatch(r"uv \d+\.\d+\.\d+", resolver or ""), f"{path.name}: resolver {resolver!r}"
    header = render_header(header_for(job, resolver))
    assert text.startswith(header), (
        f"{path.name}: its header is not what `{job.command}` writes from data/vllm-releases.yml; the lock block "
        f"changed since the lock was made (regenerate it) or the lock was edited by hand.\ncommitted:\n"
        + "".join(line + "\n" for line in text.splitlines() if line.startswith("#")) + f"generator:\n{header}")
    assert not text[len(header):].startswith("#"), f"{path.name}: header lines the generator does not write"


# ray 2.34.0's METADATA: the Requires-Dist with `extra == 'default'` (for Python >= 3.10 on Linux)
RAY_DEFAULT_EXTRA = {"aiohttp", "aiohttp-cors", "colorful", "py-spy", "requests", "opencensus", "pydantic",
                     "prometheus-client", "smart-open", "virtualenv", "grpcio", "memray"}
RAY_CORE = {"click", "filelock", "jsonschema", "msgpack", "packaging", "protobuf", "pyyaml", "aiosignal", "frozenlist",
            "requests"}


@pytest.mark.parametrize("python", ["3.10", "3.11"])
def test_the_0_5_4_locks_pin_ray_2_34_0_with_its_default_extra(python):
    # vLLM 0.5.4 asks for ray>=2.9 only; unpinned, the resolver took 2.35.0 (uploaded after 0.5.4) without the
    # dashboard and agent dependencies (docs/facts/multi-node.md)
    path = LOCK_DIR / f"vllm-0.5.4-py{python}.txt"
    lock = read_lock(path)
    assert lock.requirements == ("ray[default]==2.34.0",) and lock.get("ray").version == "2.34.0"
    closure = {entry.key for entry in dependency_closure(path.read_text(encoding="utf-8"), lock.requirements,
                                                         path.name)}
    assert RAY_DEFAULT_EXTRA | RAY_CORE | {"ray"} <= closure


@pytest.mark.parametrize("version,field,value", [
    ("0.8.5.post1", "exclude_newer", "2025-07-01"), ("0.8.5.post1", "platform", "x86_64-manylinux_2_28"),
    ("0.8.5.post1", "constraints", []), ("0.5.4", "requirements", []),
    ("0.8.5.post1", "requirements", [{"requirement": "ray[default]==2.43.0", "reason": "r", "source": "s"}])])
def test_a_lock_block_edited_after_locking_is_caught(releases, version, field, value):
    release = releases.release(version)
    text = (LOCK_DIR / f"vllm-{version}-py3.10.txt").read_text(encoding="utf-8")
    block = dict(release.get("lock"), **{field: value})
    job = release_job(dataclasses.replace(release, raw=dict(release.raw, lock=block)), "3.10")
    assert not text.startswith(render_header(header_for(job, "uv 0.13.8")))


# --- against PyPI ---------------------------------------------------------------------------------------

def fetch_project(name: str) -> Optional[Dict[str, Set[str]]]:
    """{version: sha256s of its files} from PyPI's PEP 691 JSON page; None when there is no such project."""
    request = urllib.request.Request(SIMPLE_API.format(name), headers={"Accept": PEP_691})
    for attempt in range(FETCH_RETRIES + 1):
        try:
            with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as response:
                page = json.load(response)
            break
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if attempt == FETCH_RETRIES:
                raise
        except (urllib.error.URLError, TimeoutError, ConnectionError):
            if attempt == FETCH_RETRIES:
                raise
        time.sleep(1 + attempt)
    versions: Dict[str, Set[str]] = {}
    for item in page.get("files", []):
        filename, sha = item.get("filename", ""), (item.get("hashes") or {}).get("sha256")
        try:
            if filename.endswith(".whl"):
                version = parse_wheel_filename(filename)[1]
            else:
                version = parse_sdist_filename(filename)[1]
        except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
            continue  # an old file name no installer can use
        if sha:
            versions.setdefault(str(version), set()).add(f"sha256:{sha}")
    return versions


def test_every_locked_hash_is_a_file_on_pypi():
    locks = [read_lock(path) for path in LOCK_FILES]
    projects = sorted({entry.key for lock in locks for entry in lock.entries} |
                      {canonical_name(name_of(r)) for lock in locks for r in lock.missing})
    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        pages = dict(zip(projects, pool.map(fetch_project, projects)))
    problems: List[str] = []
    for lock in locks:
        for entry in lock.entries:
            page = pages[entry.key]
            if page is None:
                problems.append(f"{lock.where}: {entry}: no project {entry.name} on PyPI")
                continue
            files = page.get(str(Version(entry.version)), set())
            unknown = [h for h in entry.hashes if h not in files]
            if unknown:
                problems.append(f"{lock.where}: {entry}: {len(unknown)} of {len(entry.hashes)} hashes are no file of "
                                f"{entry.name} {entry.version} on PyPI (it has {len(files)}), e.g. {unknown[0]}")
        for requirement in lock.missing:
            name, version = name_of(requirement), requirement.split("==", 1)[-1]
            page = pages[canonical_name(name)]
            if page and page.get(str(Version(version))):
                problems.append(f"{lock.where}: {requirement} is listed as missing but PyPI serves it again; "
                                "regenerate the lock and update the release's supplied list")
    assert not problems, "locks that no longer install from PyPI (regenerate with bin/revive lock):\n" + \
        "\n".join(problems)
