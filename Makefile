# toolwitness — every command CI runs lives here. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help
help: ## List the targets with what they do
	@grep -E '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# the agent frameworks of the conformance suite whose pins agree with ours, into .venv
$(VENV)/.conformance: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[dev,conformance]'
	touch $@

.PHONY: install
install: $(VENV)/.installed ## Create .venv and install toolwitness with its dev tools

.PHONY: conformance-venvs
conformance-venvs: $(VENV)/.conformance ## Install the conformance frameworks: into .venv, and those whose pins clash with ours into .cache/venvs (cached)
	$(PY) -m tests.conformance.venvs

.PHONY: conformance
conformance: conformance-venvs ## Run the real agent frameworks and check toolwitness's verdicts against their tools (no services)
	$(VENV)/bin/pytest -m 'conformance and not integration' tests/conformance

.PHONY: compatibility
compatibility: conformance-venvs ## Regenerate docs/compatibility.md from the conformance runs (commit the result)
	$(PY) -m tests.conformance.matrix

.PHONY: proto
proto: install ## Regenerate collector/wire/gen from proto/ (pinned grpcio-tools)
	$(PY) scripts/gen_proto.py

.PHONY: lint
lint: install ## ruff + mypy --strict on scoring/ and collector/
	$(VENV)/bin/ruff check scoring collector tests scripts
	$(VENV)/bin/mypy scoring collector

.PHONY: services-up
services-up: install ## Start local Redis and Kafka (KRaft) on loopback; idempotent
	$(PY) scripts/services.py up

.PHONY: services-down
services-down: ## Stop exactly the local services we started (by recorded pid)
	$(PY) scripts/services.py down

.PHONY: services-status
services-status: ## Show the local services and their pids/ports
	$(PY) scripts/services.py status

.PHONY: unit
unit: install ## Unit tests only (no services needed)
	$(VENV)/bin/pytest -m 'not integration' tests/unit

.PHONY: test
test: install ## THE test command: lint, start services, all tests (conformance included), stop the services it started
	$(MAKE) lint
	$(MAKE) conformance-venvs
	set -o pipefail; was_up=0; $(PY) scripts/services.py status >/dev/null 2>&1 && was_up=1; \
	$(PY) scripts/services.py up || exit $$?; \
	rc=0; $(VENV)/bin/pytest tests || rc=$$?; \
	if [[ $$was_up == 0 ]]; then $(PY) scripts/services.py down; fi; exit $$rc

.PHONY: demo
demo: install ## THE demo: local Kafka + Redis, the service, a sample agent; prints each score
	$(PY) scripts/services.py up
	$(VENV)/bin/toolwitness demo

# --- deploy: Helm chart and OpenTelemetry Collector (deploy/, scripts/tools.sh) --------
# Pinned tools are built from their Go modules into .cache/tools (git-ignored, cached):
# helm ~3.5 min cold, the collector 5-10 min cold (2 cores), under a second warm.
HELM_BIN := .cache/tools/helm
CHART_DIR := deploy/helm/toolwitness
HELM_EXAMPLES := $(sort $(notdir $(patsubst %/values.yaml,%,$(wildcard deploy/helm/examples/*/values.yaml))))

.PHONY: helm
helm: ## Build the pinned helm into .cache/tools/helm (cached)
	bash scripts/tools.sh helm

.PHONY: helm-lint
helm-lint: helm ## helm lint --strict the chart with its defaults and with every example's values
	$(HELM_BIN) lint --strict $(CHART_DIR)
	set -e; for ex in $(HELM_EXAMPLES); do \
	  $(HELM_BIN) lint --strict $(CHART_DIR) -f deploy/helm/examples/$$ex/values.yaml --namespace toolwitness; \
	done

.PHONY: helm-render
helm-render: helm ## Re-render deploy/helm/examples/*/rendered.yaml (commit the result)
	set -e; for ex in $(HELM_EXAMPLES); do \
	  $(HELM_BIN) template toolwitness $(CHART_DIR) -f deploy/helm/examples/$$ex/values.yaml \
	    --namespace toolwitness > deploy/helm/examples/$$ex/rendered.yaml; \
	  echo "rendered deploy/helm/examples/$$ex/rendered.yaml"; \
	done

.PHONY: collector-build
collector-build: install ## Build the minimal OTel Collector (.cache/tools/otelcol-toolwitness; 4-9 min cold) and run its tests
	bash scripts/tools.sh collector
	$(VENV)/bin/pytest -m collector_build tests/unit/deploy

.PHONY: interop
interop: install ## OTel SDK -> minimal Collector -> Kafka -> toolwitness (builds the Collector if needed; starts services)
	bash scripts/tools.sh collector
	$(PY) scripts/services.py up
	set -o pipefail; rc=0; $(VENV)/bin/pytest -m collector_build tests/integration/test_collector_interop.py || rc=$$?; \
	  $(PY) scripts/services.py down; exit $$rc
