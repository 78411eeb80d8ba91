"""The wheel source check and the fleet cache against a fake simple index on 127.0.0.1 (never pypi.org).

FakeIndex serves PEP 691 JSON or PEP 503 HTML project pages and the files themselves, with HTTP Range,
and can cut a download mid-way, ignore Range, fail with 503 or redirect; the module tests reuse it.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from ansible.module_utils.revive_lockfile import parse_lock
from ansible.module_utils.revive_venv import Source
from ansible.module_utils.revive_wheelcache import DownloadError, ProgressFile, SourceProblems, fill_cache
from ansible.module_utils.revive_wheelsource import Http, WheelSourceError, check_source, parse_html_page
from ansible.module_utils.revive_wheeltags import (
    TargetError,
    make_target,
    parse_wheel_name,
    python_allows,
    wheel_rank,
)
from revive_cli import wheels as cli

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
TARGET = make_target("3.10", "manylinux_2_35_x86_64")
FAST = Http(timeout=10, retries=0, backoff=0)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blob(size: int, seed: str) -> bytes:
    """Deterministic bytes of `size` (a wheel's content does not matter to the hash checks)."""
    out, block = bytearray(), seed.encode()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block
    return bytes(out[:size])


# --- the fake index ----------------------------------------------------------------------------------

@dataclass
class FakeIndex:
    root: Path
    url: str = ""
    mode: str = "json"  # json | html (ignores Accept) | html-406 (406 to a JSON-first Accept)
    ignore_range: bool = False
    cut: Dict[str, int] = field(default_factory=dict)  # file name -> bytes sent before the first GET is cut
    fail: Dict[str, int] = field(default_factory=dict)  # path -> 503 answers before it works
    pages: Dict[str, List[dict]] = field(default_factory=dict)
    requests: List[dict] = field(default_factory=list)

    @property
    def simple(self) -> str:
        return self.url + "/simple"

    def add(self, project: str, filename: str, data: bytes, listed: Optional[str] = "actual",
            requires_python: Optional[str] = None, yanked: bool = False) -> str:
        """Serve `data` as `filename` on `project`'s page; `listed` is the sha256 the page shows ("actual",
        another hex, or None for no hash). Returns the actual sha256."""
        (self.root / "files").mkdir(parents=True, exist_ok=True)
        (self.root / "files" / filename).write_bytes(data)
        actual = sha256(data)
        self.pages.setdefault(project, []).append({
            "filename": filename, "sha256": actual if listed == "actual" else listed, "size": len(data),
            "requires_python": requires_python, "yanked": yanked})
        return actual

    def file_requests(self) -> List[dict]:
        return [r for r in self.requests if r["path"].startswith("/files/")]

    def json_page(self, project: str) -> bytes:
        files = []
        for item in self.pages[project]:
            entry = {"filename": item["filename"], "url": f"../../files/{item['filename']}",
                     "hashes": {"sha256": item["sha256"]} if item["sha256"] else {}, "size": item["size"]}
            if item["requires_python"]:
                entry["requires-python"] = item["requires_python"]
            if item["yanked"]:
                entry["yanked"] = "broken build"
            files.append(entry)
        return json.dumps({"meta": {"api-version": "1.1"}, "name": project, "files": files}).encode()

    def html_page(self, project: str) -> bytes:
        anchors = []
        for item in self.pages[project]:
            fragment = f"#sha256={item['sha256']}" if item["sha256"] else ""
            attrs = f' data-requires-python="{item["requires_python"].replace(">", "&gt;").replace("<", "&lt;")}"' \
                if item["requires_python"] else ""
            anchors.append(f'<a href="../../files/{item["filename"]}{fragment}"{attrs}>{item["filename"]}</a><br/>')
        return ("<!DOCTYPE html><html><body><h1>Links for " + project + "</h1>\n" + "\n".join(anchors) +
                "\n</body></html>").encode()


def make_handler(index: FakeIndex):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def send(self, status: int, body: bytes, content_type: str = "text/plain", headers: Optional[dict] = None):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 (http.server's name)
            record = {"path": self.path, "range": self.headers.get("Range"), "accept": self.headers.get("Accept"),
                      "status": None, "sent": 0}
            index.requests.append(record)
            if index.fail.get(self.path, 0) > 0:
                index.fail[self.path] -= 1
                record["status"] = 503
                return self.send(503, b"busy")
            if self.path.startswith("/old/"):
                record["status"] = 301
                return self.send(301, b"", headers={"Location": "/simple/" + self.path[len("/old/"):]})
            if self.path.startswith("/away/"):
                record["status"] = 302
                target = self.path[len("/away/"):]
                return self.send(302, b"", headers={"Location": f"{index.url.replace('127.0.0.1', 'localhost')}"
                                                                f"/simple/{target}"})
            if self.path.startswith("/simple/"):
                return self.page(record, self.path[len("/simple/"):].strip("/"))
            if self.path.startswith("/files/"):
                return self.file(record, self.path[len("/files/"):])
            record["status"] = 404
            self.send(404, b"not found")

        def page(self, record: dict, project: str):
            if project not in index.pages:
                record["status"] = 404
                return self.send(404, b"no such project")
            accept = self.headers.get("Accept") or ""
            wants_json = accept.startswith(JSON_TYPE)
            if index.mode == "html-406" and wants_json:
                record["status"] = 406
                return self.send(406, b"not acceptable")
            record["status"] = 200
            if index.mode == "json" and wants_json:
                return self.send(200, index.json_page(project), JSON_TYPE)
            self.send(200, index.html_page(project), "text/html; charset=utf-8")

        def file(self, record: dict, filename: str):
            path = index.root / "files" / filename
            if not path.is_file():
                record["status"] = 404
                return self.send(404, b"no such file")
            data = path.read_bytes()
            start = 0
            wanted = self.headers.get("Range")
            if wanted and not index.ignore_range:
                start = int(wanted.split("=", 1)[1].split("-", 1)[0])
                if start >= len(data):
                    record["status"] = 416
                    return self.send(416, b"", headers={"Content-Range": f"bytes */{len(data)}"})
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                record["status"] = 206
            else:
                self.send_response(200)
                record["status"] = 200
            body = data[start:]
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if filename in index.cut:
                body = body[:index.cut.pop(filename)]  # the first GET only: then the connection drops
            record["sent"] = len(body)  # before the write: the client may have read it all before the next line ran
            self.wfile.write(body)

    return Handler


@pytest.fixture
def fake_index(tmp_path):
    index = FakeIndex(tmp_path / "index")
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(index))
    index.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield index
    server.shutdown()
    server.server_close()


def write_lock(path: Path, entries: List[tuple], missing: tuple = (), release: str = "0.5.4") -> Path:
    """A lock as bin/revive lock writes it: entries are (name, version, [sha256 hex, ...])."""
    lines = ["# Generated by bin/revive lock -- do not edit; regenerate it with the command below.",
             f"# release: {release}", "# python: 3.10", "# platform: x86_64-manylinux_2_35"]
    lines += [f"# missing: {value}" for value in missing]
    for name, version, hashes in entries:
        lines.append(f"{name}=={version} \\")
        lines += [f"    --hash=sha256:{digest}" + (" \\" if i < len(hashes) - 1 else "")
                  for i, digest in enumerate(hashes)]
    path.write_text("\n".join(lines) + "\n")
    return path


def lock_of(path: Path):
    return parse_lock(path.read_text(), str(path))


def mirror(index: FakeIndex, url: Optional[str] = None, trusted: Optional[str] = "127.0.0.1") -> Source:
    return Source("mirror", url or index.simple, trusted, None)


@pytest.fixture
def two_projects(fake_index, tmp_path):
    """tinypkg 1.0 (a py3 wheel) and torch 2.6.0 (a cp310 manylinux wheel, plus a cp311 one), both locked."""
    tiny = fake_index.add("tinypkg", "tinypkg-1.0-py3-none-any.whl", blob(40_000, "tiny"))
    torch310 = fake_index.add("torch", "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl", blob(300_000, "t310"))
    torch311 = fake_index.add("torch", "torch-2.6.0-cp311-cp311-manylinux1_x86_64.whl", blob(1000, "t311"))
    fake_index.add("torch", "torch-2.5.1-cp310-cp310-manylinux1_x86_64.whl", blob(1000, "old"))
    lock = write_lock(tmp_path / "lock.txt", [("tinypkg", "1.0", [tiny]), ("torch", "2.6.0", [torch310, torch311])])
    return fake_index, lock


# --- tags --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("filename, python, platform, installs", [
    ("torch-2.6.0-cp310-cp310-manylinux_2_28_x86_64.whl", "3.10", "manylinux_2_35_x86_64", True),
    ("x-1-cp310-cp310-manylinux_2_39_x86_64.whl", "3.10", "manylinux_2_35_x86_64", False),
    ("x-1-cp310-cp310-manylinux_2_35_x86_64.whl", "3.10", "x86_64-manylinux_2_35", True),
    ("x-1-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "3.10", "manylinux_2_35_x86_64", True),
    ("x-1-cp311-abi3-manylinux_2_17_x86_64.whl", "3.10", "manylinux_2_35_x86_64", False),
    ("x-1-py3-none-any.whl", "3.10", "manylinux_2_35_x86_64", True),
    ("x-1-py2.py3-none-any.whl", "3.11", "manylinux_2_36_x86_64", True),
    ("x-1-cp310-none-any.whl", "3.10", "manylinux_2_35_x86_64", True),
    ("x-1-py310-none-manylinux_2_17_x86_64.whl", "3.10", "manylinux_2_35_x86_64", True),
    ("x-1-cp311-cp311-manylinux_2_17_x86_64.whl", "3.10", "manylinux_2_35_x86_64", False),
    ("x-1-cp311-cp311-manylinux_2_17_x86_64.whl", "3.11", "manylinux_2_36_x86_64", True),
    ("x-1-cp39-cp39-manylinux2014_x86_64.whl", "3.10", "manylinux_2_35_x86_64", False),
    ("x-1-cp310-cp310-musllinux_1_2_x86_64.whl", "3.10", "manylinux_2_35_x86_64", False),
    ("x-1-cp310-cp310-linux_x86_64.whl", "3.10", "manylinux_2_35_x86_64", False),
    ("x-1-cp310-cp310-manylinux1_x86_64.whl", "3.10", "manylinux_2_35_x86_64", True),
    ("x-1-cp310-cp310-manylinux2014_x86_64.whl", "3.10", "manylinux_2_12_x86_64", False),
    ("x-1-cp310-cp310-manylinux2014_aarch64.whl", "3.10", "manylinux_2_35_x86_64", False),
    ("x-1-pp310-pypy310_pp73-manylinux_2_17_x86_64.whl", "3.10", "manylinux_2_35_x86_64", False),
    ("x-1-cp310-cp310-win_amd64.whl", "3.10", "manylinux_2_35_x86_64", False),
])
def test_wheel_tag_compatibility(filename, python, platform, installs):
    wheel = parse_wheel_name(filename)
    assert wheel is not None
    assert (wheel_rank(wheel, make_target(python, platform)) is not None) is installs


