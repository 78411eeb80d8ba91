"""Does a package source offer every file of a hash lock, installable on the node? Read-only.

Used by library/pip_source_check.py, library/wheel_cache.py (through module_utils/revive_wheelcache.py)
and `bin/revive wheels`. A node installs vLLM with

    pip install --require-hashes --only-binary :all: --no-deps -r LOCK   (--index-url URL | --no-index --find-links DIR)

so for every lock entry the source must offer a WHEEL (sdists never count) whose sha256 is one of the
entry's hashes and whose tags install on the target (module_utils/revive_wheeltags.py). check_source()
proves it before anything on a node changes, and names every missing file at once.

- index or mirror: one GET of `<index_url>/<normalized name>/` per entry (PEP 503), asking for the PEP 691
  JSON form and reading the PEP 503 HTML form (`href="...#sha256=<hex>"`) when that is what comes back; a
  few pages at a time (thread pool), with a timeout and retries. Plain http is allowed only for the source's
  trusted_host (as pip's --trusted-host, which also skips certificate checks for that host).
- wheelhouse: the directory's wheels of the locked names and versions are hashed (streamed sha256). pip
  does not know their hashes before it picks one, so the wheel it prefers (by tags, then build number)
  must be a locked one: another build of the same version beside it is reported.
- A lock whose header lists `missing` entries (distributions it could not hash) is refused.

Stdlib only, Python >= 3.9: the check runs on nodes (an index is checked from where pip will reach it).
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser
from http.client import HTTPException
from typing import Dict, List, Optional, Tuple

from ansible.module_utils.revive_bounds import Bound
from ansible.module_utils.revive_lockfile import Lock, LockEntry, LockError, canonical_name, parse_lock
from ansible.module_utils.revive_venv import (
    PUBLIC_INDEX,
    SOURCE_ARGUMENT_SPEC,
    Source,
    VenvError,
    parse_version,
    satisfies_pin,
    source_from_params,
)
from ansible.module_utils.revive_wheeltags import (
    Target,
    TargetError,
    make_target,
    parse_wheel_name,
    python_allows,
    wheel_rank,
    why_not_installable,
)

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.01"
USER_AGENT = "revive-wheelsource/1"
CHUNK = 1 << 20
REDIRECTS = 5


class WheelSourceError(Exception):
    """The source or the request cannot be used at all (bad URL, unreadable lock or wheelhouse)."""


class HttpStatus(WheelSourceError):
    """A final HTTP error status (after retries for 5xx)."""

    def __init__(self, url: str, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason} from {url}")
        self.url, self.status = url, status


# --- HTTP: trusted hosts, redirects, retries ---------------------------------------------------------

class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are followed by Http.open, which checks each hop's scheme and host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 (urllib's signature)
        return None


TRANSIENT = (urllib.error.URLError, socket.timeout, ConnectionError, HTTPException, TimeoutError)


def _host_matches(parsed: urllib.parse.SplitResult, trusted: Optional[str]) -> bool:
    if not trusted or not parsed.hostname:
        return False
    host, _, port = trusted.strip().lower().partition(":")
    return parsed.hostname.lower() == host and (not port or str(parsed.port or "") == port)


@dataclass(frozen=True)
class Http:
    """How pages and files are fetched: pip's trusted-host rule, a timeout per request, retries for 5xx and
    network errors with exponential backoff (`backoff` seconds, doubled each time)."""

    trusted_host: Optional[str] = None
    timeout: float = 60.0
    retries: int = 3
    backoff: float = 1.0

    def check_url(self, url: str) -> urllib.parse.SplitResult:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme == "https" or (parsed.scheme == "http" and _host_matches(parsed, self.trusted_host)):
            return parsed
        if parsed.scheme == "http":
            raise WheelSourceError(
                f"{url} is plain http and {parsed.hostname} is not the trusted host "
                f"({self.trusted_host or 'none set'}): pip ignores such an index; serve it over https or set "
                f"source.trusted_host to {parsed.netloc}")
        raise WheelSourceError(f"{url}: only http(s) URLs are fetched (scheme {parsed.scheme or 'none'})")

    def _opener(self, parsed: urllib.parse.SplitResult) -> urllib.request.OpenerDirector:
        context = ssl.create_default_context()
        if _host_matches(parsed, self.trusted_host):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), _NoRedirect())

    def pause(self, attempt: int) -> None:
        if self.backoff > 0:
            time.sleep(self.backoff * (2 ** attempt))

    def open_once(self, url: str, headers: Dict[str, str]):
        """The response to one GET (redirects followed and checked); HttpStatus for an error status."""
        for _ in range(REDIRECTS + 1):
            parsed = self.check_url(url)
            request = urllib.request.Request(url, headers=dict({"User-Agent": USER_AGENT}, **headers))
            try:
                return self._opener(parsed).open(request, timeout=self.timeout)
            except urllib.error.HTTPError as error:
                location = error.headers.get("Location") if error.headers else None
                error.close()
                if error.code in (301, 302, 303, 307, 308) and location:
                    url = urllib.parse.urljoin(url, location)
                    continue
                raise HttpStatus(url, error.code, str(error.reason)) from None
        raise WheelSourceError(f"{url}: more than {REDIRECTS} redirects")

    def get(self, url: str, headers: Dict[str, str]) -> Tuple[bytes, str, str]:
        """(body, content type, final URL) of a GET, retried on network errors and 5xx/429."""
        last: Exception = WheelSourceError(f"{url}: no attempt made")
        for attempt in range(self.retries + 1):
            try:
                with self.open_once(url, headers) as response:
                    return response.read(), response.headers.get("Content-Type", ""), response.geturl()
            except HttpStatus as error:
                if error.status < 500 and error.status != 429:
                    raise
                last = error
            except TRANSIENT as error:
                last = WheelSourceError(f"{url}: {getattr(error, 'reason', None) or error}")
            if attempt < self.retries:
                self.pause(attempt)
        raise WheelSourceError(f"{last} (after {self.retries + 1} attempts, timeout {self.timeout:g} s each)")


# --- what a source offers ----------------------------------------------------------------------------

@dataclass(frozen=True)
class OfferedFile:
    """A file of a project page (url absolute) or of a wheelhouse (url = its path); sha256 None when the page
    publishes none."""

    filename: str
    url: str
    sha256: Optional[str] = None
    size: Optional[int] = None
    requires_python: Optional[str] = None
    yanked: bool = False


@dataclass
class Page:
    where: str
    files: List[OfferedFile] = field(default_factory=list)
    error: Optional[str] = None


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.base: Optional[str] = None
        self.anchors: List[Tuple[Dict[str, Optional[str]], str]] = []
        self._open: Optional[Dict[str, Optional[str]]] = None
        self._text: List[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "base" and self.base is None:
            self.base = dict(attrs).get("href")
        elif tag == "a":
            self._open, self._text = dict(attrs), []

    def handle_data(self, data):
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag):
        if tag == "a" and self._open is not None:
            self.anchors.append((self._open, "".join(self._text).strip()))
            self._open = None


def _split_fragment(url: str) -> Tuple[str, Optional[str]]:
    bare, _, fragment = url.partition("#")
    name, _, value = fragment.partition("=")
    return bare, (value.lower() if name.lower() == "sha256" and value else None)


def parse_html_page(body: str, page_url: str) -> List[OfferedFile]:
    """The files of a PEP 503 project page; hashes from `#sha256=` fragments."""
    parser = _Anchors()
    parser.feed(body)
    base = urllib.parse.urljoin(page_url, parser.base) if parser.base else page_url
    files = []
    for attrs, text in parser.anchors:
        href = attrs.get("href")
        if not href:
            continue
        url, sha256 = _split_fragment(urllib.parse.urljoin(base, href))
        filename = text or urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
        files.append(OfferedFile(filename, url, sha256, None, attrs.get("data-requires-python"),
                                 "data-yanked" in attrs))
    return files


def parse_json_page(body: str, page_url: str) -> List[OfferedFile]:
    """The files of a PEP 691 project page (sizes from PEP 700 where the index gives them)."""
    data = json.loads(body)
    files = []
    for item in data.get("files", []):
        url, fragment = _split_fragment(urllib.parse.urljoin(page_url, item["url"]))
        sha256 = (item.get("hashes") or {}).get("sha256") or fragment
        size = item.get("size")
        files.append(OfferedFile(item["filename"], url, sha256.lower() if sha256 else None,
                                 size if isinstance(size, int) else None, item.get("requires-python"),
                                 bool(item.get("yanked"))))
    return files


def project_url(index_url: str, name: str) -> str:
    return index_url.rstrip("/") + "/" + canonical_name(name) + "/"


def fetch_page(http: Http, index_url: str, name: str) -> Page:
    """A project's files on a simple index; Page.error says why there are none (404, unreachable...)."""
    url = project_url(index_url, name)
    try:
        try:
            body, content_type, final = http.get(url, {"Accept": ACCEPT})
        except HttpStatus as error:
            if error.status != 406:
                raise
            body, content_type, final = http.get(url, {"Accept": "text/html"})
        text = body.decode("utf-8", errors="replace")
        if "json" in content_type.split(";")[0].lower():
            return Page(url, parse_json_page(text, final))
        return Page(url, parse_html_page(text, final))
    except HttpStatus as error:
        hint = " (the index has no such project)" if error.status == 404 else ""
        return Page(url, error=f"HTTP {error.status} from {error.url}{hint}")
    except (WheelSourceError, ValueError, KeyError) as error:
        return Page(url, error=f"{url}: {error}")


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _same_release(wheel_version: str, pinned: str) -> bool:
    """Whether a wheel's version satisfies `==pinned` as pip reads it (a pin without a local label ignores the
    wheel's: torch==2.4.0 takes 2.4.0+cu121)."""
    return satisfies_pin(wheel_version, pinned)


