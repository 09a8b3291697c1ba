# The two commands: `make serve` and `make test`. Each sets itself up on a fresh machine.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
MODEL_DIR ?= models/tiny
# torch comes first and pinned: on this machine 2.13.0 is the CPU build on local disk, while an unpinned
# torch would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup test lint serve demo model clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest -q tests

model: setup
	$(VENV)/bin/pdserve make-model --preset tiny --out $(MODEL_DIR)

# Local Ray cluster, router + 1 prefill + 1 decode replica on the built-in tiny model; Ctrl-C stops it.
serve: model
	$(VENV)/bin/pdserve serve --model $(MODEL_DIR)

demo: model
	$(VENV)/bin/pdserve generate --model $(MODEL_DIR) --prompt "The cache holds" --max-tokens 24

clean:
	rm -rf $(VENV) models
