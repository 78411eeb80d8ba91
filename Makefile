# revive: make demo (the main job against the lab) and make test (unit tests, lint, Molecule).
# Both build .venv themselves from requirements.txt with a Python >= 3.12 found by bin/find-python; pip installs
# only the pinned uv, which installs the rest (45 s -> 5 s on a fresh machine, the same versions).
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
STAMP := $(VENV)/.stamp
ACT := source $(VENV)/bin/activate &&

.PHONY: help venv fakenvml unit lint molecule monitoring-check test demo bench bench-guidellm guidellm-venv check-runtime check-locks \
	lab-up lab-down clean

help:
	@echo "make demo   bring the lab up and run site.yml against it"
	@echo "make test   unit tests, ansible-lint, Molecule scenarios on the lab"
	@echo "make bench  long benchmarks (prints numbers; one brings up a lab and syncs a 40 GB sparse model)"
	@echo "make bench-guidellm  GuideLLM against revive bench on one twin (part of make bench; ~5.6 GB venv)"
	@echo "make check-runtime  install the locked vLLM releases into fresh venvs (~7.6 GB per Python) and run them"
	@echo "make check-locks  regenerate every data/locks/ lock against PyPI into a temp dir and diff it (network)"

$(STAMP): requirements.txt bin/find-python
	@py=$$(bin/find-python) || exit 1; \
	  if [ ! -x $(VENV)/bin/python ] || ! $(VENV)/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then \
	    rm -rf $(VENV) && $$py -m venv $(VENV); fi
	$(VENV)/bin/pip install --quiet --disable-pip-version-check "$$(grep '^uv==' requirements.txt)"
	$(VENV)/bin/uv --no-config pip install --python $(VENV)/bin/python --quiet -r requirements.txt
	@touch $@

venv: $(STAMP)

fakenvml:
	$(MAKE) -C lab/fakenvml

# The lab wheelhouse first: the unit tests install the locks a node installs from it (offline, as a node does).
# uv installs no bytecode and PYTHONDONTWRITEBYTECODE may forbid writing it, so each of the suite's hundreds of
# ansible-playbook/CLI processes compiled ansible from source: compiled once here (27% less time on the module tests).
# The project's controller-side Python too (the filter plugin and the module_utils it imports, in every Ansible
# worker process that calls a filter): a no-op site.yml on the lab, 31 -> 26 s of controller CPU (docs/performance.md).
BYTECODE := { python -m compileall -q -j 0 $(VENV)/lib module_utils filter_plugins > /dev/null || true; }
# Four workers on 2 cores: the suite's tests wait on the processes they start (ansible-playbook, twins, a lab node)
# for much of their time - two workers kept the cores 133% busy (524 s), four 163% (411 s; 2141 passed, 2026-12-06).
# Files longest first (tests/unit/conftest.py; xdist's own reorder by number of tests left the few long ones to the
# end, one worker running them alone): 449 -> 379 s back to back (2026-12-07). The field notes' bench, which times a
# twin, failed among them and goes last again; with it there, a clean-clone make test's unit phase took 392 s.
UNIT_PYTEST := python -m pytest -q -n 4 --dist loadfile --no-loadscope-reorder --durations=15 tests/unit
UNIT := $(BYTECODE) && $(UNIT_PYTEST)
unit: venv fakenvml
	@$(ACT) bin/lab wheelhouse
	$(ACT) $(UNIT)

lint: venv
	$(ACT) ansible-lint

# Every scenario, in streams side by side (bin/molecule-streams): the fleet then fleet_preflight, beside the others
# one after the other. Clean clone of 0393c68 (2 cores): fleet 2138 + model_sync 193 s | default 834 +
# fleet_preflight 169 + multinode 763 + frontdoor_ha 476 s, the streams 2331 and 2241 s; fleet_preflight and
# model_sync change places so that they end closer together (2307 and 2266 s by those numbers). The cores are ~88 %
# busy, mostly with Ansible's own per-task work on the controller and on the lab's hosts (docs/performance.md §3).
# Each scenario's output goes to .molecule-<scenario>.log; all of it is printed (and joined into .molecule.log) when
# the streams have ended, then bin/last-failure repeats each failed scenario's last failed task, where a CI log's
# tail shows it.
MOLECULE_STREAMS := fleet,fleet_preflight default,model_sync,multinode,frontdoor_ha