def _local_key(version: str) -> tuple:
    """PEP 440 order of local labels: none first, then segment by segment, numbers above letters."""
    local = parse_version(version).local
    if not local:
        return ()
    return tuple((1, int(part), "") if part.isdigit() else (0, 0, part) for part in local.split("."))


def _pip_order(offered: OfferedFile, wheel, rank: int, hash_known: bool) -> tuple:
    """pip's preference among candidates of one pin (higher first): unyanked, version, tag priority, build."""
    return (0 if offered.yanked and hash_known else 1, _local_key(wheel.version), -rank, wheel.build[0])


def wheelhouse_pages(directory: str, entries: List[LockEntry], jobs: int) -> Dict[str, Page]:
    """Per entry key, the wheels of its name and version in `directory` (top level, as --find-links reads it),
    hashed."""
    if not os.path.isdir(directory):
        raise WheelSourceError(f"wheelhouse {directory} is not a directory on {socket.gethostname()}: put the "
                               "lock's wheels there (`bin/revive wheels fetch --lock LOCK --dest DIR`)")
    wanted = {entry.key: entry for entry in entries}
    found: Dict[str, List[str]] = {key: [] for key in wanted}
    for filename in sorted(os.listdir(directory)):
        wheel = parse_wheel_name(filename)
        path = os.path.join(directory, filename)
        if wheel and canonical_name(wheel.name) in wanted and os.path.isfile(path) and \
                _same_release(wheel.version, wanted[canonical_name(wheel.name)].version):
            found[canonical_name(wheel.name)].append(path)
    paths = [path for group in found.values() for path in group]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        digests = dict(zip(paths, pool.map(sha256_file, paths)))
    return {key: Page(directory, [OfferedFile(os.path.basename(path), path, digests[path], os.path.getsize(path))
                                  for path in group]) for key, group in found.items()}


