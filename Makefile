# The two commands: `make serve` and `make test`. Each sets itself up on a fresh machine.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
MODEL_DIR ?= models/tiny
UV := $(VENV)/bin/uv
# Python keeps the bytecode it compiles (in __pycache__, git-ignored) even where the environment
# says not to: without it every process compiles its imports again (torch, ray: 8.7 s of CPU for a
# decode replica's imports, 3.6 s with it), and the tests start dozens of replicas and interpreters.
unexport PYTHONDONTWRITEBYTECODE
# torch comes first and pinned: on this machine 2.13.0 is the CPU build on local disk (WHEELS), while
# an unpinned torch would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
WHEELS ?= /opt/wheels
# uv installs what pip would, in a tenth of the time (25 s against 3 min here); it reads no pip
# config, so the local wheels are named to it.
UV_INSTALL = UV_LINK_MODE=copy $(UV) pip install -q --python $(PY) $(if $(wildcard $(WHEELS)),--find-links $(WHEELS))

.PHONY: setup test test-fast test-deps lint serve demo model clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv
	$(UV_INSTALL) "$(TORCH_SPEC)"
	$(UV_INSTALL) -e '.[dev]'
	$(VENV)/bin/pdserve build-kernels
	touch $@

setup: $(VENV)/.installed

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The metrics tests run a real Prometheus (Debian package `prometheus`): installed here when it is
# missing and we are root on Debian; elsewhere those tests skip, naming the package.
test-deps:
	@command -v prometheus >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends prometheus >/dev/null; } || \
		echo "prometheus is not installed: the tests that need it will skip"

# Two pytest runs side by side: the tests that use Ray (one cluster, in order) and the rest, which
# run in the Ray tests' waits. The Ray run reports as it goes, the other when both are done.
# Ray starts its workers (the replicas) at niceness 15: beside the other run's busy process, at 0,
# they got a few percent of a core (a deployment took 211 s, not 41). Here they start at 0 too.
# OpenMP's threads sleep when they wait (OMP_WAIT_POLICY=PASSIVE) instead of spinning: with the
# two runs on two cores, a spinning thread takes the core its partner needs (a batch-1 decode loop
# beside a busy core: 3.6-4.7 s spinning, 1.2 s sleeping; alone, 0.8-1.0 s and 1.4-1.6 s).
test: export OMP_WAIT_POLICY = PASSIVE
test: lint test-deps
	@rest_log=$$(mktemp); \
	$(PY) -m pytest -q -m "not ray" --durations=12 tests > $$rest_log 2>&1 & rest=$$!; \
	RAY_worker_niceness=0 $(PY) -m pytest -q -m ray --durations=12 tests; ray_status=$$?; \
	wait $$rest; rest_status=$$?; \
	echo "--- the tests without Ray ---"; cat $$rest_log; rm -f $$rest_log; \
	[ $$ray_status = 0 ] && [ $$rest_status = 0 ]

# Unit tests without the slow ones: no Ray, for constant use.
test-fast: setup
	$(PY) -m pytest -q tests/unit -m "not slow"

model: setup
	$(VENV)/bin/pdserve make-model --preset tiny --out $(MODEL_DIR)

# Local Ray cluster, router + 1 prefill + 1 decode replica on the built-in tiny model; Ctrl-C stops it.
serve: model
	$(VENV)/bin/pdserve serve --model $(MODEL_DIR)

demo: model
	$(VENV)/bin/pdserve generate --model $(MODEL_DIR) --prompt "The cache holds" --max-tokens 24

clean:
	rm -rf $(VENV) models
