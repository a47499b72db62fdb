# Every target creates .venv on a fresh machine; nothing else needs installing by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test e2e bench bench-operator manifests kube lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,tracing]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m phoenix.demo

# Builds the local Kubernetes control plane (cached in .cache/kube) before the suite that needs it.
test: $(STAMP) kube
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

kube:
	bash hack/build-kube.sh

# The e2e suite on a real single-node cluster (Linux, root; docs/e2e.md): builds what it needs, tears all down.
e2e: $(STAMP)
	bash hack/e2e.sh

bench: $(STAMP)
	$(BIN)/python -m bench.worker_throughput

bench-operator: $(STAMP) kube
	$(BIN)/python -m bench.operator_scale

manifests: $(STAMP)
	$(BIN)/python -m phoenix.crds.generate

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