# --- choosing the file pip installs ------------------------------------------------------------------

@dataclass(frozen=True)
class Selected:
    """The file of an entry that the target installs (url: absolute URL, or the path in a wheelhouse)."""

    requirement: str
    filename: str
    url: str
    sha256: str
    size: Optional[int]


@dataclass(frozen=True)
class Problem:
    requirement: str
    message: str


def locked_sha256(entry: LockEntry) -> List[str]:
    return [value.split(":", 1)[1].lower() for value in entry.hashes if value.lower().startswith("sha256:")]


def _names(files: List[OfferedFile], limit: int = 4) -> str:
    shown = ", ".join(f.filename for f in files[:limit])
    return shown + (f" and {len(files) - limit} more" if len(files) > limit else "")


def select_file(entry: LockEntry, page: Page, target: Target, wheelhouse: bool) -> Tuple[Optional[Selected],
                                                                                        Optional[Problem]]:
    """The wheel the target installs for `entry` from `page`, or the problem that stops it."""
    requirement, where = str(entry), page.where
    if page.error:
        return None, Problem(requirement, f"no wheel of {requirement} at {where}: {page.error}")
    hashes = set(locked_sha256(entry))
    wheels = []
    for offered in page.files:
        wheel = parse_wheel_name(offered.filename)
        if wheel and canonical_name(wheel.name) == entry.key and _same_release(wheel.version, entry.version):
            wheels.append((offered, wheel))
    locked = [(offered, wheel) for offered, wheel in wheels if offered.sha256 in hashes]
    usable = [(offered, wheel, wheel_rank(wheel, target)) for offered, wheel in locked]
    usable = [(o, w, r) for o, w, r in usable if r is not None and python_allows(o.requires_python, target)]
    if usable:
        offered, wheel, _ = max(usable, key=lambda c: _pip_order(c[0], c[1], c[2], True))
        if wheelhouse:
            ranked = [(o, w, wheel_rank(w, target)) for o, w in wheels]
            ranked = [(o, w, r) for o, w, r in ranked if r is not None and python_allows(o.requires_python, target)]
            preferred, _, _ = max(ranked, key=lambda c: _pip_order(c[0], c[1], c[2], False))
            if preferred.sha256 not in hashes:
                return None, Problem(requirement, (
                    f"the wheelhouse {where} holds {preferred.filename}, which pip prefers for {requirement} on "
                    f"{target.describe()} over the locked {offered.filename}, but its sha256 {preferred.sha256} is "
                    f"not in the lock: remove it from {where} (pip would pick it and fail the hash check)"))
        return Selected(requirement, offered.filename, offered.url, offered.sha256 or "", offered.size), None
    if locked:
        reasons = "; ".join(
            f"{o.filename}: " + (f"Requires-Python {o.requires_python}"
                                 if wheel_rank(w, target) is not None else why_not_installable(w, target))
            for o, w in locked)
        return None, Problem(requirement, f"no wheel of {requirement} with a locked hash at {where} installs on "
                                          f"{target.describe()} ({reasons}); regenerate the lock for this target")
    sdists = [o for o in page.files if o.sha256 in hashes and not o.filename.endswith(".whl")]
    if sdists:
        return None, Problem(requirement, (
            f"no wheel of {requirement} with a locked hash at {where}: only the sdist {_names(sdists)} matches one, "
            "and pip installs with --only-binary :all:; build the wheel, put it on the source and regenerate the "
            "lock with it (bin/revive lock --supply DIR)"))
    unhashed = [o for o, _ in wheels if o.sha256 is None]
    if wheels:
        detail = f"offered: {len(wheels)} wheel(s) of {entry.version}, none matching"
        if unhashed:
            detail += f"; {len(unhashed)} without a published sha256, which this check cannot prove"
        return None, Problem(requirement, (
            f"no wheel of {requirement} with a locked hash at {where} ({detail}: {_names([o for o, _ in wheels])}); "
            "the source serves other builds than the lock was made from: sync the mirror or regenerate the lock"))
    return None, Problem(requirement, (
        f"no wheel of {requirement} with a locked hash at {where} (offered: {len(page.files)} files, none of "
        f"version {entry.version}); add the release's wheels to the source"))


