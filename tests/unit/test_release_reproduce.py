"""The generated blocks of data/vllm-releases.yml are what tools/release_facts.py makes of its recorded inputs
(tests/data/release-inputs/vllm-<release>/: the raw parser dumps of every variant and the per-file fatbin scans,
recorded from the release's locked wheels with `--record`), without a venv or the network."""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "data" / "release-inputs"
RECORDINGS = sorted(p for p in RECORDED.glob("vllm-*") if (p / "manifest.json").is_file())
RELEASES_TEXT = (REPO / "data" / "vllm-releases.yml").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def facts():
    spec = importlib.util.spec_from_file_location("release_facts", REPO / "tools" / "release_facts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["release_facts"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def manifest(directory):
    return json.loads((directory / "manifest.json").read_text(encoding="utf-8"))


def releases_with_markers(facts, kind):
    begin = facts.MARKERS[kind][0]
    keys = re.findall(r'^  "?([0-9][^":\s]*)"?:[ \t]*$', RELEASES_TEXT, re.MULTILINE)
    found = []
    for key in keys:
        start, stop = facts.release_span(RELEASES_TEXT, key)
        if begin in RELEASES_TEXT[start:stop]:
            found.append(key)
    return found


# generated after the recordings were made (commit 40806da); record them with --record to take them off this list
NOT_YET_RECORDED = {"0.10.1.1"}

CASES = [(d, kind) for d in RECORDINGS for kind in ("cli", "kernels")]


def test_every_generated_block_has_recorded_inputs(facts):
    recorded = {manifest(d)["release"]: d for d in RECORDINGS}
    for kind in ("cli", "kernels"):
        marked = releases_with_markers(facts, kind)
        assert marked, f"no release has {kind} marker lines"
        missing = [r for r in marked if r not in NOT_YET_RECORDED and (
            r not in recorded or not (recorded[r] / facts.RECORDED_FILES[kind]).is_file())]
        assert not missing, (f"{kind} blocks without recorded inputs: {missing}; record them with "
                             f"`tools/release_facts.py {kind} --python VENV --release R --record "
                             "tests/data/release-inputs/vllm-R`")


@pytest.mark.parametrize("directory,kind", CASES, ids=[f"{d.name}-{k}" for d, k in CASES])
def test_the_committed_block_is_what_the_tool_makes_of_the_recording(facts, directory, kind):
    release = manifest(directory)["release"]
    inputs = facts.read_recorded(directory, kind, release)
    rendered = facts.RENDERERS[kind](inputs)
    assert not rendered.failed, "\n".join(rendered.report)
    assert rendered.block == facts.committed_block(RELEASES_TEXT, release, kind), (
        f"releases.{release}.{kind} differs from what the tool makes of {directory.name}: "
        f"`tools/release_facts.py check` shows where")


def test_check_finds_no_difference_in_the_committed_file(facts):
    checked, problems = facts.check_recorded(RELEASES_TEXT, RECORDED)
    assert problems == []
    assert len(checked) == len(CASES)


@pytest.mark.parametrize("kind,old,new", [
    ("cli", "{flags: [\"--port\"], action: store, type: int, default: 8000}",
     "{flags: [\"--port\"], action: store, type: int, default: 8001}"),
    ("kernels", "        cubin_archs: [", "        cubin_archs: [61, "),
])
def test_a_hand_edit_of_a_generated_block_is_reported(facts, kind, old, new):
    release = manifest(RECORDINGS[-1])["release"]
    start, stop = facts.release_span(RELEASES_TEXT, release)
    entry = RELEASES_TEXT[start:stop]
    begin, end = facts.MARKERS[kind]
    inside = entry[entry.index(begin):entry.index(end)]
    assert old in inside
    edited = RELEASES_TEXT[:start] + entry.replace(inside, inside.replace(old, new, 1)) + RELEASES_TEXT[stop:]
    checked, problems = facts.check_recorded(edited, RECORDED)
    assert len(checked) == len(CASES) and len(problems) == 1
    assert problems[0].startswith(f"releases.{release}.{kind} is not what the tool makes of ")
    assert any(line.startswith("-") and new.strip() in line for line in problems[0].splitlines())
    assert any(line.startswith("+") and old.strip() in line for line in problems[0].splitlines())


def test_a_changed_recording_is_reported(facts, tmp_path):
    # the raw dumps decide the table: one variant whose parser lacks a flag no longer merges into the committed one
    directory = RECORDINGS[0]
    copy = tmp_path / directory.name
    copy.mkdir()
    (copy / "manifest.json").write_bytes((directory / "manifest.json").read_bytes())
    inputs = facts.read_recorded(directory, "cli")
    for variant in inputs["variants"]:
        variant["dump"]["arguments"][1]["default"] = 8001
    (copy / "cli-dumps.json.gz").write_bytes(facts.gzip_json(inputs))
    checked, problems = facts.check_recorded(RELEASES_TEXT, tmp_path)
    assert checked == [f"{inputs['release']} cli"] and len(problems) == 1 and "8001" in problems[0]


@pytest.mark.parametrize("directory", RECORDINGS, ids=lambda d: d.name)
def test_a_recording_names_its_wheel_lock_and_command(facts, directory):
    meta = manifest(directory)
    release, python = meta["release"], meta["python"]
    assert directory.name == f"vllm-{release}"
    lock = REPO / meta["lock"]["path"]
    assert meta["lock"]["path"] == f"data/locks/vllm-{release}-py{python}.txt"
    assert hashlib.sha256(lock.read_bytes()).hexdigest() == meta["lock"]["sha256"], (
        f"{lock.name} changed since {directory.name} was recorded: install it again and record anew")
    assert meta["wheel"]["sha256"] in facts.lock_hashes(lock, "vllm", release)
    assert meta["wheel"]["file"].startswith(f"vllm-{release}-") and meta["wheel"]["file"].endswith(".whl")
    cli = facts.read_recorded(directory, "cli", release)
    assert cli["generated_from"]["source"] == f"{meta['wheel']['file']} sha256 {meta['wheel']['sha256']}"
    for kind, record in meta["recorded"].items():
        data = (directory / record["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == record["sha256"]
        assert re.fullmatch(rf"tools/release_facts.py {kind} --python \S+ --release {re.escape(release)} "
                            rf"--record tests/data/release-inputs/{re.escape(directory.name)}", record["command"])
        assert re.fullmatch(r"[0-9a-f]{40}", record["tool"]["commit"])
        assert gzip.decompress(data).decode("utf-8").endswith("\n")


@pytest.mark.parametrize("directory", RECORDINGS, ids=lambda d: d.name)
def test_a_cli_recording_holds_every_variant_the_tool_builds(facts, directory):
    inputs = facts.read_recorded(directory, "cli")
    envs = [variant["env"] for variant in inputs["variants"]]
    assert envs == [dict(env, PYTHONHASHSEED=str(seed)) for env in facts.ENV_VARIANTS
                    for seed in range(inputs["hash_seeds"])]
    assert inputs["hash_seeds"] == 6


@pytest.mark.parametrize("directory", RECORDINGS, ids=lambda d: d.name)
def test_a_kernels_recording_holds_every_scanned_file(facts, directory):
    inputs = facts.read_recorded(directory, "kernels")
    assert [d["distribution"] for d in inputs["distributions"]] == [d.distribution for d in facts.DEPENDENCIES]
    for dist in inputs["distributions"]:
        assert dist["files"], f"{dist['distribution']}: no files"
        assert [f["path"] for f in dist["files"]] == sorted(f["path"] for f in dist["files"])
    assert inputs["torch_arch_flags"] and all(flag.startswith(("sm_", "compute_")) for flag in
                                              inputs["torch_arch_flags"])


def test_the_cli_writes_from_a_recording_without_a_venv(facts, capsys):
    directory = RECORDINGS[0]
    release = manifest(directory)["release"]
    assert facts.main(["kernels", "--from-recorded", str(directory), "--release", release]) == 0
    out = capsys.readouterr().out
    assert out.endswith(facts.committed_block(RELEASES_TEXT, release, "kernels"))
    assert facts.main(["cli", "--from-recorded", str(directory), "--release", "0.0.1"]) == 1
    assert f"recorded for vllm {release}, not 0.0.1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        facts.main(["cli", "--from-recorded", str(directory), "--release", release, "--record", "x"])


def test_the_release_file_loads_the_same_without_libyaml(monkeypatch):
    # module_utils/revive_releases.py uses yaml.CSafeLoader when PyYAML has libyaml, else yaml.SafeLoader
    import yaml
    from ansible.module_utils.revive_releases import load_release_file

    path = str(REPO / "data" / "vllm-releases.yml")
    fast = load_release_file(path)
    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    assert load_release_file(path) == fast
