"""A role's small configuration files and their directories, kept in one module run (library/config_files.py).

Why one run for several files: `ansible.builtin.copy` and `template` each cost two module runs on the host even when
nothing changes (a `stat` for the checksum, then `file` for owner and mode), about 0.45 s a file on the lab; a role
with eight such files spends most of a run that changes nothing there (docs/performance.md §4). Here the controller
renders the contents (the `template` and `file` lookups), and one run on the host compares bytes, owner, group and
mode of every file and writes only what differs.

Each file is written the way `copy` does it: a temporary file beside the destination gets the content, owner, group
and mode first (a 0600 file is never readable by others, not even for a moment), the optional `validate` command
checks it, and a rename puts it in place. A file whose content and attributes already match is not touched.
"""
from __future__ import annotations

import difflib
import fnmatch
import grp
import os
import pwd
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

MODE = re.compile(r"^0?[0-7]{3}$")
MAX_CONTENT_BYTES = 1024 * 1024   # configuration files; a model or a wheel goes through its own module
DIFF_MAX_BYTES = 64 * 1024


class ConfigFileError(ValueError):
    """Bad input, or a file that could not be written; the message says which file and what to do."""


@dataclass(frozen=True)
class Owned:
    """Owner, group and mode every path below carries."""

    owner: str
    group: str
    mode: int


@dataclass(frozen=True)
class Directory(Owned):
    path: str
    purge: Optional[str] = None     # a glob: files here that match it and that no entry keeps are removed


@dataclass(frozen=True)
class File(Owned):
    name: str
    dest: str
    content: Optional[str]          # None: the file must not exist
    validate: Optional[str] = None


@dataclass
class Outcome:
    changed: bool = False
    actions: List[str] = field(default_factory=list)
    files: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    diff: List[Dict[str, str]] = field(default_factory=list)


def _mode(value: Any, where: str) -> int:
    text = value if isinstance(value, str) else ""   # YAML's 0644 unquoted is the number 420
    if not MODE.match(text):
        raise ConfigFileError(f"{where}: mode is {value!r}: it must be an octal string such as '0644' (quoted in "
                              "YAML, so that it is not read as a decimal number).")
    return int(text, 8)


def _absolute(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or value.rstrip("/") != value or "/../" in value + "/":
        raise ConfigFileError(f"{where}: {key} is {value!r}: it must be an absolute path without a trailing slash "
                              "or '..'.")
    return value


def parse(directories: Sequence[Mapping[str, Any]], files: Sequence[Mapping[str, Any]]) -> tuple:
    """The module's options as Directory and File records; every mistake is a ConfigFileError naming the entry."""
    parsed_dirs: List[Directory] = []
    for index, entry in enumerate(directories):
        where = f"directories[{index}]"
        purge = entry.get("purge")
        if purge is not None and (not purge or "/" in purge):
            raise ConfigFileError(f"{where}: purge is {purge!r}: it must be a file-name pattern such as '*.yml' (no "
                                  "'/': only the directory's own files are removed).")
        parsed_dirs.append(Directory(owner=entry["owner"], group=entry["group"], mode=_mode(entry["mode"], where),
                                     path=_absolute(entry["path"], where, "path"), purge=purge))
    parsed_files: List[File] = []
    for index, entry in enumerate(files):
        dest = _absolute(entry["dest"], f"files[{index}]", "dest")
        where = f"files[{index}] ({dest})"
        content = entry.get("content")
        present = entry.get("state", "present") == "present"
        if present and content is None:
            raise ConfigFileError(f"{where}: content is missing: give the file's text (the template or file lookup), "
                                  "or state: absent to remove it.")
        if not present and content is not None:
            raise ConfigFileError(f"{where}: state is absent but content is given: leave one of them out.")
        if present and len(content.encode("utf-8")) > MAX_CONTENT_BYTES:
            raise ConfigFileError(f"{where}: content is {len(content.encode('utf-8'))} bytes, more than "
                                  f"{MAX_CONTENT_BYTES}: this module keeps configuration files; copy large files "
                                  "with ansible.builtin.copy.")
        validate = entry.get("validate")
        if validate is not None and "%s" not in validate:
            raise ConfigFileError(f"{where}: validate is {validate!r}: it must contain %s, the path of the file to "
                                  "check.")
        parsed_files.append(File(owner=entry["owner"], group=entry["group"], mode=_mode(entry["mode"], where),
                                 name=entry.get("name") or dest, dest=dest, content=content if present else None,
                                 validate=validate))
    for kind, values in (("directories' path", [d.path for d in parsed_dirs]),
                         ("files' dest", [f.dest for f in parsed_files]),
                         ("files' name", [f.name for f in parsed_files])):
        twice = sorted({value for value in values if values.count(value) > 1})
        if twice:
            raise ConfigFileError(f"{kind} {', '.join(twice)} given more than once: each path is kept by one entry.")
    return parsed_dirs, parsed_files


def _ids(owned: Owned, where: str, check_mode: bool = False) -> Optional[tuple]:
    """uid and gid; None in check mode when the user or group is not there yet (a dry run of the role that would
    create it first)."""
    try:
        return _resolve(owned, where)
    except ConfigFileError:
        if check_mode:
            return None
        raise


def _resolve(owned: Owned, where: str) -> tuple:
    try:
        uid = pwd.getpwnam(owned.owner).pw_uid
    except KeyError:
        raise ConfigFileError(f"{where}: owner {owned.owner!r} does not exist on this host: create the user first.")
    try:
        gid = grp.getgrnam(owned.group).gr_gid
    except KeyError:
        raise ConfigFileError(f"{where}: group {owned.group!r} does not exist on this host: create the group first.")
    return uid, gid


def _attributes_differ(path: str, uid: int, gid: int, mode: int) -> List[str]:
    info = os.lstat(path)
    differs = []
    if info.st_uid != uid or info.st_gid != gid:
        differs.append("owner")
    if info.st_mode & 0o7777 != mode:
        differs.append("mode")
    return differs


def _set_attributes(path: str, uid: int, gid: int, mode: int) -> None:
    os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, mode)


