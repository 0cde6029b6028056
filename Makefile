# The two commands: `make ablate` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# torch/torchvision are pinned to the releases this project is developed and tested with.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1

.PHONY: ablate test venv clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_PINS)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

ablate: venv
	$(VENV)/bin/trainfast ablate $(ARGS)

test: venv
	$(PY) -m pytest $(ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
