"""A node's releases: the release its systemd units run, its record of current and previous, rollback.

A *release* is the unit of change on a node (docs/architecture.md): the vLLM venv, the model revision and the
planned argv/environment of every replica. The node keeps a record, by default
``/var/lib/revive/releases.json``::

    {"schema": 1,
     "current":  {release the systemd units point at and that passed its start},
     "previous": {the release before it},
     "last_failure": {a release that failed to start or warm up, why, and what was restored}}

Not to be confused with module_utils/revive_releases.py, the catalogue of vLLM releases (data/vllm-releases.yml)
the planner chooses from.

The units point at exactly one release: the vllm_service role renders them from a release dict built here
(`release.build_release`), so a rollback is the same template rendered from the recorded release. Everything in
this package is pure and unit-tested (tests/unit/test_release*.py). Layout, one idea per file:

- release.py: the release the units should run, built from the planner's release and the venv.
- systemd.py: ExecStart=/Environment= quoting, the start deadline and StartLimitIntervalSec=.
- pinning.py: CPU lists and the plan's CPU/NUMA pinning on this host.
- record.py: the record - load, promote, which release a rollback restores, what it records.
- venvs.py: the release venv's exact pins and name, and which old venvs to remove.
- journal.py: the journal excerpt of a failed start that a rollback quotes.

Used by library/vllm_release.py, vllm_release_info.py, vllm_venv_spec.py and vllm_journal_info.py (thin wiring).
"""
from __future__ import annotations


class ReleaseError(Exception):
    """A release or the record cannot be used; the message says what, where and how to fix it."""