def test_the_most_specific_tag_ranks_first():
    names = ["x-1-py3-none-any.whl", "x-1-cp38-abi3-manylinux2014_x86_64.whl",
             "x-1-cp310-cp310-manylinux2014_x86_64.whl",
             "x-1-cp310-cp310-manylinux_2_28_x86_64.whl", "x-1-cp310-abi3-manylinux_2_28_x86_64.whl"]
    ranked = sorted(names, key=lambda name: wheel_rank(parse_wheel_name(name), TARGET))
    assert ranked == ["x-1-cp310-cp310-manylinux_2_28_x86_64.whl", "x-1-cp310-cp310-manylinux2014_x86_64.whl",
                      "x-1-cp310-abi3-manylinux_2_28_x86_64.whl", "x-1-cp38-abi3-manylinux2014_x86_64.whl",
                      "x-1-py3-none-any.whl"]


def test_wheel_names_and_targets_are_parsed_or_refused_with_the_fix():
    built = parse_wheel_name("vllm-0.5.4-2-cp38-abi3-manylinux1_x86_64.whl")
    assert (built.name, built.version, built.build) == ("vllm", "0.5.4", (2, ""))
    assert built.tag_text == "cp38-abi3-manylinux1_x86_64"
    assert parse_wheel_name("vllm-0.5.4.tar.gz") is None
    assert parse_wheel_name("broken-py3-none-any.whl") is None
    assert parse_wheel_name("x-1-py3-none-any/../../evil.whl") is None
    assert make_target("3.10.12", "manylinux2014_x86_64").platform == "manylinux_2_17_x86_64"
    with pytest.raises(TargetError, match="linux_x86_64 and musllinux wheels are never installed"):
        make_target("3.10", "linux_x86_64")
    with pytest.raises(TargetError, match="write e.g. 3.10"):
        make_target("2.7", "manylinux_2_35_x86_64")


