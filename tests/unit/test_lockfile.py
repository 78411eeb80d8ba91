"""The lock file format: parsing (pins, hashes, continuations, header), its refusals, and header round-trips."""
from __future__ import annotations

import pytest
from ansible.module_utils.revive_lockfile import (
    GENERATED_LINE,
    LockEntry,
    LockError,
    canonical_name,
    dependency_closure,
    lock_file_name,
    locked_wheel_files,
    parse_lock,
    render_header,
    via_annotations,
)

H1 = "sha256:" + "a" * 64
H2 = "sha256:" + "b" * 64
H3 = "sha256:" + "c" * 64

GOOD = f"""{GENERATED_LINE}
# release: 0.8.5.post1
# python: 3.10
# constraint: transformers<4.52 -- vllm-project/vllm PR #18678
# constraint: numpy<2 -- an example
aiohttp==3.12.6 \\
    --hash={H1} \\
    --hash={H2}
    # via vllm
Torch==2.6.0 --hash={H3}  # a trailing comment
vllm==0.8.5.post1 \\
    --hash {H1}
    # via
    #   -r requirements.in
"""


def test_a_good_lock_parses_entries_and_header():
    lock = parse_lock(GOOD, "data/locks/x.txt")
    assert lock.entries == (
        LockEntry("aiohttp", "3.12.6", (H1, H2)),
        LockEntry("Torch", "2.6.0", (H3,)),
        LockEntry("vllm", "0.8.5.post1", (H1,)),
    )
    assert lock.header == {"release": ["0.8.5.post1"], "python": ["3.10"],
                           "constraint": ["transformers<4.52 -- vllm-project/vllm PR #18678", "numpy<2 -- an example"]}
    assert lock.release == "0.8.5.post1" and lock.value("python") == "3.10"
    assert lock.get("torch").version == "2.6.0" and lock.get("TORCH").key == "torch"
    assert lock.get("xformers") is None
    assert lock.complete and lock.missing == () and lock.where == "data/locks/x.txt"


def test_key_like_comments_after_the_first_requirement_are_not_header():
    lock = parse_lock(f"# python: 3.10\nfoo==1 --hash={H1}\n# python: 3.11\n# missing: bar==1\n", "x")
    assert lock.header == {"python": ["3.10"]} and lock.complete


@pytest.mark.parametrize("text, message", [
    ("foo==1.0\n", r"lock L, line 1: foo==1.0 has no --hash=sha256"),
    (f"# release: 1\nfoo==1.0 \\\n    # via bar\nbaz==2 --hash={H1}\n", r"line 2: foo==1.0 has no --hash"),
    (f"foo>=1.0 --hash={H1}\n", r"line 1: 'foo>=1.0' is not an exact pin"),
    (f"foo --hash={H1}\n", r"'foo' is not an exact pin"),
    (f"foo===1.0 --hash={H1}\n", r"'foo===1.0' is not an exact pin"),
    (f"foo[bar]==1.0 --hash={H1}\n", r"is not an exact pin"),
    (f"foo==1.0;python_version<'3.9' --hash={H1}\n", r"is not an exact pin"),
    (f"foo==1.* --hash={H1}\n", r"is not an exact pin"),
    ("foo==1.0 --hash=md5:abc\n", r"hash 'md5:abc' is not sha256:<64 lowercase hex digits>"),
    (f"foo==1.0 --hash=sha256:{'A' * 64}\n", r"is not sha256:<64 lowercase hex digits>"),
    (f"foo==1.0 --hash={H1} --no-deps\n", r"unexpected '--no-deps'"),
    (f"--index-url https://evil.example/simple\nfoo==1.0 --hash={H1}\n",
     r"line 1: option --index-url is not allowed in a lock"),
    ("-r other.txt\n", r"option -r is not allowed"),
    (f"foo==1.0 --hash={H1}\nFoo_==1.1 --hash={H3}\n", r"line 2: 'Foo_==1.1' is not an exact pin"),  # bad name
    (f"foo==1.0 --hash={H1}\nbar==2 --hash={H2}\nFOO==1.1 --hash={H3}\n",
     r"line 3: FOO is pinned twice \(first at line 1\)"),
    (f"foo.bar==1.0 --hash={H1}\nfoo_bar==1.1 --hash={H3}\n", r"foo_bar is pinned twice"),
    ("# release: 1\n# only comments\n\n", r"lock L has no requirements"),
    (f"# missing: foo==1.0 -- gone\nfoo==1.0 --hash={H1}\n", r"header lists foo==1.0 as missing but the lock pins"),
    (f"# supplied: bar==1.0 -- gone\nfoo==1.0 --hash={H1}\n", r"header lists bar==1.0 as supplied but the lock has"),
    (f"# requirement: ray[default]==2.34.0 -- why\nfoo==1.0 --hash={H1}\n",
     r"header lists ray\[default\]==2.34.0 as requirement but the lock has no entry for it"),
])
def test_malformed_locks_are_refused_naming_file_and_line(text, message):
    with pytest.raises(LockError, match=message):
        parse_lock(text, "L")