# --- the check ---------------------------------------------------------------------------------------

@dataclass
class SourceReport:
    lock: str
    source: str
    target: str
    checked: int
    problems: List[Problem] = field(default_factory=list)
    selected: List[Selected] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def message(self) -> str:
        if self.ok:
            return f"{self.source} offers all {self.checked} locked wheels of {self.lock} for {self.target}"
        return (f"{self.source} cannot serve the lock {self.lock} for {self.target}: {len(self.problems)} problem(s) "
                f"in {self.checked} entries:\n- " + "\n- ".join(problem.message for problem in self.problems))

    def as_dict(self) -> dict:
        return {"ok": self.ok, "checked": self.checked, "lock": self.lock, "source": self.source,
                "target": self.target, "msg": self.message(),
                "problems": [{"requirement": p.requirement, "message": p.message} for p in self.problems],
                "files": [{"requirement": s.requirement, "filename": s.filename, "url": s.url,
                           "sha256": s.sha256, "size": s.size} for s in self.selected]}


def missing_problems(lock: Lock) -> List[Problem]:
    """The lock's own refusal: entries it needs but could not hash (`# missing:` header lines)."""
    release = lock.release or (lock.get("vllm").version if lock.get("vllm") else "<version>")
    problems = []
    for value in lock.header.get("missing", []):
        requirement, _, why = value.partition(" -- ")
        problems.append(Problem(requirement.strip(), (
            f"the lock {lock.where} needs {requirement.strip()}, which it could not hash: "
            f"{why.strip() or 'no file was supplied'}; put its wheel in a directory and regenerate the lock with "
            f"`bin/revive lock {release} --supply DIR`")))
    return problems