@pytest.mark.parametrize("spec, allowed", [
    (None, True), (">=3.8", True), (">=3.11", False), (">=3.9,<3.13", True), ("<3.10", False), ("!=3.10.*", False),
    ("==3.10.*", True), ("~=3.9", True), ("~=3.11", False), (">=3.10.0", True), ("not a specifier", True),
])
def test_requires_python(spec, allowed):
    assert python_allows(spec, TARGET) is allowed


def test_html_page_parsing_resolves_relative_links_and_reads_attributes():
    body = ('<a href="../../files/x-1-py3-none-any.whl#sha256=ABCDEF" data-requires-python="&gt;=3.8" data-yanked>'
            'x-1-py3-none-any.whl</a><a href="https://files.example/x-1.tar.gz">x-1.tar.gz</a>')
    files = parse_html_page(body, "https://mirror.example/simple/x/")
    assert [(f.filename, f.url, f.sha256, f.requires_python, f.yanked) for f in files] == [
        ("x-1-py3-none-any.whl", "https://mirror.example/files/x-1-py3-none-any.whl", "abcdef", ">=3.8", True),
        ("x-1.tar.gz", "https://files.example/x-1.tar.gz", None, None, False)]


# --- the source check --------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["json", "html", "html-406"])
def test_check_passes_on_json_and_html_pages(two_projects, mode):
    index, lock = two_projects
    index.mode = mode
    report = check_source(lock_of(lock), mirror(index), TARGET, FAST)
    assert report.ok, report.message()
    assert report.checked == 2
    chosen = {s.requirement: (s.filename, s.size) for s in report.selected}
    assert chosen["torch==2.6.0"][0] == "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl"
    assert chosen["torch==2.6.0"][1] == (300_000 if mode == "json" else None)
    page_accepts = [r["accept"] for r in index.requests if r["path"] == "/simple/torch/"]
    assert page_accepts[0].startswith(JSON_TYPE)
    assert page_accepts[-1] == ("text/html" if mode == "html-406" else page_accepts[0])
    assert not index.file_requests()