def test_continuations_join_across_lines_and_repeated_hashes_collapse():
    text = f"foo==1.0 \\\n  --hash={H1} \\\n  \\\n  --hash={H1} \\\n  --hash={H2}\nbar==2 \\\n --hash={H3}"
    lock = parse_lock(text, "x")
    assert lock.entries == (LockEntry("foo", "1.0", (H1, H2)), LockEntry("bar", "2", (H3,)))


def test_missing_lists_the_requirements_of_an_incomplete_lock():
    text = (f"# release: 0.5.4\n# missing: pyairports==2.1.1 -- vllm-project/vllm#23983\n# missing: other==1 -- x\n"
            f"vllm==0.5.4 --hash={H1}\n")
    lock = parse_lock(text, "data/locks/vllm-0.5.4-py3.10.txt")
    assert lock.missing == ("pyairports==2.1.1", "other==1") and not lock.complete
    with pytest.raises(LockError, match=r"lock data/locks/vllm-0.5.4-py3.10.txt is incomplete: no file was supplied "
                                        r"for pyairports==2.1.1, other==1 .*bin/revive lock 0.5.4 --supply DIR"):
        lock.require_complete()


def test_a_complete_lock_passes_require_complete():
    lock = parse_lock(f"# supplied: foo==1 -- gone\nfoo==1 --hash={H1}\n", "x")
    lock.require_complete()
    assert lock.supplied == ("foo==1",) and lock.complete


def test_a_rendered_header_round_trips():
    header = {
        "release": ["0.5.4"], "python": ["3.10"], "platform": ["x86_64-manylinux_2_35"],
        "index": ["https://pypi.org/simple"], "exclude-newer": ["2024-09-05"],
        "requirement": ["ray[default]==2.34.0 -- vllm-project/vllm#13935", "foo==1 -- because"],
        "constraint": ["transformers<4.45 -- vllm-project/vllm PR #29686", "b<2 -- why: because"],
        "supplied": ["foo==1 -- gone"], "missing": ["pyairports==2.1.1 -- vllm-project/vllm#23983"],
        "resolver": ["uv 0.13.8"], "command": ["bin/revive lock 0.5.4 --python 3.10"],
    }
    text = render_header(header)
    assert text.splitlines()[0] == GENERATED_LINE and text.endswith("\n")
    assert [line.split(":")[0] for line in text.splitlines()[1:]] == [
        "# release", "# python", "# platform", "# index", "# exclude-newer", "# requirement", "# requirement",
        "# constraint", "# constraint",
        "# supplied", "# missing", "# resolver", "# command"]
    lock = parse_lock(text + f"foo==1 --hash={H1}\nray==2.34.0 --hash={H2}\n", "x")
    assert lock.header == header and lock.requirements == ("ray[default]==2.34.0", "foo==1")
    assert render_header(lock.header) == text


@pytest.mark.parametrize("header, message", [
    ({"colour": ["red"]}, r"unknown key\(s\) colour"),
    ({"python": ["3.10", "3.11"]}, r"key python takes one value, got 2"),
    ({"command": ["a\nb"]}, r"must be one non-empty line"),
    ({"release": [" 0.5.4"]}, r"must be one non-empty line"),
    ({"release": [""]}, r"must be one non-empty line"),
])
def test_render_header_refuses_what_would_not_round_trip(header, message):
    with pytest.raises(LockError, match=message):
        render_header(header)


@pytest.mark.parametrize("version, python, expected", [
    ("0.8.5.post1", "3.10", "vllm-0.8.5.post1-py3.10.txt"),
    ("0.5.4", "3.11.9", "vllm-0.5.4-py3.11.txt"),
])
def test_lock_file_name(version, python, expected):
    assert lock_file_name(version, python) == expected


def test_lock_file_name_refuses_a_bare_major():
    with pytest.raises(LockError, match=r"python '3': expected a version like 3.10"):
        lock_file_name("0.5.4", "3")


def test_canonical_name_is_pep_503():
    assert canonical_name("Nvidia_ML.py") == canonical_name("nvidia--ml-py") == "nvidia-ml-py"


PROBE_LOCK = """nvidia-ml-py==13.615.71 \\
    --hash=sha256:959bf4adf6fe1308e4bd739e722236b0d1ec8392e2cefad33ff70c311380b9b6
Torch==2.4.0+sim \\
    --hash=sha256:bebe4e48f51b1dc75028c0815cb7bfa14a31a5bb80be70c9d980c6036953fc3d
"""