def http_for(source: Source, timeout: float = 60.0, retries: int = 3, backoff: float = 1.0) -> Http:
    return Http(trusted_host=source.trusted_host, timeout=timeout, retries=retries, backoff=backoff)


def check_source(lock: Lock, source: Source, target: Target, http: Optional[Http] = None,
                 jobs: int = 8) -> SourceReport:
    """Whether `source` offers, for every entry of `lock`, a wheel with a locked hash that installs on
    `target`. Reads only; raises WheelSourceError when the source itself is unusable. `http` sets timeouts
    and retries; the trusted host is always the source's."""
    http = replace(http or Http(), trusted_host=source.trusted_host)
    entries = list(lock.entries)
    report = SourceReport(lock.where, source.describe(), target.describe(), len(entries),
                          problems=missing_problems(lock))
    if source.type == "wheelhouse":
        pages = wheelhouse_pages(source.wheelhouse or "", entries, jobs)
        found = [pages[entry.key] for entry in entries]
    else:
        index_url = source.index_url or PUBLIC_INDEX
        http.check_url(index_url)
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            found = list(pool.map(lambda entry: fetch_page(http, index_url, entry.name), entries))
    for entry, page in zip(entries, found):
        selected, problem = select_file(entry, page, target, source.type == "wheelhouse")
        if problem:
            report.problems.append(problem)
        if selected:
            report.selected.append(selected)
    return report


# --- inputs ------------------------------------------------------------------------------------------

def load_lock(path: str) -> Lock:
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise WheelSourceError(f"cannot read the lock {path} on {socket.gethostname()}: {error.strerror}; "
                               "give the path of a lock written by bin/revive lock (data/locks/...)") from None
    try:
        return parse_lock(text, path)
    except LockError as error:
        raise WheelSourceError(str(error)) from None


# The options pip_source_check and wheel_cache share: which lock, read from which source, for which node.
# The numeric options of lock_source_argument_spec (module_utils/revive_bounds.py; docs/inputs.md).
LOCK_SOURCE_BOUNDS = {
    "timeout": Bound(float, 0, high=3600, low_open=True, why="seconds per request"),
    "retries": Bound(int, 0, high=100, why="further attempts"),
    "jobs": Bound(int, 1, high=64, why="requests at once"),
}


def lock_source_argument_spec() -> dict:
    return {
        "lock": {"type": "path", "required": True},
        "source": {"type": "dict", "default": {}, "options": SOURCE_ARGUMENT_SPEC},
        "python": {"type": "str", "required": True},
        "platform": {"type": "str", "required": True},
        "timeout": {"type": "float", "default": 60},
        "retries": {"type": "int", "default": 3},
        "jobs": {"type": "int", "default": 8},
    }


def prepare(lock_path: str, source_params: Optional[dict], python: str, platform: str) -> Tuple[Lock, Source, Target]:
    """The lock, the source and the target from module parameters; WheelSourceError says which one is wrong."""
    try:
        source = source_from_params(source_params)
        target = make_target(python, platform)
    except (VenvError, TargetError) as error:
        raise WheelSourceError(str(error)) from None
    return load_lock(lock_path), source, target
