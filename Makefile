# One set-up path for the README, CI and the Dockerfile: scripts/setup.sh (idempotent).
PY := .venv/bin/python
DEMO_DIR ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)

.PHONY: setup demo test test-unit bench clean lock

setup:
	bash scripts/setup.sh

# The main job on its small built-in CPU default: 1 worker, resized to 2 at step 60 (gloo).
demo: setup
	.venv/bin/elastic-ring train --gpus 1 --resize-at 60 --to 2 --slots 2 --run-dir $(DEMO_DIR)

# The full test suite (unit + real horovodrun/mpirun/torchrun/Ray integration tests on the CPU) in two
# lanes at once: the integration tests on two pytest-xdist workers (they spend much of their time
# starting processes and waiting on them), and beside them the unit tests in one process at nice 10,
# which takes the cores the integration tests leave idle (scripts/run_tests.py; --one-lane: one
# pytest-xdist run for both). A short temporary folder of its own (kept when a test fails): Ray's
# socket paths under it must stay under 107 characters.
test: setup
	$(PY) scripts/run_tests.py

# The headline figures measured again (per-step speed, resize cost against Horovod Elastic, failure
# recovery, relaunch): alternating rounds, loads recorded; writes results/bench_headline.json and
# the generated docs/reports/headline.md (about 25 minutes on 2 cores). Nothing else should run.
bench: setup
	$(PY) scripts/bench_headline.py --rounds 3

test-unit: setup
	$(PY) -m pytest -q tests/unit

# Refresh constraints.txt (the versions setup.sh installs): a fresh venv resolved to the newest
# compatible releases, then its package list. Run `make test` before committing the new file.
lock:
	rm -rf .venv-lock && VENV=$(CURDIR)/.venv-lock SETUP_UNLOCKED=1 SETUP_BROWSER=0 bash scripts/setup.sh
	.venv-lock/bin/python scripts/lock.py > constraints.txt && rm -rf .venv-lock
	@echo "constraints.txt refreshed; run make test before committing it"

clean:
	rm -rf runs .pytest_cache