def test_only_the_wheels_of_a_locked_name_and_version_travel():
    listing = ["vllm-0.5.4+sim-py3-none-any.whl", "nvidia_ml_py-13.615.71-py3-none-any.whl",
               "nvidia_ml_py-12.560.30-py3-none-any.whl", "torch-2.4.0+sim-py3-none-any.whl",
               "torch-2.4.0+sim-1-cp311-cp311-manylinux_2_28_x86_64.whl", "torch-2.6.0+sim-py3-none-any.whl",
               "nvidia-ml-py-13.615.71.tar.gz", "README"]
    assert locked_wheel_files(listing, PROBE_LOCK) == [
        "nvidia_ml_py-13.615.71-py3-none-any.whl", "torch-2.4.0+sim-1-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.4.0+sim-py3-none-any.whl"]


def test_a_pin_without_a_wheel_is_named_with_the_fix():
    with pytest.raises(LockError, match=r"the wheelhouse has no wheel of Torch==2.4.0\+sim, which probe.txt pins: "
                                        r"add the wheels \(pip download"):
        locked_wheel_files(["nvidia_ml_py-13.615.71-py3-none-any.whl", "nvidia-ml-py-13.615.71.tar.gz"],
                           PROBE_LOCK, "probe.txt")


# --- the dependency closure of a requirement, from uv's `# via` annotations --------------------------------------

VIA_LOCK = f"""{GENERATED_LINE}
# release: 0.5.4
# requirement: ray[default]==2.34.0 -- vllm-project/vllm#13935
# supplied: pyairports==2.1.1 -- vllm-project/vllm#23983
aiohttp==3.10.5 \\
    --hash={H1}
    # via
    #   ray
    #   vllm
aiosignal==1.3.1 --hash={H2}
    # via aiohttp, ray
frozenlist==1.4.1 --hash={H3}
    # via aiosignal
pyairports==2.1.1 --hash={H1}
    # supplied (not on the index: vllm-project/vllm#23983): pyairports-2.1.1-py3-none-any.whl
ray==2.34.0 --hash={H2}
    # via
    #   -r requirements.in
    #   vllm
torch==2.4.0 --hash={H3}
    # via
    #   -r requirements.in
    #   -c constraints.txt
    #   vllm
vllm==0.5.4 --hash={H1}
    # via -r requirements.in
"""


def test_via_annotations_read_both_of_uvs_forms_and_leave_out_input_files():
    assert via_annotations(VIA_LOCK) == {
        "aiohttp": ("ray", "vllm"), "aiosignal": ("aiohttp", "ray"), "frozenlist": ("aiosignal",),
        "ray": ("vllm",), "torch": ("vllm",), "vllm": ()}


@pytest.mark.parametrize("roots, expected", [
    (["ray[default]==2.34.0"], ["aiohttp==3.10.5", "aiosignal==1.3.1", "frozenlist==1.4.1", "ray==2.34.0"]),
    (["Ray"], ["aiohttp==3.10.5", "aiosignal==1.3.1", "frozenlist==1.4.1", "ray==2.34.0"]),
    (["aiosignal==1.3.1"], ["aiosignal==1.3.1", "frozenlist==1.4.1"]),
    (["frozenlist==1.4.1", "torch==2.4.0"], ["frozenlist==1.4.1", "torch==2.4.0"]),
    (["pyairports==2.1.1"], ["pyairports==2.1.1"]),
    (["vllm==0.5.4"], ["aiohttp==3.10.5", "aiosignal==1.3.1", "frozenlist==1.4.1", "ray==2.34.0", "torch==2.4.0",
                       "vllm==0.5.4"]),
    ([], []),
])
def test_the_closure_of_a_requirement_follows_the_via_edges(roots, expected):
    assert [str(entry) for entry in dependency_closure(VIA_LOCK, roots, "L")] == expected


@pytest.mark.parametrize("text, roots, message", [
    (VIA_LOCK, ["memray==1.13.4"], r"lock L pins no memray \(asked for memray==1.13.4\); add memray==1.13.4 to the "
                                   r"release's lock requirements in data/vllm-releases.yml and regenerate"),
    (VIA_LOCK, ["ray[default]==2.35.0"], r"lock L pins ray==2.34.0, not ray\[default\]==2.35.0; regenerate it"),
    (VIA_LOCK.replace("# via aiosignal", "# via aiosignal, yarl"), ["ray"],
     r"lock L: frozenlist is annotated `via yarl`, which the lock does not pin; regenerate it"),
    (VIA_LOCK.replace("    # via aiosignal\n", ""), ["ray"],
     r"lock L: no `# via` comment for frozenlist==1.4.1, so its dependencies cannot be followed"),
])
def test_a_closure_the_lock_cannot_give_is_refused_with_the_fix(text, roots, message):
    with pytest.raises(LockError, match=message):
        dependency_closure(text, roots, "L")
