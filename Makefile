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

# The fast suite: behaviour and correctness, a few minutes on 2 cores. Tests marked `slow` (several
# processes, several epochs, ablations and tune end to end) run in test-all; every behaviour keeps a fast test.
test: venv
	$(PY) -m pytest -m "not slow" $(ARGS)

test-all: venv
	$(PY) -m pytest $(ARGS)

# The test suites above run on the CPU on every machine (tests/conftest.py hides the GPU: their exact answers are
# the CPU's). This one runs the tests marked `cuda` with the GPU visible, then every selfcheck check.
test-cuda: venv
	TRAINFAST_TEST_CUDA=1 $(PY) -m pytest -m cuda $(ARGS)
	$(VENV)/bin/trainfast selfcheck

clean:
	rm -rf $(VENV) runs .pytest_cache
