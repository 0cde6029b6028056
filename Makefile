# The commands: `make ablate`, `make test` (the fast suite) and `make test-all` (every test, the slow
# end-to-end ones included: what CI runs); on a GPU machine `make test-cuda` (the CUDA tests and the selfcheck).
# Each creates .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# torch/torchvision are pinned to the releases this project is developed and tested with.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1

.PHONY: ablate test test-all test-cuda venv clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_PINS)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

ablate: venv
	$(VENV)/bin/trainfast ablate $(ARGS)

# The fast suite: behaviour and correctness, a few minutes on 2 cores, on one pytest-xdist worker a core (up to 4;
# tests/conftest.py gives each worker its share of the threads). Tests marked `slow` (several processes, several
# epochs, ablations and tune end to end) run in test-all after it, on the same workers (a run several of them read
# is made once for all: tests/conftest.py's made_once). Those also marked `alone` read their own timings or the load
# on the cores (speed verdicts, a named hog or straggler, a timing budget met): a test beside them would disturb what
# they assert, so they run last, one at a time. Every behaviour keeps a fast test.
# pytest exits 5 when it selects no test (ARGS="-k ..." naming tests of one part): a failure only if all parts did.
WORKERS := -n auto --maxprocesses 4

test: venv
	$(PY) -m pytest -m "not slow" $(WORKERS) $(ARGS)

test-all: venv
	$(PY) -m pytest -m "not slow" $(WORKERS) $(ARGS); fast=$$?; \
	$(PY) -m pytest -m "slow and not alone" $(WORKERS) $(ARGS); slow=$$?; \
	$(PY) -m pytest -m "slow and alone" $(ARGS); alone=$$?; \
	if [ $$fast -eq 5 ] && [ $$slow -eq 5 ] && [ $$alone -eq 5 ]; then exit 5; fi; \
	for rc in $$fast $$slow $$alone; do if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; done

# The test suites above run on the CPU on every machine (tests/conftest.py hides the GPU: their exact answers are
# the CPU's). This one runs the tests marked `cuda` with the GPU visible, then every selfcheck check.
test-cuda: venv
	TRAINFAST_TEST_CUDA=1 $(PY) -m pytest -m cuda $(ARGS)
	$(VENV)/bin/trainfast selfcheck

clean:
	rm -rf $(VENV) runs .pytest_cache