def test_check_names_every_missing_file_at_once(fake_index, tmp_path):
    fake_index.add("torch", "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl", b"rebuilt")
    fake_index.add("torch", "torch-2.6.0-cp311-cp311-manylinux1_x86_64.whl", b"other")
    fake_index.add("torch", "torch-2.6.0.tar.gz", b"sdist")
    lock = write_lock(tmp_path / "lock.txt", [("torch", "2.6.0", [sha256(b"what the lock saw")]),
                                              ("absent", "1.0", [sha256(b"absent")])])
    report = check_source(lock_of(lock), mirror(fake_index), TARGET, FAST)
    assert not report.ok and report.checked == 2
    problems = {p.requirement: p.message for p in report.problems}
    assert problems["torch==2.6.0"].startswith(
        f"no wheel of torch==2.6.0 with a locked hash at {fake_index.simple}/torch/ (offered: 2 wheel(s) of 2.6.0, "
        "none matching")
    assert problems["absent==1.0"] == (f"no wheel of absent==1.0 at {fake_index.simple}/absent/: HTTP 404 from "
                                       f"{fake_index.simple}/absent/ (the index has no such project)")
    assert "torch==2.6.0" in report.message() and "absent==1.0" in report.message()


def test_an_sdist_with_the_locked_hash_never_counts(fake_index, tmp_path):
    digest = fake_index.add("pyairports", "pyairports-2.1.1.tar.gz", b"sdist only")
    lock = write_lock(tmp_path / "lock.txt", [("pyairports", "2.1.1", [digest])])
    report = check_source(lock_of(lock), mirror(fake_index), TARGET, FAST)
    assert [p.requirement for p in report.problems] == ["pyairports==2.1.1"]
    assert "only the sdist pyairports-2.1.1.tar.gz matches one, and pip installs with --only-binary :all:" in \
        report.problems[0].message


def test_locked_wheels_that_do_not_install_on_the_target_are_refused_with_the_reason(fake_index, tmp_path):
    new = fake_index.add("xformers", "xformers-0.0.30-cp310-cp310-manylinux_2_39_x86_64.whl", b"new glibc")
    py311 = fake_index.add("later", "later-1.0-py3-none-any.whl", b"3.11 only", requires_python=">=3.11")
    lock = write_lock(tmp_path / "lock.txt", [("xformers", "0.0.30", [new]), ("later", "1.0", [py311])])
    report = check_source(lock_of(lock), mirror(fake_index), TARGET, FAST)
    problems = {p.requirement: p.message for p in report.problems}
    assert "installs on CPython 3.10 on manylinux_2_35_x86_64" in problems["xformers==0.0.30"]
    assert "needs glibc 2.39, not manylinux_2_35_x86_64" in problems["xformers==0.0.30"]
    assert "later-1.0-py3-none-any.whl: Requires-Python >=3.11" in problems["later==1.0"]