def _make_directories(path: str, ids: tuple, mode: int) -> None:
    """Each missing directory down to `path` gets the owner, group and mode given (as `ansible.builtin.file` does),
    not the umask's; directories that exist are left as they are."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for created in reversed(missing):
        os.mkdir(created, 0o700)
        _set_attributes(created, *ids, mode)


def ensure_directory(directory: Directory, check_mode: bool, outcome: Outcome) -> None:
    ids = _ids(directory, directory.path, check_mode)
    if os.path.lexists(directory.path) and not os.path.isdir(directory.path):
        raise ConfigFileError(f"{directory.path} exists and is not a directory: move it away, then run again.")
    if not os.path.isdir(directory.path):
        outcome.changed = True
        outcome.actions.append(f"create directory {directory.path}")
        if not check_mode:
            _make_directories(directory.path, ids, directory.mode)
        return
    differs = _attributes_differ(directory.path, *ids, directory.mode) if ids else ["owner"]
    if differs:
        outcome.changed = True
        outcome.actions.append(f"set {' and '.join(differs)} of directory {directory.path}")
        if not check_mode:
            _set_attributes(directory.path, *ids, directory.mode)


def _read(path: str) -> Optional[bytes]:
    """The file's bytes; None when there is none, or a symlink (replaced by the file, as `copy` replaces it: e.g. a
    unit masked with a link to /dev/null)."""
    if not os.path.lexists(path) or os.path.islink(path):
        return None
    if not os.path.isfile(path):
        raise ConfigFileError(f"{path} exists and is not a regular file: move it away, then run again.")
    with open(path, "rb") as handle:
        return handle.read()


def _diff(dest: str, before: Optional[bytes], after: Optional[bytes]) -> Dict[str, str]:
    """A unified diff, prepared here: the module's contents are no_log (as copy's), and Ansible masks a no_log value
    wherever it appears whole in a result, which the plain before/after texts would be."""
    def lines(data: Optional[bytes]) -> List[str]:
        return [] if data is None else data.decode("utf-8", errors="replace").splitlines(keepends=True)
    if max(len(before or b""), len(after or b"")) > DIFF_MAX_BYTES:
        return {"prepared": f"--- {dest}\n+++ {dest}\n(more than {DIFF_MAX_BYTES} bytes: not shown)\n"}
    text = "".join(difflib.unified_diff(lines(before), lines(after), fromfile=f"{dest} (before)",
                                        tofile=f"{dest} (after)" if after is not None else f"{dest} (removed)"))
    return {"prepared": text}


def _validate(command: str, path: str, dest: str) -> None:
    argv = shlex.split(command.replace("%s", shlex.quote(path)))
    try:
        run = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ConfigFileError(f"{dest}: the validate command {argv[0]!r} could not run: {exc}. Install it or fix the "
                              "command.")
    if run.returncode != 0:
        raise ConfigFileError(f"{dest}: the new content fails its check ({command}, exit {run.returncode}); the file "
                              f"was left as it was. {(run.stderr or run.stdout).strip()[-2000:]}")


def _write(entry: File, data: bytes, uid: int, gid: int) -> None:
    directory = os.path.dirname(entry.dest)
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(entry.dest)}-", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        _set_attributes(temporary, uid, gid, entry.mode)
        if entry.validate:
            _validate(entry.validate, temporary, entry.dest)
        os.replace(temporary, entry.dest)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def ensure_file(entry: File, check_mode: bool, want_diff: bool, outcome: Outcome) -> None:
    before = _read(entry.dest)
    record: Dict[str, Any] = {"dest": entry.dest, "changed": False}
    outcome.files[entry.name] = record
    if entry.content is None:
        if os.path.lexists(entry.dest):
            record["changed"] = True
            outcome.actions.append(f"remove {entry.dest}")
            if want_diff:
                outcome.diff.append(_diff(entry.dest, before, None))
            if not check_mode:
                os.unlink(entry.dest)
        return
    ids = _ids(entry, entry.dest, check_mode)
    data = entry.content.encode("utf-8")
    if before != data:
        directory = os.path.dirname(entry.dest)
        if not os.path.isdir(directory) and not check_mode:
            raise ConfigFileError(f"{entry.dest}: its directory {directory} does not exist: add it to the task's "
                                  "directories, or create it first.")
        verb = "replace the symlink" if os.path.islink(entry.dest) else "write" if before is None else "rewrite"
        if not check_mode:
            _write(entry, data, *ids)   # a failed check raises here: the file and its record stay unchanged
        record["changed"] = True
        outcome.actions.append(f"{verb} {entry.dest}")
        if want_diff:
            outcome.diff.append(_diff(entry.dest, before, data))
        return
    differs = _attributes_differ(entry.dest, *ids, entry.mode) if ids else ["owner"]
    if differs:
        record["changed"] = True
        outcome.actions.append(f"set {' and '.join(differs)} of {entry.dest}")
        if not check_mode:
            _set_attributes(entry.dest, *ids, entry.mode)


def purge_directory(directory: Directory, kept: Sequence[str], check_mode: bool, want_diff: bool,
                    outcome: Outcome) -> None:
    """Remove the directory's own files that match its purge pattern and that no entry of the task keeps (a rule file
    the repository no longer has). Subdirectories are never touched."""
    if not directory.purge or not os.path.isdir(directory.path):
        return
    for name in sorted(os.listdir(directory.path)):
        path = os.path.join(directory.path, name)
        if path in kept or not fnmatch.fnmatchcase(name, directory.purge):
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            continue
        outcome.changed = True
        outcome.actions.append(f"remove {path} (not kept, matches {directory.purge})")
        if want_diff:
            outcome.diff.append(_diff(path, _read(path), None))
        if not check_mode:
            os.unlink(path)


def apply(directories: Sequence[Directory], files: Sequence[File], check_mode: bool = False,
          want_diff: bool = False, outcome: Optional[Outcome] = None) -> Outcome:
    """Directories first (parents before children), then each file, then the purge of each directory that has a
    pattern. Every owner and group is looked up before
    anything changes; an error after that stops at its file, with what was done before it in `outcome` (each step is
    whole: no file is ever half written)."""
    outcome = outcome if outcome is not None else Outcome()
    for owned in [*directories, *[entry for entry in files if entry.content is not None]]:
        _ids(owned, getattr(owned, "path", None) or getattr(owned, "dest"), check_mode)
    for directory in sorted(directories, key=lambda d: d.path.count("/")):
        ensure_directory(directory, check_mode, outcome)
    for entry in files:
        ensure_file(entry, check_mode, want_diff, outcome)
    kept = [entry.dest for entry in files]
    for directory in directories:
        purge_directory(directory, kept, check_mode, want_diff, outcome)
    outcome.changed = outcome.changed or any(record["changed"] for record in outcome.files.values())
    return outcome