# The lab's wheelhouse is made once before the streams start: every scenario's create then finds it complete.
molecule: venv fakenvml
	$(ACT) bin/lab wheelhouse && $(BYTECODE)
	@$(ACT) bin/molecule-streams $(MOLECULE_STREAMS)

# promtool (Debian 12: apt-get install prometheus) checks and tests the alert and recording rules (monitoring/README.md).
monitoring-check:
	cd monitoring/rules && promtool check rules $$(ls *.yml | grep -v '_test\.yml$$') && promtool test rules *_test.yml

# The unit tests first, on both cores, with ansible-lint beside them at the lowest priority (nice 19): one process,
# about a CPU-minute, that takes the cycles the unit suite leaves (its four workers keep the cores ~80 % busy, and its
# last minute is one file on one worker) instead of 58 s at the end of a Molecule stream (docs/performance.md §3).
# Then Molecule's two streams. Tried and dropped (stop 32): the unit tests as a third stream beside the scenarios.
# On 2 cores that made the whole slower, not faster (all streams 3265 s vs unit 550 s + streams ~2300 s), and
# timing-sensitive unit tests failed under the contention. Any failing fails the target: the unit tests or lint
# before the streams start (lint's whole output is printed after the unit tests'); in the streams, the tail of the
# output repeats each failure (.molecule-tail.txt).
test: venv fakenvml monitoring-check
	@$(ACT) bin/lab wheelhouse
	@$(ACT) $(BYTECODE) && { nice -n 19 ansible-lint > .lint.log 2>&1 & lint=$$!; \
	  $(UNIT_PYTEST); unit=$$?; wait $$lint; lint=$$?; \
	  echo "--- ansible-lint, run beside the unit tests (exit $$lint):"; cat .lint.log; \
	  [ $$unit -eq 0 ] && [ $$lint -eq 0 ]; }
	@$(ACT) bin/molecule-streams $(MOLECULE_STREAMS)

demo: venv fakenvml
	$(ACT) bin/lab up
	$(ACT) bin/lab wheelhouse && bin/lab seed-model
	$(ACT) ansible-playbook -i inventory/lab site.yml

# GuideLLM, for the agreement benchmark only (bench/guidellm_agreement_test.py): its own venv from its hash lock,
# wheels only, nothing resolved here (~5.6 GB: GuideLLM depends on torch). Never installed on a node.
GUIDELLM_VENV := .venv-guidellm
GUIDELLM_LOCK := data/locks/guidellm-bench.txt

$(GUIDELLM_VENV)/.stamp: $(GUIDELLM_LOCK) $(STAMP)
	@py=$$(bin/find-python) || exit 1; rm -rf $(GUIDELLM_VENV) && $$py -m venv $(GUIDELLM_VENV)
	$(VENV)/bin/uv --no-config pip install --python $(GUIDELLM_VENV)/bin/python --require-hashes --no-deps \
	  --only-binary :all: --index-url https://pypi.org/simple -r $(GUIDELLM_LOCK)
	@echo "$(GUIDELLM_VENV): $$(grep -c '^[a-z0-9].*==' $(GUIDELLM_LOCK)) distributions of $(GUIDELLM_LOCK)," \
	  "$$(du -sh $(GUIDELLM_VENV) | cut -f1) on disk; $$($(GUIDELLM_VENV)/bin/guidellm --version)"
	@touch $@

guidellm-venv: $(GUIDELLM_VENV)/.stamp

bench-guidellm: venv fakenvml guidellm-venv
	$(ACT) python -m pytest -q -s bench/guidellm_agreement_test.py

bench: venv fakenvml guidellm-venv
	$(ACT) python -m pytest -q -s bench

# Not part of `make test`: downloads the real wheels (tools/README.md). CHECK_RUNTIME_ARGS="--fresh" rebuilds.
check-runtime: venv
	$(ACT) python tools/check_runtime.py $(CHECK_RUNTIME_ARGS)

# Not part of `make test`: talks to PyPI (a lock's inputs are its header and the index; tools/README.md).
check-locks: venv
	$(ACT) python tools/check_locks.py $(CHECK_LOCKS_ARGS)

lab-up: venv fakenvml
	$(ACT) bin/lab up

lab-down: venv
	$(ACT) bin/lab down

clean:
	-$(MAKE) -C lab/fakenvml clean
	rm -rf $(VENV) $(GUIDELLM_VENV)