def test_a_lock_with_missing_entries_is_refused(two_projects, tmp_path):
    index, good = two_projects
    entries = [(e.name, e.version, [h.split(":")[1] for h in e.hashes]) for e in lock_of(good).entries]
    lock = write_lock(tmp_path / "incomplete.txt", entries, missing=("pyairports==2.1.1 -- vllm-project/vllm#23983",))
    report = check_source(lock_of(lock), mirror(index), TARGET, FAST)
    assert [p.requirement for p in report.problems] == ["pyairports==2.1.1"]
    assert report.problems[0].message == (
        f"the lock {lock} needs pyairports==2.1.1, which it could not hash: vllm-project/vllm#23983; put its wheel "
        "in a directory and regenerate the lock with `bin/revive lock 0.5.4 --supply DIR`")
    with pytest.raises(SourceProblems, match="pyairports==2.1.1"):
        fill_cache(lock_of(lock), mirror(index), TARGET, str(tmp_path / "cache"), http=FAST)
    assert not (tmp_path / "cache").exists()
    assert not index.file_requests()


def test_plain_http_needs_the_trusted_host_and_so_does_every_redirect(two_projects):
    index, lock = two_projects
    with pytest.raises(WheelSourceError, match=r"is plain http .* set source.trusted_host to 127.0.0.1:\d+"):
        check_source(lock_of(lock), mirror(index, trusted=None), TARGET, FAST)
    moved = check_source(lock_of(lock), mirror(index, url=index.url + "/old"), TARGET, FAST)
    assert moved.ok, moved.message()
    away = check_source(lock_of(lock), mirror(index, url=index.url + "/away"), TARGET, FAST)
    assert len(away.problems) == 2
    assert "is plain http and localhost is not the trusted host (127.0.0.1)" in away.problems[0].message


def test_pages_are_retried_after_5xx(two_projects):
    index, lock = two_projects
    index.fail["/simple/torch/"] = 2
    patient = Http(timeout=10, retries=2, backoff=0)
    assert check_source(lock_of(lock), mirror(index), TARGET, patient).ok
    assert [r["status"] for r in index.requests if r["path"] == "/simple/torch/"] == [503, 503, 200]
    index.fail["/simple/torch/"] = 5
    report = check_source(lock_of(lock), mirror(index), TARGET, patient)
    assert "HTTP 503 Service Unavailable from" in report.problems[0].message
    assert "after 3 attempts" in report.problems[0].message


def test_wheelhouse_check_hashes_files_and_flags_a_preferred_unlocked_build(tmp_path):
    house = tmp_path / "wheelhouse"
    house.mkdir()
    (house / "tinypkg-1.0-py3-none-any.whl").write_bytes(b"pure")
    (house / "unrelated-9.0-py3-none-any.whl").write_bytes(b"not hashed")
    lock = write_lock(tmp_path / "lock.txt", [("tinypkg", "1.0", [sha256(b"pure")])])
    source = Source("wheelhouse", None, None, str(house))
    report = check_source(lock_of(lock), source, TARGET)
    assert report.ok and report.selected[0].url == str(house / "tinypkg-1.0-py3-none-any.whl")
    (house / "tinypkg-1.0-cp310-cp310-manylinux_2_17_x86_64.whl").write_bytes(b"native build")
    report = check_source(lock_of(lock), source, TARGET)
    assert "holds tinypkg-1.0-cp310-cp310-manylinux_2_17_x86_64.whl, which pip prefers for tinypkg==1.0" in \
        report.problems[0].message
    (house / "tinypkg-1.0-cp310-cp310-manylinux_2_17_x86_64.whl").unlink()
    (house / "tinypkg-1.0-py3-none-any.whl").unlink()
    report = check_source(lock_of(lock), source, TARGET)
    assert report.problems[0].message.startswith(f"no wheel of tinypkg==1.0 with a locked hash at {house} ")
    with pytest.raises(WheelSourceError, match="is not a directory"):
        check_source(lock_of(lock), Source("wheelhouse", None, None, str(tmp_path / "nowhere")), TARGET)


def test_a_pin_without_a_local_label_takes_a_labelled_wheel_as_pip_does(tmp_path):
    house = tmp_path / "wheelhouse"
    house.mkdir()
    (house / "torch-2.4.0+cu121-cp310-cp310-linux_x86_64.whl").write_bytes(b"local build, never installable")
    (house / "torch-2.4.0+cu121-cp310-cp310-manylinux1_x86_64.whl").write_bytes(b"cu121")
    lock = write_lock(tmp_path / "lock.txt", [("torch", "2.4.0", [sha256(b"cu121")])])
    source = Source("wheelhouse", None, None, str(house))
    report = check_source(lock_of(lock), source, TARGET)
    assert report.ok and report.selected[0].filename == "torch-2.4.0+cu121-cp310-cp310-manylinux1_x86_64.whl"
    (house / "torch-2.4.0+cu124-cp310-cp310-manylinux1_x86_64.whl").write_bytes(b"cu124")
    report = check_source(lock_of(lock), source, TARGET)
    assert "holds torch-2.4.0+cu124-cp310-cp310-manylinux1_x86_64.whl, which pip prefers" in report.problems[0].message


# --- the fleet cache ---------------------------------------------------------------------------------

def test_fill_downloads_verified_files_then_a_second_run_downloads_nothing(two_projects, tmp_path):
    index, lock = two_projects
    dest = tmp_path / "cache"
    calls = []
    result = fill_cache(lock_of(lock), mirror(index), TARGET, str(dest), lambda *args: calls.append(args), http=FAST)
    assert result.changed and result.bytes_downloaded == 340_000 == result.bytes_total
    assert sorted(os.listdir(dest)) == ["tinypkg-1.0-py3-none-any.whl", "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl"]
    assert sha256((dest / "tinypkg-1.0-py3-none-any.whl").read_bytes()) == lock_of(lock).entries[0].hashes[0][7:]
    assert calls[0] == (0, 2, 0, 340_000, None) and calls[-1] == (2, 2, 340_000, 340_000, None)
    assert all(a[2] <= b[2] for a, b in zip(calls, calls[1:]))
    assert any(call[4] == "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl" for call in calls)
    fetched = len(index.file_requests())
    again = fill_cache(lock_of(lock), mirror(index), TARGET, str(dest), http=FAST)
    assert (again.changed, again.bytes_downloaded, len(again.kept)) == (False, 0, 2)
    assert len(index.file_requests()) == fetched


def test_check_mode_reports_the_bytes_and_writes_nothing(two_projects, tmp_path):
    index, lock = two_projects
    result = fill_cache(lock_of(lock), mirror(index), TARGET, str(tmp_path / "cache"), check_mode=True, http=FAST)
    assert result.changed and result.downloaded == ["tinypkg-1.0-py3-none-any.whl",
                                                    "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl"]
    assert (result.bytes_to_download, result.bytes_downloaded, result.unknown_sizes) == (340_000, 0, [])
    assert not (tmp_path / "cache").exists() and not index.file_requests()
    index.mode = "html"
    unsized = fill_cache(lock_of(lock), mirror(index), TARGET, str(tmp_path / "cache"), check_mode=True, http=FAST)
    assert (unsized.bytes_to_download, len(unsized.unknown_sizes)) == (0, 2)


def test_an_interrupted_download_resumes_with_range_on_the_next_run(two_projects, tmp_path):
    index, lock = two_projects
    dest = tmp_path / "cache"
    torch = "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl"
    index.cut[torch] = 100_000
    with pytest.raises(DownloadError, match=f"{torch}.part is kept: run again to resume where it stopped"):
        fill_cache(lock_of(lock), mirror(index), TARGET, str(dest), http=FAST)
    assert (dest / f"{torch}.part").stat().st_size == 100_000
    assert not (dest / torch).exists()
    second = fill_cache(lock_of(lock), mirror(index), TARGET, str(dest), http=FAST)
    assert second.downloaded == [torch] and second.kept == ["tinypkg-1.0-py3-none-any.whl"]
    assert second.bytes_downloaded == 200_000
    assert index.file_requests()[-1]["range"] == "bytes=100000-" and index.file_requests()[-1]["status"] == 206
    assert sha256((dest / torch).read_bytes()) == sha256(blob(300_000, "t310"))
    assert sorted(os.listdir(dest)) == ["tinypkg-1.0-py3-none-any.whl", torch]


def test_a_cut_connection_resumes_within_the_same_run_when_retries_allow(two_projects, tmp_path):
    index, lock = two_projects
    torch = "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl"
    index.cut[torch] = 120_000
    retrying = Http(timeout=10, retries=1, backoff=0)
    result = fill_cache(lock_of(lock), mirror(index), TARGET, str(tmp_path / "cache"), http=retrying)
    assert result.bytes_downloaded == 340_000
    assert [(r["range"], r["sent"]) for r in index.file_requests() if torch in r["path"]] == \
        [(None, 120_000), ("bytes=120000-", 180_000)]


def test_a_server_ignoring_range_restarts_the_file_cleanly(two_projects, tmp_path):
    index, lock = two_projects
    dest = tmp_path / "cache"
    torch = "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl"
    index.cut[torch] = 100_000
    with pytest.raises(DownloadError):
        fill_cache(lock_of(lock), mirror(index), TARGET, str(dest), http=FAST)
    index.ignore_range = True
    result = fill_cache(lock_of(lock), mirror(index), TARGET, str(dest), http=FAST)
    last = index.file_requests()[-1]
    assert (last["range"], last["status"], result.bytes_downloaded) == ("bytes=100000-", 200, 300_000)
    assert sha256((dest / torch).read_bytes()) == sha256(blob(300_000, "t310"))


def test_a_stale_part_of_another_build_is_fetched_again_from_the_start(two_projects, tmp_path):
    index, lock = two_projects
    dest = tmp_path / "cache"
    dest.mkdir()
    torch = "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl"
    (dest / f"{torch}.part").write_bytes(b"x" * 5000)
    result = fill_cache(lock_of(lock), mirror(index), TARGET, str(dest), http=FAST)
    assert [r["range"] for r in index.file_requests() if torch in r["path"]] == ["bytes=5000-", None]
    assert result.bytes_downloaded == 40_000 + 295_000 + 300_000
    assert sha256((dest / torch).read_bytes()) == sha256(blob(300_000, "t310"))


def test_a_hash_mismatch_deletes_the_part_and_names_url_and_hashes(fake_index, tmp_path):
    locked = sha256(b"the wheel the lock was made from")
    fake_index.add("tinypkg", "tinypkg-1.0-py3-none-any.whl", b"a different wheel", listed=locked)
    lock = write_lock(tmp_path / "lock.txt", [("tinypkg", "1.0", [locked])])
    dest = tmp_path / "cache"
    with pytest.raises(DownloadError) as failure:
        fill_cache(lock_of(lock), mirror(fake_index), TARGET, str(dest), http=FAST)
    message = str(failure.value)
    assert message.startswith(f"{fake_index.url}/files/tinypkg-1.0-py3-none-any.whl does not match the lock: got "
                              f"sha256:{sha256(b'a different wheel')}, the lock has sha256:{locked} for tinypkg==1.0")
    assert os.listdir(dest) == []


def test_a_file_with_a_wrong_hash_in_dest_is_replaced(two_projects, tmp_path):
    index, lock = two_projects
    dest = tmp_path / "cache"
    dest.mkdir()
    (dest / "tinypkg-1.0-py3-none-any.whl").write_bytes(b"corrupt")
    result = fill_cache(lock_of(lock), mirror(index), TARGET, str(dest), http=FAST)
    assert result.replaced == ["tinypkg-1.0-py3-none-any.whl"] and len(result.downloaded) == 2
    assert (dest / "tinypkg-1.0-py3-none-any.whl").read_bytes() == blob(40_000, "tiny")


def test_fill_from_a_wheelhouse_copies_the_locked_wheels(tmp_path):
    house = tmp_path / "wheelhouse"
    house.mkdir()
    (house / "tinypkg-1.0-py3-none-any.whl").write_bytes(b"pure")
    lock = write_lock(tmp_path / "lock.txt", [("tinypkg", "1.0", [sha256(b"pure")])])
    result = fill_cache(lock_of(lock), Source("wheelhouse", None, None, str(house)), TARGET, str(tmp_path / "c"))
    assert (result.downloaded, result.bytes_downloaded) == (["tinypkg-1.0-py3-none-any.whl"], 4)
    assert (tmp_path / "c" / "tinypkg-1.0-py3-none-any.whl").read_bytes() == b"pure"


def test_progress_file_is_written_atomically_and_records_the_outcome(two_projects, tmp_path):
    index, lock = two_projects
    dest = tmp_path / "cache"
    progress = ProgressFile(str(dest), interval=0)
    fill_cache(lock_of(lock), mirror(index), TARGET, str(dest), progress, http=FAST)
    progress.finish("done")
    state = json.loads((dest / ".progress.json").read_text())
    assert {k: state[k] for k in ("state", "files_done", "files_total", "bytes_done", "bytes_total", "current")} == \
        {"state": "done", "files_done": 2, "files_total": 2, "bytes_done": 340_000, "bytes_total": 340_000,
         "current": None}
    assert sorted(os.listdir(dest)) == [".progress.json", "tinypkg-1.0-py3-none-any.whl",
                                        "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl"]
    written = (dest / ".progress.json").stat().st_mtime_ns
    idle = ProgressFile(str(dest), interval=0)
    result = fill_cache(lock_of(lock), mirror(index), TARGET, str(dest), idle, http=FAST)
    idle.finish("done", result=result)
    assert (dest / ".progress.json").stat().st_mtime_ns == written
    (dest / ".progress.json").write_text('{"state": "failed", "msg": "cut"}')
    idle.finish("done", result=result)
    assert json.loads((dest / ".progress.json").read_text())["files_done"] == 2


# --- bin/revive wheels -------------------------------------------------------------------------------

def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_check_fetch_and_dry_run(two_projects, tmp_path, capsys):
    index, lock = two_projects
    source = ["--lock", str(lock), "--index-url", index.simple, "--trusted-host", "127.0.0.1", "--retries", "0"]
    code, out, err = run_cli(capsys, "check", *source)
    assert code == 0, err
    assert out.startswith(f"ok: mirror {index.simple} offers all 2 locked wheels of {lock} for CPython 3.10 on "
                          "manylinux_2_35_x86_64")
    code, out, _ = run_cli(capsys, "fetch", *source, "--dest", str(tmp_path / "c"), "--dry-run")
    assert (code, not (tmp_path / "c").exists()) == (0, True)
    assert out.startswith("would download 2 of 2 wheels, 0.3 MiB, into ")
    code, out, err = run_cli(capsys, "fetch", *source, "--dest", str(tmp_path / "c"))
    assert code == 0, err
    assert out.strip() == f"{tmp_path / 'c'}: downloaded 2 wheels (0.3 MiB), kept 0, 2 in all"
    assert "[2/2] 0.3 MiB of 0.3 MiB" in err
    code, out, _ = run_cli(capsys, "fetch", *source, "--dest", str(tmp_path / "c"))
    assert "downloaded 0 wheels (0.0 MiB), kept 2" in out


def test_cli_progress_is_one_live_line_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    line = cli.ProgressLine(screen)
    line(0, 145, 0, 8 * 2**30, None)
    line(3, 145, 2**30, 8 * 2**30, "torch-2.6.0-cp310-cp310-manylinux1_x86_64.whl")
    line(145, 145, 8 * 2**30, 8 * 2**30, None)
    line.end()
    text = screen.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")
    frames = [frame.rstrip() for frame in text.rstrip("\n").split("\r") if frame]
    assert frames[0].startswith("[  0/145] 0.0 MiB / 8.00 GiB   0%")
    assert frames[-1].startswith("[145/145] 8.00 GiB / 8.00 GiB 100%")


def test_cli_exit_codes_and_problem_lines(fake_index, tmp_path, capsys):
    lock = write_lock(tmp_path / "lock.txt", [("absent", "1.0", [sha256(b"x")])])
    code, _, err = run_cli(capsys, "check", "--lock", str(lock), "--index-url", fake_index.simple,
                           "--trusted-host", "127.0.0.1", "--retries", "0")
    assert code == 1
    assert f"  absent==1.0: no wheel of absent==1.0 at {fake_index.simple}/absent/: HTTP 404" in err
    code, _, err = run_cli(capsys, "check", "--lock", str(lock), "--platform", "musllinux_1_2_x86_64")
    assert code == 2 and "is not a manylinux platform" in err
    code, _, err = run_cli(capsys, "check", "--lock", str(tmp_path / "none.txt"))
    assert code == 2 and f"cannot read the lock {tmp_path / 'none.txt'}" in err
    code, _, _ = run_cli(capsys, "fetch", "--lock", str(lock))
    assert code == 2


def test_cli_takes_the_index_and_target_from_the_lock_header(two_projects, tmp_path, capsys):
    index, lock = two_projects
    text = lock.read_text().replace("# python: 3.10\n", f"# python: 3.10\n# index: {index.simple}\n")
    headed = tmp_path / "headed.txt"
    headed.write_text(text)
    code, out, err = run_cli(capsys, "check", "--lock", str(headed), "--trusted-host", "127.0.0.1")
    assert code == 0, err
    assert out.startswith(f"ok: mirror {index.simple} offers all 2 locked wheels of {headed} for CPython 3.10 on "
                          "manylinux_2_35_x86_64")


def test_real_entry_point(two_projects, repo):
    index, lock = two_projects
    proc = subprocess.run([sys.executable, str(repo / "bin" / "revive"), "wheels", "check", "--lock", str(lock),
                           "--index-url", index.simple, "--trusted-host", "127.0.0.1", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["ok"], report["checked"], len(report["files"])) == (True, 2, 2)
